"""Zero-sum correlated masks on the fixed-point grid.

Pairwise construction (docs/design.md §4.4, §6). For every pair {i, j} with pair
variance c_ij² > 0 (in grid units², an exact fraction: ``noise.exact_noise``)
both ends expand the same stream key from their shared seed s_ij and draw the
same integers t_ij ~ N_Z(0, c_ij²), the discrete Gaussian
(``noise.discrete``). Node i adds t_ij when i < j and subtracts it otherwise,
so node k's mask is

    m_k = Σ_j ±t_kj        (arithmetic modulo 2^64)

and Σ_k m_k = 0 exactly, bit for bit: every t_ij appears once with each sign.
The masks have the graph-Laplacian covariance R = Σ_{i<j} c_ij² (e_i − e_j)(e_i − e_j)ᵀ
(for c_ij² of more than a few grid units the discrete Gaussian's variance is
c_ij² to within e^(−2π²c_ij²)).

CAPE construction (Imtiaz, Mohammadi & Sarwate 2019, arXiv 1904.10059). Node k
draws ê_k ~ N_Z(0, τ²) from a stream keyed by its own session secret. The
nodes learn S = Σ_k ê_k through a secure sum blinded by uniform pairwise uint64
masks (which cancel modulo 2^64). Each node then uses e_k = ê_k − share_k(S),
where the shares split S into K integers that add up to S exactly, so again
Σ_k e_k = 0 bit for bit; marginally R = τ²(I − 11ᵀ/K).

Both ends of a pair draw the same integers because the samplers are exact
integer algorithms over the keyed stream and every variance is an exact
fraction of the scale the config pins; no floating-point value a node
computes itself decides a draw.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from noise.designs import Design
from noise.discrete import discrete_gaussian_variance
from noise.errors import KeyFormatError
from noise.fixed_point import FixedPointCodec
from noise.seeds import stream_key
from noise.stream import uniform_uint64

__all__ = [
    "cape_blinding",
    "cape_draw",
    "cape_mask",
    "cape_share_of_sum",
    "design_variances",
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


def design_variances(design: Design, node_id: str, codec: FixedPointCodec) -> dict[str, Fraction]:
    """c_kj² in grid units² from a design's own float variances (exact binary values).

    For designs made outside a federation (simulations, tests): both ends use
    the same float design, so the fractions agree. A node in a session uses
    the exact variances of the config's pinned scales instead
    (``node.egress.release.ReleaseNoise.pair_variances``).
    """
    scale = Fraction(2) ** (2 * codec.frac_bits)
    row = design.pair_variances[design.index(node_id)]
    return {
        peer: Fraction(float(c2)) * scale
        for peer, c2 in zip(design.node_ids, row, strict=True)
        if c2 > 0.0
    }


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
    variances: Mapping[str, Fraction] | None = None,
    out: NDArray[np.uint64] | None = None,
) -> NDArray[np.uint64]:
    """Signed sum of node ``node_id``'s pair terms ±t_kj with the given peers.

    With ``peers`` = all neighbours this is the node's whole mask. With
    ``peers`` = dropped nodes it is the unmask correction the coordinator
    subtracts from the survivors' sum to recover their exact aggregate.
    ``variances`` maps each neighbour to c_kj² in grid units² (default:
    :func:`design_variances`). ``out``: a uint64 vector of ``size`` entries
    the terms are added into (modulo 2^64) and which is returned, e.g. the
    tensor's slot of a whole payload; by default a fresh vector of zeros.
    """
    design.index(node_id)  # validates the id
    exact = design_variances(design, node_id, codec) if variances is None else variances
    peer_list = [p for p in peers if exact.get(p, Fraction(0)) > 0]
    _check_seeds(node_id, peer_list, seeds)
    if out is None:
        total = np.zeros(size, dtype=_U64)
    elif out.dtype != _U64 or out.shape != (size,):
        raise ValueError(
            f"out must be a uint64 vector of {size} entries for tensor {tensor!r}; got dtype "
            f"{out.dtype} with shape {out.shape}"
        )
    else:
        total = out
    for peer in sorted(peer_list):
        key = stream_key(seeds[peer], round_index=round_index, tensor=tensor, purpose="mask")
        term = discrete_gaussian_variance(key, exact[peer], size).view(_U64)
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
    variances: Mapping[str, Fraction] | None = None,
    out: NDArray[np.uint64] | None = None,
) -> NDArray[np.uint64]:
    """Node ``node_id``'s full pairwise mask m_k = Σ_j ±t_kj, t_kj ~ N_Z(0, c_kj²), one tensor.

    ``out`` as for :func:`pair_terms` (the mask is added into it).
    """
    return pair_terms(
        design,
        node_id,
        seeds,
        design.neighbours(node_id),
        round_index=round_index,
        tensor=tensor,
        size=size,
        codec=codec,
        variances=variances,
        out=out,
    )


def cape_draw(key: bytes, variance: Fraction | float, size: int) -> NDArray[np.uint64]:
    """Node k's private CAPE draw ê_k ~ N_Z(0, τ²) (τ² in grid units²) from its own keyed stream."""
    return discrete_gaussian_variance(key, variance, size).view(_U64)


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
