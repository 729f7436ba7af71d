"""Canonical digests of the session transcript that both ends recompute.

The coordinator relays what nodes said to one another (the roster of signed
ephemeral keys, the survivor set of a round with dropouts). It must not be
able to show different nodes different versions, so each node recomputes a
digest of what it was shown and binds it into what it signs or checks; any
disagreement is then visible. These are the byte-exact definitions, shared by
coordinator and node so the two can never drift apart.

Encoding, with lp(s) = u16 big-endian length ‖ UTF-8(s), u32/u64 big-endian
unsigned integers and ‖ concatenation:

* roster hash = SHA-256(b"zerosum/v1/roster" ‖ config_hash ‖ lp(session_id) ‖
  u32(n) ‖ for each bundle in node-id order: lp(node_id) ‖ public_key (32) ‖
  signature (64))
* survivor-set hash = SHA-256(b"zerosum/v1/survivors" ‖ config_hash ‖
  lp(session_id) ‖ u64(round_index) ‖ u32(|S|) ‖ lp(s) for s in sorted S ‖
  u32(|D|) ‖ lp(d) for d in sorted D), S the survivors, D the dropped nodes
* survivor attestation message = b"zerosum/v1/survivor-attestation" ‖
  config_hash ‖ lp(session_id) ‖ u64(round_index) ‖ survivor_hash; each survivor
  signs it with its Ed25519 identity key before answering an unmask request,
  the consistency check of Bonawitz et al. 2017 (ACM CCS, "Practical Secure
  Aggregation for Privacy-Preserving Machine Learning", round ConsistencyCheck).
* upload statement message = b"zerosum/v1/upload-statement" ‖ config_hash ‖
  lp(session_id) ‖ u64(round_index) ‖ lp(round_name) ‖ roster_hash ‖
  payload_digest; each node signs it with its Ed25519 identity key when it
  uploads. The coordinator hands every counted node's statement back with
  the aggregate, so each node can see that all contributors were shown the
  roster it verified (pairwise masks cancel only among nodes that derived
  their seeds from the same keys) and which payloads the aggregate covers.
  This is the roster analogue of the survivor consistency check above.
* sealed-set message = b"zerosum/v1/sealed-set" ‖ config_hash ‖
  lp(session_id) ‖ u64(round_index) ‖ lp(kind) ‖ binding (32) ‖ lp(sender) ‖
  u32(n) ‖ root (32); kind is "contribution" (the challenge contributions
  sealed in an upload header; binding = 32 zero bytes, the survivor set is not
  known yet) or "tags" (aggregate-check tags sealed with an attestation;
  binding = the survivor-set hash). root is the Merkle tree hash of RFC 6962
  (§2.1: interior nodes SHA-256(0x01 ‖ left ‖ right), the split at the
  largest power of two below the leaf count) over the n copies in recipient
  order, leaf = SHA-256(0x00 ‖ lp(recipient) ‖ u16(|sealed|) ‖ sealed). The
  sender signs it once over everything of that kind it sealed in the call, so
  a sealed message that does not open for its recipient is evidence against
  its sender, not the relay: the relay hands each recipient its copy's place
  in the tree and audit path (log2 n hashes), from which the recipient
  recomputes the root (RFC 9162 §2.1.3.2) and checks the one signature
  (docs/design.md §4.5).

Every field is length-delimited or of fixed width, so distinct inputs never
share an encoding; the leading labels separate the five uses.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from noise.keys import length_prefixed as _lp
from noise.keys import require_bytes
from noise.layout import DIGEST_BYTES

__all__ = [
    "SealedTree",
    "SignedKey",
    "roster_hash",
    "sealed_leaf",
    "sealed_root",
    "sealed_set_message",
    "sealed_tree",
    "survivor_attestation_message",
    "survivor_set_hash",
    "upload_statement_message",
]

_ROSTER_LABEL = b"zerosum/v1/roster"
_SURVIVORS_LABEL = b"zerosum/v1/survivors"
_ATTESTATION_LABEL = b"zerosum/v1/survivor-attestation"
_UPLOAD_STATEMENT_LABEL = b"zerosum/v1/upload-statement"
_SEALED_SET_LABEL = b"zerosum/v1/sealed-set"
SEALED_KINDS = ("contribution", "tags")


class SignedKey(Protocol):
    """Anything carrying a node's signed ephemeral key (a KeyBundle or its message)."""

    @property
    def node_id(self) -> str: ...

    @property
    def public_key(self) -> bytes: ...

    @property
    def signature(self) -> bytes: ...


def _round(round_index: int) -> bytes:
    if not 0 <= round_index < 2**64:
        raise ValueError(f"round_index = {round_index}: must be between 0 and 2^64 - 1.")
    return struct.pack(">Q", round_index)


def roster_hash(config_hash: bytes, session_id: str, bundles: Iterable[SignedKey]) -> bytes:
    """SHA-256 of the roster (every joined node's signed key), independent of order.

    Raises ValueError when two bundles claim the same node id, KeyFormatError
    when a key, signature or the config hash has the wrong length.
    """
    by_node: dict[str, SignedKey] = {}
    for bundle in bundles:
        if bundle.node_id in by_node:
            raise ValueError(f"roster lists node {bundle.node_id!r} twice.")
        by_node[bundle.node_id] = bundle
    digest = hashlib.sha256(_ROSTER_LABEL)
    digest.update(require_bytes(config_hash, 32, "config hash"))
    digest.update(_lp(session_id, "session id"))
    digest.update(struct.pack(">I", len(by_node)))
    for node_id in sorted(by_node):
        bundle = by_node[node_id]
        digest.update(_lp(node_id, "node id"))
        digest.update(require_bytes(bundle.public_key, 32, f"public key of node {node_id!r}"))
        digest.update(require_bytes(bundle.signature, 64, f"signature of node {node_id!r}"))
    return digest.digest()


def survivor_set_hash(
    config_hash: bytes,
    session_id: str,
    round_index: int,
    survivors: Collection[str],
    dropped: Collection[str],
) -> bytes:
    """SHA-256 naming exactly which nodes survived and which dropped in a round.

    Both sets are sorted first, so the order they are listed in does not
    matter. Raises ValueError when the survivor set is empty, a set repeats a
    node, or a node is listed as both survivor and dropped.
    """
    survivor_set, dropped_set = set(survivors), set(dropped)
    if not survivor_set:
        raise ValueError("survivor set is empty: a round needs at least one survivor.")
    if len(survivor_set) != len(survivors):
        raise ValueError(f"survivor list {sorted(survivors)} repeats a node.")
    if len(dropped_set) != len(dropped):
        raise ValueError(f"dropped list {sorted(dropped)} repeats a node.")
    both = survivor_set & dropped_set
    if both:
        raise ValueError(f"nodes {sorted(both)} are listed both as survivors and as dropped.")
    digest = hashlib.sha256(_SURVIVORS_LABEL)
    digest.update(require_bytes(config_hash, 32, "config hash"))
    digest.update(_lp(session_id, "session id"))
    digest.update(_round(round_index))
    for group in (sorted(survivor_set), sorted(dropped_set)):
        digest.update(struct.pack(">I", len(group)))
        for node_id in group:
            digest.update(_lp(node_id, "node id"))
    return digest.digest()


def survivor_attestation_message(
    config_hash: bytes, session_id: str, round_index: int, survivor_hash: bytes
) -> bytes:
    """The bytes a survivor signs to attest the survivor set it was shown."""
    return b"".join(
        (
            _ATTESTATION_LABEL,
            require_bytes(config_hash, 32, "config hash"),
            _lp(session_id, "session id"),
            _round(round_index),
            require_bytes(survivor_hash, 32, "survivor hash"),
        )
    )


def upload_statement_message(
    config_hash: bytes,
    session_id: str,
    round_index: int,
    round_name: str,
    *,
    roster_hash: bytes,
    payload_digest: bytes,
) -> bytes:
    """The bytes a node signs when it uploads: which roster it saw, which payload it sent.

    The two digests are keyword-only so that they cannot be swapped unnoticed.

    Raises KeyFormatError (a ValueError) when a digest is not 32 bytes or the
    session id or round name is empty or too long, ValueError when the round
    index is out of range.
    """
    return b"".join(
        (
            _UPLOAD_STATEMENT_LABEL,
            require_bytes(config_hash, 32, "config hash"),
            _lp(session_id, "session id"),
            _round(round_index),
            _lp(round_name, "round name"),
            require_bytes(roster_hash, 32, "roster hash"),
            require_bytes(payload_digest, DIGEST_BYTES, "payload digest"),
        )
    )


def sealed_leaf(recipient: str, sealed: bytes) -> bytes:
    """The leaf hash of one sealed copy in its sender's tree (1 to 65535 bytes sealed)."""
    if not 0 < len(sealed) < 2**16:
        raise ValueError(f"a sealed message has 1 to 65535 bytes; got {len(sealed)}")
    return hashlib.sha256(
        b"\x00" + _lp(recipient, "recipient") + struct.pack(">H", len(sealed)) + sealed
    ).digest()


def _interior(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _tree(leaves: Sequence[bytes]) -> tuple[bytes, list[list[bytes]]]:
    """RFC 6962's Merkle tree hash of ``leaves`` and every leaf's audit path (leaf upward)."""
    if len(leaves) == 1:
        return leaves[0], [[]]
    split = 1 << ((len(leaves) - 1).bit_length() - 1)  # the largest power of two below n
    left, left_paths = _tree(leaves[:split])
    right, right_paths = _tree(leaves[split:])
    paths = [[*p, right] for p in left_paths] + [[*p, left] for p in right_paths]
    return _interior(left, right), paths


@dataclass(frozen=True)
class SealedTree:
    """A sender's copies of one kind as the Merkle tree its one signature covers.

    ``recipients`` in sorted order (leaf i is recipient i's copy), ``root``
    the tree hash and ``paths`` every leaf's audit path, leaf level first.
    """

    recipients: tuple[str, ...]
    root: bytes
    paths: tuple[tuple[bytes, ...], ...]

    @property
    def count(self) -> int:
        return len(self.recipients)

    def proof(self, recipient: str) -> tuple[int, tuple[bytes, ...]]:
        """(leaf index, audit path) of ``recipient``'s copy; KeyError if it has none."""
        try:
            index = self.recipients.index(recipient)
        except ValueError:
            raise KeyError(recipient) from None
        return index, self.paths[index]


def sealed_tree(copies: Mapping[str, bytes]) -> SealedTree:
    """The tree over ``copies`` (recipient -> sealed copy); ValueError if none or one empty."""
    if not copies:
        raise ValueError("a sealed set names at least one recipient; got none")
    recipients = tuple(sorted(copies))
    root, paths = _tree([sealed_leaf(r, copies[r]) for r in recipients])
    return SealedTree(recipients, root, tuple(tuple(p) for p in paths))


def sealed_root(
    recipient: str, sealed: bytes, *, index: int, count: int, path: Sequence[bytes]
) -> bytes:
    """The root that ``path`` leads to from ``recipient``'s copy at leaf ``index`` of ``count``.

    RFC 9162's inclusion-proof check (§2.1.3.2), returning the root instead of
    comparing it. Raises ValueError when the index, count or path cannot be
    a proof in a tree of that size.
    """
    if not 0 <= index < count:
        raise ValueError(f"leaf {index} is not in a tree of {count} leaves")
    fn, sn = index, count - 1
    node = sealed_leaf(recipient, sealed)
    for sibling in path:
        require_bytes(sibling, 32, "audit path entry")
        if sn == 0:
            raise ValueError(f"an audit path of {len(path)} hashes is too long for {count} leaves")
        if fn & 1 or fn == sn:
            node = _interior(sibling, node)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            node = _interior(node, sibling)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ValueError(f"an audit path of {len(path)} hashes is too short for {count} leaves")
    return node


def sealed_set_message(
    config_hash: bytes,
    session_id: str,
    round_index: int,
    *,
    kind: str,
    binding: bytes,
    sender: str,
    count: int,
    root: bytes,
) -> bytes:
    """The bytes a node signs over the aggregate-check messages it sealed in one call.

    ``count`` copies, whose :func:`sealed_tree` has ``root``. ``kind`` is
    "contribution" (``binding`` 32 zero bytes) or "tags" (``binding`` the
    survivor-set hash the tags were made for).

    Raises ValueError for another kind, no copy, or a root or binding that is
    not 32 bytes.
    """
    if kind not in SEALED_KINDS:
        raise ValueError(f"kind must be one of {SEALED_KINDS}; got {kind!r}")
    if not 0 < count < 2**32:
        raise ValueError(f"a sealed set has 1 to 2^32 - 1 copies; got {count}")
    return b"".join(
        (
            _SEALED_SET_LABEL,
            require_bytes(config_hash, 32, "config hash"),
            _lp(session_id, "session id"),
            _round(round_index),
            _lp(kind, "kind"),
            require_bytes(binding, 32, "binding"),
            _lp(sender, "sender"),
            struct.pack(">I", count),
            require_bytes(root, 32, "root"),
        )
    )
