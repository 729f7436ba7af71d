"""Checking an aggregate without trusting its sender: secret linear tags, summed blind.

The coordinator publishes A = Σ_S w_k (mod 2^64), where w_k is node k's
unmasked contribution. Read as two's-complement integers, the honest
contributions and their sum do not overflow (the fixed-point headroom rule),
so over the integers Σ_S signed(w_k) = signed(A) exactly. Every node checks it
against secret random vectors ρ^(1..L) that the coordinator does not know:

    T_k^(ℓ) = ⟨ρ^(ℓ), signed(w_k)⟩  (an exact integer)

Each node sends its T_k blinded by pairwise pads that cancel over S
(mod 2^128), so the coordinator learns only Σ_k T_k^(ℓ), the tag of the true
aggregate, never a node's own; each node then checks

    Σ_k blinded_k^(ℓ) ≡ ⟨ρ^(ℓ), signed(A)⟩   (mod 2^128)  for ℓ = 1..L.

A forged A' ≠ A differs by a non-zero integer vector δ fixed without knowing
ρ; for ρ uniform on {0, …, 2^b − 1}^d, ⟨ρ, δ⟩ = 0 for at most one value of any
ρ_i with δ_i ≠ 0 given the others, so one check fails to catch it with
probability at most 2^-b (the Schwartz–Zippel argument for a linear form), and
L independent checks with at most 2^-bL. Here b = 16 and L = 4: 2^-64. The four
vectors are the four 16-bit quarters of one keystream of uint64 words.

Exactness with floating point. With ρ_i < 2^16 and the words split into four
16-bit limbs (w = Σ_l 2^16l u_l − 2^64·sign), every partial sum of
⟨ρ, u_l⟩ over at most 2^20 entries stays below 2^52, so a float64 matrix
product computes it exactly; longer vectors are processed in blocks and the
block sums added as Python integers.

The secret ρ of a round comes from a challenge key κ = SHA-256 over the
contributions of every participant of the round (:func:`challenge_key`), which
each sends encrypted to the others under their pairwise keys; the coordinator
relays them but cannot read them.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from noise.keys import length_prefixed, require_bytes
from noise.seeds import SEED_BYTES, stream_key
from noise.stream import uniform_uint64

__all__ = [
    "CHALLENGE_BITS",
    "CHALLENGE_VECTORS",
    "TAG_MODULUS",
    "blinded_tags",
    "challenge_key",
    "challenge_vectors",
    "check_tags",
    "tags",
]

CHALLENGE_BITS = 16
CHALLENGE_VECTORS = 4
TAG_MODULUS = 1 << 128
_BLOCK = 1 << 20
_LABEL = b"zerosum/v1/aggregate-challenge"


def challenge_key(contributions: Mapping[str, bytes], *, round_index: int) -> bytes:
    """κ of a round: SHA-256 over every participant's 32-byte contribution, in node order."""
    digest = hashlib.sha256(_LABEL + struct.pack(">Q", round_index))
    for node_id in sorted(contributions):
        digest.update(length_prefixed(node_id, "node id"))
        digest.update(require_bytes(contributions[node_id], SEED_BYTES, "challenge contribution"))
    return digest.digest()


def challenge_vectors(key: bytes, size: int, *, round_index: int) -> NDArray[np.float64]:
    """ρ^(1..L): an L × size float64 array of integers uniform on [0, 2^16)."""
    words = uniform_uint64(
        stream_key(key, round_index=round_index, tensor="rho", purpose="challenge"), size
    )
    quarters = np.ascontiguousarray(words, dtype="<u8").view("<u2").reshape(size, 4)
    rho: NDArray[np.float64] = np.ascontiguousarray(quarters.T, dtype=np.float64)
    return rho


def tags(words: NDArray[np.uint64], rho: NDArray[np.float64]) -> tuple[int, ...]:
    """⟨ρ^(ℓ), signed(words)⟩ for every row ℓ, as exact Python integers."""
    if words.ndim != 1 or rho.ndim != 2 or rho.shape[1] != words.shape[0]:
        raise ValueError(
            f"tags need a vector and one challenge row per check of its length; got "
            f"{words.shape} and {rho.shape}"
        )
    totals = [0] * rho.shape[0]
    data = np.ascontiguousarray(words, dtype="<u8")
    for start in range(0, data.shape[0], _BLOCK):
        block = data[start : start + _BLOCK]
        limbs = block.view("<u2").reshape(-1, 4).astype(np.float64)
        sign = (block >> np.uint64(63)).astype(np.float64)
        part = rho[:, start : start + _BLOCK]
        by_limb = part @ limbs  # exact: every entry < 2^16 · 2^16 · 2^20 = 2^52
        negative = part @ sign
        for row in range(rho.shape[0]):
            value = sum(int(by_limb[row, limb]) << (16 * limb) for limb in range(4))
            totals[row] += value - (int(negative[row]) << 64)
    return tuple(totals)


def blinded_tags(
    own: Sequence[int],
    node_id: str,
    participants: Iterable[str],
    seeds: Mapping[str, bytes],
    *,
    round_index: int,
) -> tuple[int, ...]:
    """``own`` tags plus pairwise pads that cancel over ``participants`` (mod 2^128).

    Node i adds pad_ij if i < j and subtracts it otherwise, pad_ij uniform on
    [0, 2^128) from the pair's seed, so the pads of all participants sum to 0.
    """
    out = [t % TAG_MODULUS for t in own]
    for peer in sorted(set(participants) - {node_id}):
        key = stream_key(seeds[peer], round_index=round_index, tensor="tags", purpose="tag-pad")
        words = uniform_uint64(key, 2 * len(out))
        for row in range(len(out)):
            pad = (int(words[2 * row]) << 64) | int(words[2 * row + 1])
            out[row] = (out[row] + (pad if node_id < peer else -pad)) % TAG_MODULUS
    return tuple(out)


def check_tags(
    blinded: Mapping[str, Sequence[int]], aggregate: NDArray[np.uint64], rho: NDArray[np.float64]
) -> list[int]:
    """The checks ℓ where Σ of everyone's blinded tags differs from the aggregate's tag."""
    expected = tags(aggregate, rho)
    failed = []
    for row, want in enumerate(expected):
        total = sum(int(values[row]) for values in blinded.values()) % TAG_MODULUS
        if total != want % TAG_MODULUS:
            failed.append(row)
    return failed
