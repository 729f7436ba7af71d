"""Pairwise seeds and per-(round, tensor) stream keys (docs/design.md §4.3).

Nodes i and j agree on a 32-byte seed without ever sending it:

    s_ij = HKDF-SHA256(IKM  = X25519(sk_i, pk_j),
                       salt = UTF-8(session_id),
                       info = b"zerosum/v1" ‖ config_hash ‖ lp(min(i, j)) ‖ lp(max(i, j)),
                       L    = 32)

X25519(sk_i, pk_j) = X25519(sk_j, pk_i) (Bernstein 2006), and the info orders
the two node ids (by Python string order, i.e. by Unicode code point), so both
ends compute the same s_ij. HKDF (Krawczyk 2010, "Cryptographic extraction and
key derivation: the HKDF scheme", CRYPTO; RFC 5869) turns the Diffie-Hellman
output, which is not uniform, into a uniform key, and its salt and info bind
the key to the session, the federation and the pair: a seed from one context
says nothing about the seed of any other.

Each use of a seed gets its own 32-byte stream key, so no keystream is ever
reused across rounds, tensors or purposes:

    k = HKDF-Expand-SHA256(s_ij, info = b"zerosum/v1/stream" ‖ lp(purpose)
                                        ‖ u64be(round_index) ‖ lp(tensor), L = 32)

``lp(s)`` is a u16 big-endian length followed by the UTF-8 bytes
(:func:`noise.keys.length_prefixed`). Purposes in use: ``"mask"`` (pairwise
Gaussian masks) and ``"cape-blind"`` (uniform blinding for CAPE's secure sum).
"""

from __future__ import annotations

import operator
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from noise.errors import KeyFormatError
from noise.keys import (
    CONFIG_HASH_BYTES,
    PUBLIC_KEY_BYTES,
    EphemeralKey,
    length_prefixed,
    require_bytes,
)

__all__ = ["PROTOCOL_LABEL", "SEED_BYTES", "STREAM_LABEL", "pairwise_seed", "stream_key"]

PROTOCOL_LABEL = b"zerosum/v1"
STREAM_LABEL = b"zerosum/v1/stream"
SEED_BYTES = 32
_MAX_ROUND = 2**64 - 1


def pairwise_seed(
    own: EphemeralKey,
    peer_public: bytes,
    *,
    own_id: str,
    peer_id: str,
    session_id: str,
    config_hash: bytes,
) -> bytes:
    """The 32-byte seed s_ij this node shares with ``peer_id`` (identical at both ends).

    Raises :class:`KeyFormatError` for a wrong-length key or config hash, an
    empty or over-long identifier, a peer id equal to the node's own id, or a
    low-order peer key.
    """
    own_lp = length_prefixed(own_id, "own node id")
    peer_lp = length_prefixed(peer_id, "peer node id")
    if own_id == peer_id:
        raise KeyFormatError(
            "peer node id", f"different from this node's own id {own_id!r}", repr(peer_id)
        )
    salt_lp = length_prefixed(session_id, "session id")
    config = require_bytes(config_hash, CONFIG_HASH_BYTES, "config hash")
    peer_key = require_bytes(
        peer_public, PUBLIC_KEY_BYTES, f"X25519 public key of node {peer_id!r}"
    )
    first, second = (own_lp, peer_lp) if own_id < peer_id else (peer_lp, own_lp)
    try:
        shared = own.exchange(peer_key)
    except KeyFormatError as exc:
        raise KeyFormatError(
            f"X25519 public key of node {peer_id!r}", exc.expected, exc.got
        ) from None
    hkdf = HKDF(
        algorithm=hashes.SHA256(),
        length=SEED_BYTES,
        salt=salt_lp[2:],
        info=PROTOCOL_LABEL + config + first + second,
    )
    return hkdf.derive(shared)


def stream_key(seed: bytes, *, round_index: int, tensor: str, purpose: str = "mask") -> bytes:
    """The 32-byte key of the keystream for (purpose, round, tensor) under ``seed``."""
    prk = require_bytes(seed, SEED_BYTES, "pairwise seed")
    if isinstance(round_index, bool):
        raise KeyFormatError("round index", "an integer in [0, 2**64)", repr(round_index))
    try:
        index = operator.index(round_index)
    except TypeError:
        raise KeyFormatError("round index", "an integer in [0, 2**64)", repr(round_index)) from None
    if not 0 <= index <= _MAX_ROUND:
        raise KeyFormatError("round index", "an integer in [0, 2**64)", repr(round_index))
    info = b"".join(
        (
            STREAM_LABEL,
            length_prefixed(purpose, "stream purpose"),
            struct.pack(">Q", index),
            length_prefixed(tensor, "tensor name"),
        )
    )
    return HKDFExpand(algorithm=hashes.SHA256(), length=SEED_BYTES, info=info).derive(prk)
