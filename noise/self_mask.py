"""Self-masks: a uniform one-time pad on every upload, its seed revealed only once all agree.

Every upload of node k in round r carries, on top of its zero-sum noised
values z_k, a uniform self-mask b_k:

    y_k = z_k + b_k (mod 2^64),    b_k = keystream(β_k),

    β_k = HKDF-SHA256(IKM  = the node's X25519 session private key,
                      salt = UTF-8(session_id),
                      info = b"zerosum/v1/self-mask" ‖ config_hash ‖ lp(node_id)
                             ‖ u64be(round_index),
                      L    = 32),

expanded per tensor with ``noise.seeds.stream_key(β_k, purpose="self-mask")``
into uniform uint64 words (``noise.stream.uniform_uint64``). Uniform b_k makes
y_k independent of everything else the coordinator holds (a one-time pad over
Z/2^64Z), so an upload whose seed is never revealed tells it nothing. A node
reveals β_k only after every participant of the round has signed the same
survivor set (the consistency check of Bonawitz et al. 2017, ACM CCS §4), and
never reveals its pair terms with a node it saw survive; a coordinator that
reports an uploaded node as dropped therefore never holds both that node's
self-mask and its pair terms (docs/design.md §4.6).

The seed is a deterministic function of the saved session key, so a node
restarted after a crash reveals the very same seed again, and the coordinator
re-derives b_k from it to subtract.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from numpy.typing import NDArray

from noise.keys import CONFIG_HASH_BYTES, EphemeralKey, length_prefixed, require_bytes
from noise.layout import WORD, Layout
from noise.seeds import SEED_BYTES, stream_key
from noise.stream import add_uniform_uint64, uniform_uint64

__all__ = [
    "SELF_MASK_LABEL",
    "add_self_mask",
    "self_mask",
    "self_mask_commitment",
    "self_mask_seed",
]

SELF_MASK_LABEL = b"zerosum/v1/self-mask"
_COMMITMENT_LABEL = b"zerosum/v1/self-mask-commitment"
_PURPOSE = "self-mask"
_MAX_ROUND = 2**64 - 1


def self_mask_seed(
    key: EphemeralKey, *, config_hash: bytes, session_id: str, node_id: str, round_index: int
) -> bytes:
    """β_k for one round: 32 bytes from the session key (see the module docstring)."""
    require_bytes(config_hash, CONFIG_HASH_BYTES, "config hash")
    if isinstance(round_index, bool) or not 0 <= int(round_index) <= _MAX_ROUND:
        raise ValueError(f"round_index must be a whole number in [0, 2^64); got {round_index!r}")
    info = (
        SELF_MASK_LABEL
        + config_hash
        + length_prefixed(node_id, "node id")
        + struct.pack(">Q", int(round_index))
    )
    return HKDF(
        algorithm=hashes.SHA256(),
        length=SEED_BYTES,
        salt=session_id.encode("utf-8"),
        info=info,
    ).derive(key.private_bytes())


def self_mask_commitment(seed: bytes) -> bytes:
    """SHA-256(b"zerosum/v1/self-mask-commitment" ‖ β): sent with the upload, binding the seed.

    The coordinator checks the revealed seed against it, so a node cannot
    answer with another seed than the one its upload was masked with (which
    would leave a uniform error in the aggregate) without being named.
    """
    require_bytes(seed, SEED_BYTES, "self-mask seed")
    return hashlib.sha256(_COMMITMENT_LABEL + seed).digest()


def self_mask(
    seed: bytes, layout: Layout, *, round_index: int, out: NDArray[np.uint64] | None = None
) -> NDArray[np.uint64]:
    """b_k: uniform uint64 words for every tensor of ``layout``, from the revealed ``seed``.

    Each tensor's words are written straight into its slot of the one output
    vector (no per-tensor array and copy): a new one, or ``out`` (a whole
    payload of ``layout``, e.g. a vector in use already, whose memory is
    warm), which is returned.
    """
    require_bytes(seed, SEED_BYTES, "self-mask seed")
    if out is not None:
        _require_payload_vector(out, layout)
    mask: NDArray[np.uint64] = np.empty(layout.size, dtype=WORD) if out is None else out
    for slot in layout:
        uniform_uint64(
            stream_key(seed, round_index=round_index, tensor=slot.name, purpose=_PURPOSE),
            slot.size,
            out=mask[slot.offset : slot.offset + slot.size],
        )
    return mask


def add_self_mask(
    target: NDArray[np.uint64],
    seed: bytes,
    layout: Layout,
    *,
    round_index: int,
    subtract: bool = False,
) -> NDArray[np.uint64]:
    """``target`` ± b_k (mod 2^64) in place, b_k the self-mask of ``seed``; returns ``target``.

    The same words as :func:`self_mask`, added (or subtracted) a stretch at a
    time as they are made (``noise.stream.add_uniform_uint64``), so no vector
    of them is held: what the coordinator does with each revealed seed, one
    pass over its running sum instead of a fresh 8 MB pad per answer at
    d = 10^6. ``target`` must be a whole payload of ``layout`` (refused
    before any word changes otherwise).
    """
    require_bytes(seed, SEED_BYTES, "self-mask seed")
    _require_payload_vector(target, layout)
    for slot in layout:
        add_uniform_uint64(
            stream_key(seed, round_index=round_index, tensor=slot.name, purpose=_PURPOSE),
            target[slot.offset : slot.offset + slot.size],
            subtract=subtract,
        )
    return target


def _require_payload_vector(vector: object, layout: Layout) -> None:
    """ValueError unless ``vector`` is an array of exactly ``layout``'s words (its shape)."""
    if not isinstance(vector, np.ndarray) or vector.shape != (layout.size,):
        shape = vector.shape if isinstance(vector, np.ndarray) else type(vector).__name__
        raise ValueError(
            f"the self-mask of a layout of {layout.size} words goes into a vector of that "
            f"length; got {shape}"
        )
