"""Identity keys, ephemeral keys and signed key bundles."""

from __future__ import annotations

import dataclasses
import hashlib
import stat
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings

from noise.errors import KeyFormatError, SignatureError
from noise.keys import (
    BUNDLE_LABEL,
    EphemeralKey,
    IdentityKey,
    KeyBundle,
    key_fingerprint,
    length_prefixed,
    sign_key_bundle,
    verify_key_bundle,
)
from tests.support.strategies import key_bytes, node_ids

CONFIG = hashlib.sha256(b"federation A").digest()
OTHER_CONFIG = hashlib.sha256(b"federation B").digest()


@pytest.fixture(scope="module")
def identity() -> IdentityKey:
    return IdentityKey.from_private_bytes(bytes(range(32)))


@pytest.fixture(scope="module")
def ephemeral() -> EphemeralKey:
    return EphemeralKey.from_private_bytes(bytes(range(32, 64)))


@pytest.fixture(scope="module")
def bundle(identity: IdentityKey, ephemeral: EphemeralKey) -> KeyBundle:
    return sign_key_bundle(
        identity,
        config_hash=CONFIG,
        session_id="session-1",
        node_id="b",
        public_key=ephemeral.public_bytes(),
    )


# --- length prefix -------------------------------------------------------------------


def test_length_prefix_is_u16_big_endian_then_utf8() -> None:
    assert length_prefixed("ab", "x") == b"\x00\x02ab"
    assert length_prefixed("é", "x") == b"\x00\x02\xc3\xa9"


def test_length_prefix_makes_concatenation_injective() -> None:
    left = length_prefixed("ab", "x") + length_prefixed("c", "x")
    right = length_prefixed("a", "x") + length_prefixed("bc", "x")
    assert left != right


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "must be a non-empty string of at most 65535 UTF-8 bytes; got ''."),
        ("x" * 65536, "must be a non-empty string of at most 65535 UTF-8 bytes"),
        ("\udc80", "must be encodable as UTF-8"),
        (7, "must be a string; got a int."),
    ],
)
def test_length_prefix_rejects_bad_identifiers(text: object, fragment: str) -> None:
    with pytest.raises(KeyFormatError, match=r"^node id ") as info:
        length_prefixed(text, "node id")  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_length_prefix_accepts_the_longest_identifier() -> None:
    assert length_prefixed("x" * 65535, "x")[:2] == b"\xff\xff"


# --- identity keys -------------------------------------------------------------------


def test_identity_signature_verifies_with_cryptography(identity: IdentityKey) -> None:
    signature = identity.sign(b"message")
    assert len(signature) == 64
    assert len(identity.public_bytes()) == 32
    Ed25519PublicKey.from_public_bytes(identity.public_bytes()).verify(signature, b"message")


def test_identity_from_private_bytes_is_deterministic(identity: IdentityKey) -> None:
    again = IdentityKey.from_private_bytes(bytes(range(32)))
    assert again.public_bytes() == identity.public_bytes()
    # Ed25519 signatures are deterministic (RFC 8032), so the same key signs identically.
    assert again.sign(b"m") == identity.sign(b"m")


def test_generated_identities_differ() -> None:
    assert IdentityKey.generate().public_bytes() != IdentityKey.generate().public_bytes()


def test_identity_rejects_wrong_length_private_key() -> None:
    with pytest.raises(KeyFormatError) as info:
        IdentityKey.from_private_bytes(bytes(31))
    assert str(info.value) == "Ed25519 private key must be 32 bytes; got 31 bytes."
    assert (info.value.expected, info.value.got) == ("32 bytes", "31 bytes")


def test_identity_rejects_non_bytes_private_key() -> None:
    with pytest.raises(KeyFormatError, match="must be 32 bytes; got a str"):
        IdentityKey.from_private_bytes("0" * 32)  # type: ignore[arg-type]


def test_identity_pem_round_trip(identity: IdentityKey) -> None:
    pem = identity.to_pem()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert IdentityKey.from_pem(pem).public_bytes() == identity.public_bytes()


def test_identity_pem_rejects_garbage() -> None:
    with pytest.raises(KeyFormatError, match="identity key PEM must be an unencrypted PKCS#8"):
        IdentityKey.from_pem(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")


def test_identity_pem_rejects_encrypted_key(identity: IdentityKey) -> None:
    encrypted = identity._private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    with pytest.raises(KeyFormatError, match="identity key PEM"):
        IdentityKey.from_pem(encrypted)


def test_identity_pem_rejects_other_key_types() -> None:
    x25519_pem = X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(KeyFormatError, match="must be an Ed25519 private key; got a"):
        IdentityKey.from_pem(x25519_pem)


def test_identity_pem_file_is_private(identity: IdentityKey, tmp_path: Path) -> None:
    path = tmp_path / "identity.pem"
    path.write_bytes(b"old contents")
    path.chmod(0o644)
    identity.write_pem(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert IdentityKey.read_pem(path).public_bytes() == identity.public_bytes()
    fresh = tmp_path / "fresh.pem"
    identity.write_pem(fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_repr_shows_fingerprint_not_private_key(
    identity: IdentityKey, ephemeral: EphemeralKey
) -> None:
    assert repr(identity) == f"IdentityKey(public={key_fingerprint(identity.public_bytes())})"
    assert bytes(range(32)).hex() not in repr(identity)
    assert ephemeral.private_bytes().hex() not in repr(ephemeral)
    assert repr(ephemeral).startswith("EphemeralKey(public=")


# --- ephemeral keys ------------------------------------------------------------------


@settings(max_examples=25)
@given(key_bytes(), key_bytes())
def test_exchange_is_symmetric(raw_a: bytes, raw_b: bytes) -> None:
    a = EphemeralKey.from_private_bytes(raw_a)
    b = EphemeralKey.from_private_bytes(raw_b)
    shared = a.exchange(b.public_bytes())
    assert len(shared) == 32
    assert shared == b.exchange(a.public_bytes())


def test_ephemeral_private_bytes_round_trip() -> None:
    key = EphemeralKey.generate()
    again = EphemeralKey.from_private_bytes(key.private_bytes())
    assert again.public_bytes() == key.public_bytes()
    assert EphemeralKey.generate().public_bytes() != key.public_bytes()


def test_exchange_rejects_wrong_length(ephemeral: EphemeralKey) -> None:
    with pytest.raises(KeyFormatError) as info:
        ephemeral.exchange(bytes(31))
    assert str(info.value) == "X25519 public key must be 32 bytes; got 31 bytes."


def test_ephemeral_rejects_wrong_length_private_key() -> None:
    with pytest.raises(KeyFormatError, match="X25519 private key must be 32 bytes; got 33 bytes"):
        EphemeralKey.from_private_bytes(bytes(33))


@pytest.mark.parametrize(
    "low_order_point",
    [
        bytes(32),  # the point 0
        b"\x01" + bytes(31),  # the point 1
        # A point of order 8 (RFC 7748 §6.1 and the libsodium blocklist).
        bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    ],
)
def test_exchange_rejects_low_order_points(ephemeral: EphemeralKey, low_order_point: bytes) -> None:
    with pytest.raises(KeyFormatError, match="shared secret would be all zero"):
        ephemeral.exchange(low_order_point)


# --- key bundles ---------------------------------------------------------------------


def test_signed_message_is_the_documented_encoding(bundle: KeyBundle) -> None:
    expected = (
        b"zerosum/v1/key-bundle"
        + CONFIG
        + struct.pack(">H", 9)
        + b"session-1"
        + struct.pack(">H", 1)
        + b"b"
        + bundle.public_key
    )
    assert BUNDLE_LABEL == b"zerosum/v1/key-bundle"
    assert bundle.signed_message() == expected


def test_bundle_verifies(bundle: KeyBundle, identity: IdentityKey) -> None:
    verify_key_bundle(
        bundle, identity.public_bytes(), config_hash=CONFIG, session_id="session-1", node_id="b"
    )
    verify_key_bundle(bundle, identity.public_bytes(), config_hash=CONFIG, session_id="session-1")


def test_bundle_signature_is_independent_ed25519(bundle: KeyBundle, identity: IdentityKey) -> None:
    Ed25519PublicKey.from_public_bytes(identity.public_bytes()).verify(
        bundle.signature, bundle.signed_message()
    )


@settings(max_examples=20)
@given(node_ids(), node_ids(), key_bytes())
def test_bundles_verify_for_any_ids(session: str, node: str, raw: bytes) -> None:
    identity = IdentityKey.from_private_bytes(raw)
    public = EphemeralKey.from_private_bytes(raw).public_bytes()
    signed = sign_key_bundle(
        identity, config_hash=CONFIG, session_id=session, node_id=node, public_key=public
    )
    verify_key_bundle(
        signed, identity.public_bytes(), config_hash=CONFIG, session_id=session, node_id=node
    )


def _rejected(
    bundle: KeyBundle,
    identity: IdentityKey,
    match: str,
    *,
    config_hash: bytes = CONFIG,
    session_id: str = "session-1",
    node_id: str | None = None,
) -> SignatureError:
    """What ``verify_key_bundle`` raises for ``bundle`` in that context (matching ``match``)."""
    with pytest.raises(SignatureError, match=match) as info:
        verify_key_bundle(
            bundle,
            identity.public_bytes(),
            config_hash=config_hash,
            session_id=session_id,
            node_id=node_id,
        )
    return info.value


def test_bundle_from_another_federation_is_rejected(
    bundle: KeyBundle, identity: IdentityKey
) -> None:
    error = _rejected(bundle, identity, "signed for another federation", config_hash=OTHER_CONFIG)
    assert error.node_id == "b"
    assert str(error).startswith("key bundle of node 'b' rejected: ")


def test_bundle_replayed_from_another_session_is_rejected(
    bundle: KeyBundle, identity: IdentityKey
) -> None:
    error = _rejected(bundle, identity, "replayed from another session", session_id="session-2")
    assert "'session-1'" in error.reason
    assert "'session-2'" in error.reason


def test_bundle_claiming_another_node_is_rejected(bundle: KeyBundle, identity: IdentityKey) -> None:
    error = _rejected(bundle, identity, "claims a different node id, 'b'", node_id="c")
    assert error.node_id == "c"


def test_bundle_under_another_identity_is_rejected(bundle: KeyBundle) -> None:
    impostor = IdentityKey.from_private_bytes(bytes(32))
    with pytest.raises(SignatureError, match="signature does not verify against the pinned"):
        verify_key_bundle(
            bundle, impostor.public_bytes(), config_hash=CONFIG, session_id="session-1"
        )


def test_tampered_bundle_is_rejected(bundle: KeyBundle, identity: IdentityKey) -> None:
    other_key = EphemeralKey.from_private_bytes(bytes(32)).public_bytes()
    swapped = dataclasses.replace(bundle, public_key=other_key)
    flipped = dataclasses.replace(
        bundle, signature=bytes([bundle.signature[0] ^ 1]) + bundle.signature[1:]
    )
    for forged in (swapped, flipped):
        with pytest.raises(SignatureError, match="does not verify"):
            verify_key_bundle(
                forged, identity.public_bytes(), config_hash=CONFIG, session_id="session-1"
            )


def test_bundle_names_the_node_on_wrong_lengths(bundle: KeyBundle) -> None:
    with pytest.raises(KeyFormatError) as info:
        dataclasses.replace(bundle, public_key=bundle.public_key[:31])
    assert str(info.value) == "X25519 public key of node 'b' must be 32 bytes; got 31 bytes."
    with pytest.raises(KeyFormatError, match="Ed25519 signature of node 'b' must be 64 bytes"):
        dataclasses.replace(bundle, signature=bundle.signature + b"\x00")
    with pytest.raises(KeyFormatError, match="config hash in the key bundle of node 'b'"):
        dataclasses.replace(bundle, config_hash=b"short")
    with pytest.raises(KeyFormatError, match=r"^node id must be a non-empty string"):
        dataclasses.replace(bundle, node_id="")
    with pytest.raises(KeyFormatError, match=r"^node id must be a string; got a bytes"):
        dataclasses.replace(bundle, node_id=b"b")  # type: ignore[arg-type]


def test_verify_rejects_wrong_length_inputs(bundle: KeyBundle, identity: IdentityKey) -> None:
    with pytest.raises(KeyFormatError) as info:
        verify_key_bundle(bundle, bytes(33), config_hash=CONFIG, session_id="session-1")
    assert str(info.value) == (
        "Ed25519 identity public key of node 'b' must be 32 bytes; got 33 bytes."
    )
    with pytest.raises(KeyFormatError, match="config hash must be 32 bytes; got 20 bytes"):
        verify_key_bundle(
            bundle, identity.public_bytes(), config_hash=bytes(20), session_id="session-1"
        )


def test_sign_rejects_wrong_length_inputs(identity: IdentityKey) -> None:
    with pytest.raises(KeyFormatError, match="X25519 public key of node 'a' must be 32 bytes"):
        sign_key_bundle(
            identity, config_hash=CONFIG, session_id="s", node_id="a", public_key=bytes(16)
        )
    with pytest.raises(KeyFormatError, match="config hash must be 32 bytes; got 0 bytes"):
        sign_key_bundle(
            identity, config_hash=b"", session_id="s", node_id="a", public_key=bytes(32)
        )
