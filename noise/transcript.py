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
  payload_sha256; each node signs it with its Ed25519 identity key when it
  uploads. The coordinator hands every counted node's statement back with
  the aggregate, so each node can see that all contributors were shown the
  roster it verified (pairwise masks cancel only among nodes that derived
  their seeds from the same keys) and which payloads the aggregate covers.
  This is the roster analogue of the survivor consistency check above.
* sealed-set message = b"zerosum/v1/sealed-set" ‖ config_hash ‖
  lp(session_id) ‖ u64(round_index) ‖ lp(kind) ‖ binding (32) ‖ lp(sender) ‖
  u32(n) ‖ for each recipient in sorted order: lp(recipient) ‖
  SHA-256(sealed); kind is "contribution" (the challenge contributions sealed
  in an upload header; binding = 32 zero bytes, the survivor set is not known
  yet) or "tags" (aggregate-check tags sealed with an attestation; binding =
  the survivor-set hash). The sender signs it once over everything of that
  kind it sealed in the call, one copy per recipient, so a sealed message that
  does not open for its recipient is evidence against its sender, not the
  relay: the recipient checks the one signature with its own copy and the
  digests of the others (docs/design.md §4.5).

Every field is length-delimited or of fixed width, so distinct inputs never
share an encoding; the leading labels separate the five uses.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from noise.keys import length_prefixed as _lp
from noise.keys import require_bytes

__all__ = [
    "SignedKey",
    "roster_hash",
    "sealed_digest",
    "sealed_set_message",
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
    payload_sha256: bytes,
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
            require_bytes(payload_sha256, 32, "payload sha256"),
        )
    )


def sealed_digest(sealed: bytes) -> bytes:
    """SHA-256 of one sealed copy, as a sealed-set message lists it (1 to 65535 bytes)."""
    if not 0 < len(sealed) < 2**16:
        raise ValueError(f"a sealed message has 1 to 65535 bytes; got {len(sealed)}")
    return hashlib.sha256(sealed).digest()


def sealed_set_message(
    config_hash: bytes,
    session_id: str,
    round_index: int,
    *,
    kind: str,
    binding: bytes,
    sender: str,
    digests: Mapping[str, bytes],
) -> bytes:
    """The bytes a node signs over the aggregate-check messages it sealed in one call.

    ``digests`` maps each recipient to :func:`sealed_digest` of its copy.
    ``kind`` is "contribution" (``binding`` 32 zero bytes) or "tags"
    (``binding`` the survivor-set hash the tags were made for).

    Raises ValueError for another kind, no recipient, the sender among the
    recipients or a digest that is not 32 bytes.
    """
    if kind not in SEALED_KINDS:
        raise ValueError(f"kind must be one of {SEALED_KINDS}; got {kind!r}")
    if not digests:
        raise ValueError("a sealed set names at least one recipient; got none")
    if sender in digests:
        raise ValueError(f"a node seals nothing for itself; {sender!r} is among the recipients")
    parts = [
        _SEALED_SET_LABEL,
        require_bytes(config_hash, 32, "config hash"),
        _lp(session_id, "session id"),
        _round(round_index),
        _lp(kind, "kind"),
        require_bytes(binding, 32, "binding"),
        _lp(sender, "sender"),
        struct.pack(">I", len(digests)),
    ]
    for recipient in sorted(digests):
        parts.append(_lp(recipient, "recipient"))
        parts.append(require_bytes(digests[recipient], 32, f"digest for {recipient!r}"))
    return b"".join(parts)
