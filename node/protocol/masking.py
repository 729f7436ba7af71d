"""From a round's named tensors to the uint64 payload a node submits.

The payload is the concatenation, in layout order, of every tensor flattened
in C order and encoded in fixed point (``noise.fixed_point``). Three vectors
share that layout:

* the *audit* payload q(x_k): the node's exact contribution, kept in the TRE;
* the *mask* m_k: per tensor, the pairwise mask Σ_j ±t_kj with t_kj ~ N_Z(0, c_kj²)
  drawn from the keyed streams of the pairwise seeds (``noise.masks.pairwise_mask``),
  or CAPE's zero-sum e_k = ê_k − share_k(S) (``noise.masks.cape_mask``);
* optional *residual* noise g_k ~ N_Z(0, σ_res²) from this node's private noise
  stream (``noise.residual``).

Every variance is an exact fraction of the config's pinned scale
(``node.egress.release.ReleaseNoise.pair_variances``). The egress is q(x_k) + m_k + g_k
modulo 2^64. Because Σ_k m_k = 0 exactly
in Z/2^64Z, the sum of all egresses equals the sum of all audit payloads bit
for bit when residual noise is off — the property the coordinator's exact
aggregate rests on (docs/design.md §4.4).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from node.egress.release import ReleaseNoise
from noise.fixed_point import FixedPointCodec
from noise.layout import Layout, TensorSlot
from noise.masks import cape_blinding, cape_draw, cape_mask, pair_terms, pairwise_mask
from noise.residual import private_noise_key, residual_draw

__all__ = [
    "MaskPrefetch",
    "add_residual_noise",
    "cape_draws",
    "cape_masks",
    "cape_sum_payload",
    "mask_key",
    "pairwise_masks",
    "unmask_corrections",
]

U64 = NDArray[np.uint64]


def pairwise_masks(
    noise: ReleaseNoise,
    seeds: Mapping[str, bytes],
    layout: Layout,
    *,
    round_index: int,
    codec: FixedPointCodec,
) -> U64:
    """m_k for every tensor: the pairwise zero-sum mask in the tensor's own scale.

    Each tensor's pair terms are added straight into its slot of the payload
    vector: one vector of the payload's size, not one more per tensor.
    """
    mask: U64 = np.zeros(layout.size, dtype=np.uint64)
    for slot in layout:
        pairwise_mask(
            noise.design(slot.name),
            noise.node_id,
            seeds,
            round_index=round_index,
            tensor=slot.name,
            size=slot.size,
            codec=codec,
            variances=noise.pair_variances(slot.name),
            out=mask[slot.offset : slot.offset + slot.size],
        )
    return mask


MaskKey = tuple[int, tuple[tuple[TensorSlot, tuple[tuple[str, Fraction], ...]], ...]]


def mask_key(noise: ReleaseNoise, layout: Layout, *, round_index: int) -> MaskKey:
    """Everything :func:`pairwise_masks` depends on besides the session's seeds and codec.

    Per tensor slot: its name, shape, offset and size, and this node's exact
    pair variance with every partner. Two calls with equal keys (same seeds,
    same codec) return the same mask bit for bit.
    """
    slots = []
    for slot in layout:
        pairs = tuple(sorted(noise.pair_variances(slot.name).items()))
        slots.append((slot, pairs))
    return (round_index, tuple(slots))


class MaskPrefetch:
    """Pairwise masks drawn ahead of their round, in one background thread.

    A pairwise mask depends only on the session's seeds, the round index, the
    tensor layout and the design's pair weights (:func:`mask_key`), never on
    data. A node therefore knows each round's mask as soon as it knows the
    round's layout and participants, and can draw it while it computes its
    statistics, writes files or waits for the round to open; numpy's ziggurat,
    the AES-CTR keystream and the fixed-point encoding release the GIL, so the
    drawing runs beside the main thread. On a machine shared by many nodes
    (the benchmark's 10 node processes on 2 cores) this takes the dominant CPU
    cost of a masked round off the round's critical path.

    :meth:`take` returns the mask for exactly the arguments given: the
    prefetched one when its key matches, otherwise (a dropout changed the
    participants, or nothing was started) one drawn on the spot. Either way the
    bits are those of :func:`pairwise_masks`. Only the most recent start is
    kept, so at most one round's mask is held in memory ahead of time.
    """

    def __init__(self, seeds: Mapping[str, bytes], codec: FixedPointCodec) -> None:
        self._seeds = dict(seeds)
        self._codec = codec
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerosum-masks")
        self._lock = threading.Lock()
        self._pending: tuple[MaskKey, Future[U64]] | None = None
        self.hits = 0
        self.misses = 0

    def start(self, noise: ReleaseNoise, layout: Layout, *, round_index: int) -> None:
        """Begin drawing the mask for these arguments (replaces any earlier start)."""
        key = mask_key(noise, layout, round_index=round_index)
        with self._lock:
            if self._pending is not None and self._pending[0] == key:
                return
            if self._pending is not None:
                self._pending[1].cancel()
            future = self._executor.submit(
                pairwise_masks,
                noise,
                self._seeds,
                layout,
                round_index=round_index,
                codec=self._codec,
            )
            self._pending = (key, future)

    def take(self, noise: ReleaseNoise, layout: Layout, *, round_index: int) -> U64:
        """The mask of :func:`pairwise_masks` for these arguments (prefetched when it matches)."""
        key = mask_key(noise, layout, round_index=round_index)
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            if pending[0] == key:
                self.hits += 1
                return pending[1].result()  # re-raises whatever the drawing raised
            pending[1].cancel()
        self.misses += 1
        return pairwise_masks(
            noise, self._seeds, layout, round_index=round_index, codec=self._codec
        )

    def close(self) -> None:
        """Drop any pending draw and stop the thread (waits for a draw in progress)."""
        with self._lock:
            if self._pending is not None:
                self._pending[1].cancel()
            self._pending = None
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> MaskPrefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def unmask_corrections(
    noise: ReleaseNoise,
    seeds: Mapping[str, bytes],
    layout: Layout,
    dropped: Sequence[str],
    *,
    round_index: int,
    codec: FixedPointCodec,
) -> U64:
    """Σ_{j∈D} ±q(c_kj·z_kj) per tensor: what the coordinator subtracts to cancel the dropped."""
    corrections: U64 = layout.build(
        lambda slot: pair_terms(
            noise.design(slot.name),
            noise.node_id,
            seeds,
            dropped,
            round_index=round_index,
            tensor=slot.name,
            size=slot.size,
            codec=codec,
            variances=noise.pair_variances(slot.name),
        )
    )
    return corrections


def add_residual_noise(
    payload: U64,
    noise: ReleaseNoise,
    layout: Layout,
    *,
    seed: bytes,
    round_index: int,
    in_place: bool = False,
) -> U64:
    """payload + g, g ~ N_Z(0, σ_res,t²) per entry of tensor t, from the private stream ``seed``.

    ``in_place``: add g inside ``payload`` (which the caller gives up) instead of a copy.
    """
    out = payload if in_place else payload.copy()
    for slot in layout:
        variance = noise.residual_variance_units(slot.name)
        if variance == 0:
            continue
        key = private_noise_key(seed, purpose="residual", round_index=round_index, tensor=slot.name)
        out[slot.offset : slot.offset + slot.size] += residual_draw(key, variance, slot.size)
    return out


def cape_draws(noise: ReleaseNoise, layout: Layout, *, seed: bytes, round_index: int) -> U64:
    """ê_k for every tensor, ê_k ~ N_Z(0, τ_t²), from this node's private stream ``seed``."""
    draws: U64 = layout.build(
        lambda slot: cape_draw(
            private_noise_key(seed, purpose="cape-draw", round_index=round_index, tensor=slot.name),
            noise.cape_variance_units(slot.name),
            slot.size,
        )
    )
    return draws


def cape_sum_payload(
    draws: U64,
    participants: Sequence[str],
    node_id: str,
    seeds: Mapping[str, bytes],
    layout: Layout,
    *,
    round_index: int,
) -> U64:
    """q(ê_k) + uniform pairwise blinding: this node's share of CAPE's secure sum."""
    blinding: U64 = layout.build(
        lambda slot: cape_blinding(
            participants,
            node_id,
            seeds,
            round_index=round_index,
            tensor=slot.name,
            size=slot.size,
        )
    )
    return draws + blinding


def cape_masks(draws: U64, total: U64, participants: Sequence[str], node_id: str) -> U64:
    """e_k = q(ê_k) − share_k(S) for the whole payload (shares split S exactly)."""
    return cape_mask(draws, total, participants, node_id)
