"""Known-answer vectors for pairwise seeds and stream keys.

The expected values are recomputed here from first principles (cryptography's
X25519 and HKDF, and an RFC 5869 HKDF written out with the standard library's
HMAC) and also pinned as hex, so any change to the encoding of the
derivation (labels, field order, length prefixes, byte order) fails a test.
The private keys are Alice's and Bob's from RFC 7748 §6.1, whose shared secret
the RFC states.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from noise.keys import EphemeralKey
from noise.seeds import pairwise_seed, stream_key

# RFC 7748 §6.1.
ALICE_PRIVATE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
BOB_PRIVATE = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PUBLIC = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")

CONFIG = hashlib.sha256(b"zerosum test federation").digest()

SEED_ALPHA_BETA = "3eb4e63a5c077d174800091cf2976848bc6d6d9f91cd672bf25bd4c9f063322e"
SEED_UNICODE = "995ae95058706e3e789d72bdc1cd96cd89ace6f305413fe9338401a8a746d5b6"
STREAM_VECTORS = [
    (0, "sxx", "mask", "4a014909ce1fa6c33cdb1aad5884bc3c83e9b4d39afc69e82615be27cc661ca2"),
    (41, "coef", "mask", "c18be7bce3da00b889311bffbcb1633fa0a3f7bb5441ad733d3bb6092e05c5b3"),
    (
        2**64 - 1,
        "w",
        "cape-blind",
        "ae1e680d1794b7242dfeafa2e9628e0954bf49dba8bcd2b5b8760853eb6f143f",
    ),
]


def _lp(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack(">H", len(raw)) + raw


def _hkdf_stdlib(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 HKDF-SHA256 from hmac alone (Extract, then Expand)."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    return _hkdf_expand_stdlib(prk, info, length)


def _hkdf_expand_stdlib(prk: bytes, info: bytes, length: int) -> bytes:
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
        counter += 1
    return okm[:length]


def test_stdlib_hkdf_matches_rfc5869_case_1() -> None:
    okm = _hkdf_stdlib(bytes([0x0B] * 22), bytes(range(13)), bytes(range(0xF0, 0xFA)), 42)
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_rfc7748_shared_secret() -> None:
    alice = EphemeralKey.from_private_bytes(ALICE_PRIVATE)
    bob = EphemeralKey.from_private_bytes(BOB_PRIVATE)
    assert bob.public_bytes() == BOB_PUBLIC
    assert alice.exchange(BOB_PUBLIC) == SHARED
    assert bob.exchange(alice.public_bytes()) == SHARED


def _expected_seed(own_id: str, peer_id: str, session_id: str, config: bytes) -> bytes:
    shared = X25519PrivateKey.from_private_bytes(ALICE_PRIVATE).exchange(
        X25519PrivateKey.from_private_bytes(BOB_PRIVATE).public_key()
    )
    low, high = sorted((own_id, peer_id))
    info = b"zerosum/v1" + config + _lp(low) + _lp(high)
    seed = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=session_id.encode("utf-8"), info=info
    ).derive(shared)
    assert seed == _hkdf_stdlib(shared, session_id.encode("utf-8"), info, 32)
    return seed


@pytest.mark.parametrize(
    ("own_id", "peer_id", "session_id", "config", "pinned"),
    [
        ("tre-alpha", "tre-beta", "session-0001", CONFIG, SEED_ALPHA_BETA),
        # "node-e" < "node-é" by code point; non-ASCII ids and session ids are UTF-8.
        ("node-é", "node-e", "séance", bytes(32), SEED_UNICODE),
    ],
)
def test_pairwise_seed_vector(
    own_id: str, peer_id: str, session_id: str, config: bytes, pinned: str
) -> None:
    alice = EphemeralKey.from_private_bytes(ALICE_PRIVATE)
    bob = EphemeralKey.from_private_bytes(BOB_PRIVATE)
    seed = pairwise_seed(
        alice, BOB_PUBLIC, own_id=own_id, peer_id=peer_id, session_id=session_id, config_hash=config
    )
    assert seed == _expected_seed(own_id, peer_id, session_id, config)
    assert seed.hex() == pinned
    # The other end, with the ids swapped, lands on the same vector.
    assert (
        pairwise_seed(
            bob,
            alice.public_bytes(),
            own_id=peer_id,
            peer_id=own_id,
            session_id=session_id,
            config_hash=config,
        )
        == seed
    )


@pytest.mark.parametrize(("round_index", "tensor", "purpose", "pinned"), STREAM_VECTORS)
def test_stream_key_vector(round_index: int, tensor: str, purpose: str, pinned: str) -> None:
    seed = bytes.fromhex(SEED_ALPHA_BETA)
    info = b"zerosum/v1/stream" + _lp(purpose) + struct.pack(">Q", round_index) + _lp(tensor)
    expected = HKDFExpand(algorithm=hashes.SHA256(), length=32, info=info).derive(seed)
    assert expected == _hkdf_expand_stdlib(seed, info, 32)
    key = stream_key(seed, round_index=round_index, tensor=tensor, purpose=purpose)
    assert key == expected
    assert key.hex() == pinned
