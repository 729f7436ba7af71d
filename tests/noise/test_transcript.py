"""Roster and survivor-set digests: order-free, injective, and checked."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noise.errors import KeyFormatError
from noise.keys import IdentityKey, sign_key_bundle
from noise.transcript import (
    roster_hash,
    sealed_leaf,
    sealed_root,
    sealed_set_message,
    sealed_tree,
    survivor_attestation_message,
    survivor_set_hash,
    upload_statement_message,
)
from tests.support.strategies import node_id_lists

CONFIG = b"\x11" * 32


@dataclass(frozen=True)
class Signed:
    node_id: str
    public_key: bytes
    signature: bytes


def bundles(ids: list[str]) -> list[Signed]:
    return [Signed(n, bytes([i + 1]) * 32, bytes([i + 101]) * 64) for i, n in enumerate(ids)]


def test_roster_hash_matches_its_definition() -> None:
    roster = bundles(["b", "a"])
    expected = hashlib.sha256(
        b"zerosum/v1/roster"
        + CONFIG
        + b"\x00\x02s1"
        + struct.pack(">I", 2)
        + b"\x00\x01a"
        + roster[1].public_key
        + roster[1].signature
        + b"\x00\x01b"
        + roster[0].public_key
        + roster[0].signature
    ).digest()
    assert roster_hash(CONFIG, "s1", roster) == expected


def test_roster_hash_accepts_real_key_bundles() -> None:
    identity = IdentityKey.generate()
    bundle = sign_key_bundle(
        identity, config_hash=CONFIG, session_id="s1", node_id="a", public_key=b"\x05" * 32
    )
    plain = Signed(bundle.node_id, bundle.public_key, bundle.signature)
    assert roster_hash(CONFIG, "s1", [bundle]) == roster_hash(CONFIG, "s1", [plain])


@settings(max_examples=30, deadline=None)
@given(node_id_lists(min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_roster_hash_ignores_order_but_not_content(ids: list[str], random: object) -> None:
    roster = bundles(ids)
    shuffled = list(roster)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    digest = roster_hash(CONFIG, "s1", roster)
    assert roster_hash(CONFIG, "s1", shuffled) == digest
    assert roster_hash(CONFIG, "s2", roster) != digest
    assert roster_hash(b"\x12" * 32, "s1", roster) != digest
    assert roster_hash(CONFIG, "s1", roster[1:]) != digest
    changed = [Signed(roster[0].node_id, b"\xee" * 32, roster[0].signature), *roster[1:]]
    assert roster_hash(CONFIG, "s1", changed) != digest


def test_roster_hash_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="lists node 'a' twice"):
        roster_hash(CONFIG, "s1", bundles(["a", "a"]))
    with pytest.raises(KeyFormatError, match="public key of node 'a'"):
        roster_hash(CONFIG, "s1", [Signed("a", b"short", b"\0" * 64)])
    with pytest.raises(KeyFormatError, match="signature of node 'a'"):
        roster_hash(CONFIG, "s1", [Signed("a", b"\0" * 32, b"\0" * 63)])
    with pytest.raises(KeyFormatError, match="config hash"):
        roster_hash(b"short", "s1", [])


def test_survivor_hash_matches_its_definition() -> None:
    expected = hashlib.sha256(
        b"zerosum/v1/survivors"
        + CONFIG
        + b"\x00\x02s1"
        + struct.pack(">Q", 3)
        + struct.pack(">I", 2)
        + b"\x00\x01a\x00\x01c"
        + struct.pack(">I", 1)
        + b"\x00\x01b"
    ).digest()
    assert survivor_set_hash(CONFIG, "s1", 3, ["c", "a"], ["b"]) == expected


def test_survivor_hash_separates_every_field() -> None:
    base = survivor_set_hash(CONFIG, "s1", 3, ["a", "c"], ["b"])
    others = {
        survivor_set_hash(CONFIG, "s1", 4, ["a", "c"], ["b"]),
        survivor_set_hash(CONFIG, "s2", 3, ["a", "c"], ["b"]),
        survivor_set_hash(b"\x12" * 32, "s1", 3, ["a", "c"], ["b"]),
        survivor_set_hash(CONFIG, "s1", 3, ["a"], ["b", "c"]),
        survivor_set_hash(CONFIG, "s1", 3, ["a", "b"], ["c"]),
        survivor_set_hash(CONFIG, "s1", 3, ["a", "c"], []),
        survivor_set_hash(CONFIG, "s1", 3, ["a", "c", "b"], []),
    }
    assert base not in others and len(others) == 7


@pytest.mark.parametrize(
    ("survivors", "dropped", "message"),
    [
        ([], ["a"], "survivor set is empty"),
        (["a", "a"], [], "repeats a node"),
        (["a"], ["b", "b"], "repeats a node"),
        (["a", "b"], ["b"], r"\['b'\] are listed both"),
    ],
)
def test_survivor_hash_refuses_inconsistent_sets(
    survivors: list[str], dropped: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        survivor_set_hash(CONFIG, "s1", 0, survivors, dropped)


def test_round_index_range() -> None:
    with pytest.raises(ValueError, match="round_index = -1"):
        survivor_set_hash(CONFIG, "s1", -1, ["a"], [])
    with pytest.raises(ValueError, match="round_index"):
        survivor_attestation_message(CONFIG, "s1", 2**64, b"\0" * 32)


def test_attestation_message_layout_and_signature() -> None:
    digest = survivor_set_hash(CONFIG, "s1", 2, ["a", "b"], ["c"])
    message = survivor_attestation_message(CONFIG, "s1", 2, digest)
    assert message == (
        b"zerosum/v1/survivor-attestation" + CONFIG + b"\x00\x02s1" + struct.pack(">Q", 2) + digest
    )
    identity = IdentityKey.generate()
    signature = identity.sign(message)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    Ed25519PublicKey.from_public_bytes(identity.public_bytes()).verify(signature, message)
    with pytest.raises(KeyFormatError, match="survivor hash"):
        survivor_attestation_message(CONFIG, "s1", 2, b"short")


ROSTER = b"\x22" * 32
PAYLOAD = b"\x33" * 32


def test_upload_statement_known_answer() -> None:
    message = upload_statement_message(
        CONFIG, "s1", 3, "scatter", roster_hash=ROSTER, payload_digest=PAYLOAD
    )
    assert message == (
        b"zerosum/v1/upload-statement"
        + CONFIG
        + b"\x00\x02s1"
        + struct.pack(">Q", 3)
        + b"\x00\x07scatter"
        + ROSTER
        + PAYLOAD
    )
    # Pinned, so a change to the encoding cannot pass unnoticed (nodes of two
    # versions would refuse each other's statements).
    assert (
        hashlib.sha256(message).hexdigest()
        == "681d8897b4f70a5a36ba04abbfbc4db671c86c2aed30e880d7158f38367527c6"
    )


def test_upload_statement_separates_every_field() -> None:
    base = upload_statement_message(
        CONFIG, "s1", 3, "scatter", roster_hash=ROSTER, payload_digest=PAYLOAD
    )
    others = {
        upload_statement_message(
            b"\x12" * 32, "s1", 3, "scatter", roster_hash=ROSTER, payload_digest=PAYLOAD
        ),
        upload_statement_message(
            CONFIG, "s2", 3, "scatter", roster_hash=ROSTER, payload_digest=PAYLOAD
        ),
        upload_statement_message(
            CONFIG, "s1", 4, "scatter", roster_hash=ROSTER, payload_digest=PAYLOAD
        ),
        upload_statement_message(
            CONFIG, "s1", 3, "moments", roster_hash=ROSTER, payload_digest=PAYLOAD
        ),
        upload_statement_message(
            CONFIG, "s1", 3, "scatter", roster_hash=PAYLOAD, payload_digest=PAYLOAD
        ),
        upload_statement_message(
            CONFIG, "s1", 3, "scatter", roster_hash=ROSTER, payload_digest=ROSTER
        ),
        # The label keeps it apart from a survivor attestation over the same fields.
        survivor_attestation_message(CONFIG, "s1", 3, ROSTER),
    }
    assert base not in others and len(others) == 7


def test_upload_statement_refuses_bad_fields() -> None:
    with pytest.raises(KeyFormatError, match="roster hash must be 32 bytes; got 31 bytes"):
        upload_statement_message(
            CONFIG, "s1", 0, "moments", roster_hash=ROSTER[:31], payload_digest=PAYLOAD
        )
    with pytest.raises(KeyFormatError, match="payload digest must be 32 bytes"):
        upload_statement_message(CONFIG, "s1", 0, "moments", roster_hash=ROSTER, payload_digest=b"")
    with pytest.raises(KeyFormatError, match="round name"):
        upload_statement_message(CONFIG, "s1", 0, "", roster_hash=ROSTER, payload_digest=PAYLOAD)
    with pytest.raises(ValueError, match="round_index = -1"):
        upload_statement_message(
            CONFIG, "s1", -1, "moments", roster_hash=ROSTER, payload_digest=PAYLOAD
        )


def _mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 §2.1's Merkle tree hash, written from the definition (the reference)."""
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:])).digest()


def test_sealed_leaf_and_set_message_layout_and_refusals() -> None:
    config = bytes(range(32))
    assert sealed_leaf("bb", b"xyz") == hashlib.sha256(b"\x00\x00\x02bb\x00\x03xyz").digest()
    with pytest.raises(ValueError, match="1 to 65535 bytes; got 0"):
        sealed_leaf("bb", b"")
    tree = sealed_tree({"c": b"uvw", "bb": b"xyz"})
    assert tree.recipients == ("bb", "c")
    assert tree.root == _mth([sealed_leaf("bb", b"xyz"), sealed_leaf("c", b"uvw")])
    message = sealed_set_message(
        config, "s1", 7, kind="tags", binding=bytes([5]) * 32, sender="a", count=2, root=tree.root
    )
    assert message == b"".join(
        (
            b"zerosum/v1/sealed-set",
            config,
            b"\x00\x02s1",
            struct.pack(">Q", 7),
            b"\x00\x04tags",
            bytes([5]) * 32,
            b"\x00\x01a",
            struct.pack(">I", 2),
            tree.root,
        )
    )
    fields = {"kind": "tags", "binding": bytes([5]) * 32, "sender": "a", "count": 2}
    for changed in (
        {"kind": "contribution"},
        {"binding": bytes(32)},
        {"sender": "z"},
        {"count": 3},
        {"root": sealed_tree({"bb": b"xyz", "c": b"uvx"}).root},
        {"root": sealed_tree({"bb": b"uvw", "c": b"xyz"}).root},
    ):
        other = sealed_set_message(
            config,
            "s1",
            7,
            **{**fields, "root": tree.root, **changed},  # type: ignore[arg-type]
        )
        assert other != message, changed
    with pytest.raises(ValueError, match="kind must be one of"):
        sealed_set_message(config, "s1", 0, **{**fields, "kind": "seed", "root": tree.root})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1 to 2\\^32 - 1 copies; got 0"):
        sealed_set_message(config, "s1", 0, **{**fields, "count": 0, "root": tree.root})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="root"):
        sealed_set_message(config, "s1", 0, **{**fields, "root": bytes(31)})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one recipient"):
        sealed_tree({})


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=70))
def test_every_copys_audit_path_leads_to_the_signed_root_and_nothing_else_does(n: int) -> None:
    copies = {f"n{i:02d}": bytes([i % 251 + 1]) * (1 + i % 5) for i in range(n)}
    tree = sealed_tree(copies)
    assert tree.root == _mth([sealed_leaf(r, copies[r]) for r in sorted(copies)])
    for recipient, sealed in copies.items():
        index, path = tree.proof(recipient)
        assert len(path) <= max(1, n - 1).bit_length()
        assert sealed_root(recipient, sealed, index=index, count=n, path=path) == tree.root
        # Another copy, recipient, place or path never leads to the root. (A path
        # does not fix the count, which is why the signed message holds it too.)
        wrong: list[tuple[str, bytes, int, int, tuple[bytes, ...]]] = [
            (recipient, sealed + b"!", index, n, path),
            (recipient + "x", sealed, index, n, path),
        ]
        if n > 1:
            wrong += [
                (recipient, sealed, (index + 1) % n, n, path),
                (recipient, sealed, index, n, path[:-1]),
                (recipient, sealed, index, n, (bytes(32), *path[1:])),
            ]
        wrong.append((recipient, sealed, index, n, (*path, bytes(32))))
        for r, m, i, c, p in wrong:
            try:
                root = sealed_root(r, m, index=i, count=c, path=p)
            except ValueError:
                continue
            assert root != tree.root, (r, i, c, len(p))
    with pytest.raises(KeyError):
        tree.proof("nobody")
    with pytest.raises(ValueError, match="leaf 3 is not in a tree of 3 leaves"):
        sealed_root("n00", b"x", index=3, count=3, path=())
