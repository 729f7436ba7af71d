"""What a coordinator can compute of a node's clean values from everything it received.

Node k uploads y_k = q(x_k) + m_k + q(r_k) + b_k (mod 2^64): its fixed-point
values, its zero-sum mask m_k = Σ_j p_kj (p_kj = −p_jk, docs/design.md §6),
residual noise and its uniform self-mask b_k (noise/self_mask.py). In the
unmask step a node answering a request with dropped set D sends its seed β_k
and c_k = Σ_{j∈D} p_kj. From those the coordinator can form

    ŷ_k = y_k − b_k(β_k) − c_k + Σ_{j : D_j = {k}} c_j,

subtracting k's own seed and pair terms when k sent them, and adding every
other node's pair term with k when that node was told k alone dropped (then
c_j = p_jk = −p_kj). What is left, ŷ_k − q(x_k), is the noise that still
hides k's values: Gaussian noise of at least the declared floor while k's
protections hold, a uniform word (of standard deviation about 2^64/√12 before
scaling) while b_k is not known, and q(r_k) or nothing when the lie worked.
The same holds for a CAPE-sum share (the pads are the pair terms there).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from noise.fixed_point import FixedPointCodec
from noise.self_mask import self_mask
from tests.adversary.lying_server import RoundRecord

__all__ = ["Leftover", "leftover", "stripped"]

U64 = NDArray[np.uint64]


def stripped(record: RoundRecord, node: str, *, seed: bytes | None = None) -> U64:
    """ŷ_k of the module docstring; ``seed`` stands in for a β_k the server never received."""
    layout = record.layout
    words = record.uploads[node].words.copy()
    own = record.answers.get(node)
    known = bytes(own.header.self_mask_seed) if own is not None else seed
    if known is not None:
        words -= self_mask(known, layout, round_index=record.index)
    if own is not None and own.corrections is not None:
        words -= own.corrections
    for other, answer in record.answers.items():
        if other != node and answer.dropped == (node,) and answer.corrections is not None:
            words += answer.corrections
    return words


@dataclass(frozen=True)
class Leftover:
    """The noise left on a node's values, standardised by its declared floor.

    ``rms`` is sqrt(mean over entries of (e_i / floor_t)²), ``n`` the number
    of entries: with Gaussian noise of exactly the floor it is 1 ± 1/√(2n).
    ``exact`` says the reconstruction equals the clean values bit for bit.
    """

    rms: float
    n: int
    exact: bool

    @property
    def lower_bound(self) -> float:
        """Five standard errors below 1: noise at the floor passes, stripped noise fails."""
        return 1.0 - 5.0 / math.sqrt(2.0 * self.n)

    @property
    def keeps_floor(self) -> bool:
        return self.rms >= self.lower_bound


def floors(manifest: Mapping[str, Any]) -> dict[str, float]:
    """Each tensor's declared floor: the σ left against the worst T colluders.

    That is the last ``coalition_sigma`` of the egress receipt (the plan meets
    the per-egress target Δ_t·√M/μ* there); without colluders it is ``sigma``.
    """
    out = {}
    for tensor in manifest["tensors"]:
        coalition = tensor.get("coalition_sigma") or [tensor["sigma"]]
        out[tensor["name"]] = float(coalition[-1])
    return out


def leftover(
    words: U64, clean: U64, record: RoundRecord, floor: Mapping[str, float], bits: int
) -> Leftover:
    """The noise ``words − clean`` in real units, over ``floor`` tensor by tensor."""
    codec = FixedPointCodec(bits)
    noise = codec.decode((words - clean).astype(np.uint64))
    scaled = np.concatenate(
        [noise[slot.offset : slot.offset + slot.size] / floor[slot.name] for slot in record.layout]
    )
    return Leftover(
        rms=float(np.sqrt(np.mean(np.square(scaled)))),
        n=int(scaled.size),
        exact=bool(np.array_equal(words, clean)),
    )
