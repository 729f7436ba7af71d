"""Zero-sum correlated masks in fixed point.

Pairwise construction (docs/design.md §4.4, §6). For every pair {i, j} with pair
standard deviation c_ij > 0 both ends expand the same stream key from their
shared seed s_ij, draw the same standard normals z_ij and quantise the same
values t_ij = round(2^F · c_ij · z_ij). Node i adds t_ij when i < j and
subtracts it otherwise, so node k's mask is

    m_k = Σ_j ±t_kj        (arithmetic modulo 2^64)

and Σ_k m_k = 0 exactly, bit for bit: every t_ij appears once with each sign.
Across sessions the masks are Gaussian (up to 2^-F quantisation) with the
graph-Laplacian covariance R = Σ_{i<j} c_ij² (e_i − e_j)(e_i − e_j)ᵀ.

CAPE construction (Imtiaz, Mohammadi & Sarwate 2019, arXiv 1904.10059). Node k
draws ê_k ~ N(0, τ²) privately and quantises it. The nodes learn S = Σ_k q(ê_k)
through a secure sum blinded by uniform pairwise uint64 masks (which cancel
modulo 2^64). Each node then uses e_k = q(ê_k) − share_k(S), where the shares
split S into K integers that add up to S exactly, so again Σ_k e_k = 0 bit for
bit; marginally R = τ²(I − 11ᵀ/K).

Identical quantised values at both ends rely only on IEEE-754 double
arithmetic (one multiplication, round-half-to-even) and on the keyed stream
being deterministic; no floating-point sum is ever shared between nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from noise.designs import Design
from noise.errors import KeyFormatError
from noise.fixed_point import FixedPointCodec
from noise.seeds import stream_key
from noise.stream import standard_normal, uniform_uint64

__all__ = [
    "cape_blinding",
    "cape_draw",
    "cape_mask",
    "cape_share_of_sum",
    "pair_terms",
    "pairwise_mask",
]

_U64 = np.uint64


def _check_seeds(node_id: str, peers: Iterable[str], seeds: Mapping[str, bytes]) -> None:
    for peer in peers:
        seed = seeds.get(peer)
        if seed is None:
            raise KeyError(f"node {node_id!r} has no pairwise seed for peer {peer!r}")
        if not isinstance(seed, bytes) or len(seed) != 32:
            got = f"{len(seed)} bytes" if isinstance(seed, bytes) else type(seed).__name__
            raise KeyFormatError(f"pairwise seed of {node_id!r} with {peer!r}", "32 bytes", got)


def pair_terms(
    design: Design,
    node_id: str,
    seeds: Mapping[str, bytes],
    peers: Iterable[str],
    *,
    round_index: int,
    tensor: str,
    size: int,
    codec: FixedPointCodec,
) -> NDArray[np.uint64]:
    """Signed sum of node ``node_id``'s pair terms ±t_kj with the given peers.

    With ``peers`` = all neighbours this is the node's whole mask. With
    ``peers`` = dropped nodes it is the unmask correction the coordinator
    subtracts from the survivors' sum to recover their exact aggregate.
    """
    design.index(node_id)  # validates the id
    peer_list = [p for p in peers if design.pair_std(node_id, p) > 0.0]
    _check_seeds(node_id, peer_list, seeds)
    total = np.zeros(size, dtype=_U64)
    draws = np.empty(size, dtype=np.float64)
    for peer in sorted(peer_list):
        key = stream_key(seeds[peer], round_index=round_index, tensor=tensor, purpose="mask")
        standard_normal(key, size, out=draws)
        draws *= design.pair_std(node_id, peer)
        term = codec.encode(draws, tensor=f"{tensor} (mask term with {peer!r})")
        if node_id < peer:
            total += term
        else:
            total -= term
    return total


def pairwise_mask(
    design: Design,
    node_id: str,
    seeds: Mapping[str, bytes],
    *,
    round_index: int,
    tensor: str,
    size: int,
    codec: FixedPointCodec,
) -> NDArray[np.uint64]:
    """Node ``node_id``'s full pairwise mask m_k = Σ_j ±q(c_kj · z_kj) for one tensor."""
    return pair_terms(
        design,
        node_id,
        seeds,
        design.neighbours(node_id),
        round_index=round_index,
        tensor=tensor,
        size=size,
        codec=codec,
    )


def cape_draw(
    size: int, std: float, rng: np.random.Generator, codec: FixedPointCodec, *, tensor: str
) -> NDArray[np.uint64]:
    """Quantised private draw q(ê_k), ê_k ~ N(0, std²), from an explicit generator."""
    if not np.isfinite(std) or std < 0.0:
        raise ValueError(f"CAPE noise std for tensor {tensor!r} must be finite and >= 0; got {std}")
    return codec.encode(rng.standard_normal(size) * std, tensor=f"{tensor} (CAPE draw)")


def cape_blinding(
    node_ids: Sequence[str],
    node_id: str,
    seeds: Mapping[str, bytes],
    *,
    round_index: int,
    tensor: str,
    size: int,
) -> NDArray[np.uint64]:
    """Uniform pairwise blinding Σ_j ±u_kj for CAPE's secure sum (cancels modulo 2^64).

    Every other node of ``node_ids`` is a partner: each u_kj is uniform on
    [0, 2^64), so a blinded share reveals nothing about q(ê_k) on its own.
    """
    if node_id not in node_ids:
        raise ValueError(f"node {node_id!r} is not among the CAPE participants {list(node_ids)}")
    peers = [p for p in node_ids if p != node_id]
    _check_seeds(node_id, peers, seeds)
    total = np.zeros(size, dtype=_U64)
    for peer in sorted(peers):
        key = stream_key(seeds[peer], round_index=round_index, tensor=tensor, purpose="cape-blind")
        term = uniform_uint64(key, size)
        if node_id < peer:
            total += term
        else:
            total -= term
    return total


def cape_share_of_sum(
    total: NDArray[np.uint64], node_ids: Sequence[str], node_id: str
) -> NDArray[np.uint64]:
    """Node ``node_id``'s exact share of S so that Σ_k share_k = S (mod 2^64).

    S is read as a signed integer; with K participants, S = K·q + r with
    0 ≤ r < K (floor division), and the first r nodes in sorted order take
    q + 1, the others q. The shares are S/K up to one unit of 2^-F.
    """
    ordered = sorted(node_ids)
    if node_id not in ordered:
        raise ValueError(f"node {node_id!r} is not among the CAPE participants {ordered}")
    k = len(ordered)
    signed = np.asarray(total, dtype=_U64).view(np.int64)
    quotient, remainder = np.divmod(signed, np.int64(k))
    rank = ordered.index(node_id)
    share = quotient + (remainder > rank).astype(np.int64)
    return share.view(_U64)


def cape_mask(
    own_draw: NDArray[np.uint64], total: NDArray[np.uint64], node_ids: Sequence[str], node_id: str
) -> NDArray[np.uint64]:
    """CAPE zero-sum noise e_k = q(ê_k) − share_k(Σ q(ê)), exact modulo 2^64."""
    return own_draw - cape_share_of_sum(total, node_ids, node_id)
