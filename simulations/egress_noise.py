"""Vectorised draws of every node's egress noise, for thousands of simulated nodes.

The protocol draws each pair term from an AES-CTR stream keyed by a pairwise
seed (``noise.masks``). A simulation needs the same *distribution*, not the same
keys, so here every draw comes from one explicit ``numpy.random.Generator`` and
a whole federation's noise is a handful of array operations:

* Pairwise construction, any graph. With one N(0, 1) variable z_e per edge
  e = (i, j), i < j, and c_e² the pair variance, node k's mask is
  m_k = Σ_e B_ke c_e z_e with the signed incidence matrix B (B_ie = +1,
  B_je = −1), so Cov(m) = B diag(c²) Bᵀ = R, the weighted graph Laplacian of
  ``noise.designs`` (Liao, Chen & Larsson, arXiv 2210.02235, 2022, eq. 7).
* Complete graph with one pair variance c² (what ``complete_design`` builds
  for equal targets). R = c²(K·I − 11ᵀ) = K c²·(I − 11ᵀ/K), the covariance of
  sqrt(K c²)·(g − mean(g)) with g ~ N(0, I_K): K draws instead of K(K−1)/2.
  This is the CAPE-equivalent form of docs/design.md §6 and is how K = 1000 stays
  cheap.
* CAPE (Imtiaz, Mohammadi & Sarwate, arXiv 1904.10059, 2019). ê_k ~ N(0, τ²)
  and e_k = ê_k − Σê/K.

Exact cancellation. In fixed point (``noise.fixed_point``) the protocol's zero
sum is exact, bit for bit, and the simulation keeps that property rather than
relying on floating-point luck: pair terms are quantised once and added with
both signs, and CAPE's sum is split with ``noise.masks.cape_share_of_sum``.
:func:`zero_sum_fixed` returns int64 masks whose column sums are exactly 0.

Attacks need to know what a coalition can subtract, so the float samplers
also return the latent variables (the z_e or the ê_k); see
``simulations.attacks``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import sparse

from noise.designs import Design
from noise.fixed_point import FixedPointCodec
from noise.masks import cape_share_of_sum

__all__ = [
    "Edges",
    "ZeroSumDraw",
    "design_edges",
    "draw_zero_sum",
    "independent_fixed",
    "is_uniform_complete",
    "zero_sum_fixed",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Edges:
    """The pairs {i < j} of a pairwise design with c_ij > 0, and their signed incidence matrix."""

    first: NDArray[np.intp]
    second: NDArray[np.intp]
    std: FloatArray
    incidence: sparse.csr_matrix

    @property
    def count(self) -> int:
        return int(self.std.size)


def design_edges(design: Design) -> Edges:
    """Edges of ``design`` in row-major order of the upper triangle."""
    k = len(design.node_ids)
    first, second = np.nonzero(np.triu(design.pair_variances, k=1))
    std = np.sqrt(design.pair_variances[first, second])
    e = first.size
    rows = np.concatenate([first, second])
    cols = np.concatenate([np.arange(e), np.arange(e)])
    signs = np.concatenate([np.ones(e), -np.ones(e)])
    incidence = sparse.csr_matrix((signs, (rows, cols)), shape=(k, e))
    return Edges(first=first, second=second, std=std, incidence=incidence)


def is_uniform_complete(design: Design) -> bool:
    """True for a pairwise design on the complete graph with a single pair variance."""
    if design.construction != "pairwise":
        return False
    w = design.pair_variances
    off = w[~np.eye(w.shape[0], dtype=bool)]
    return bool(off.size and np.all(off == off[0]) and off[0] > 0.0)


@dataclass(frozen=True, eq=False)
class ZeroSumDraw:
    """Unit-scale zero-sum noise of K nodes over d entries, with its latent variables.

    ``noise`` is (…, K, d). For the pairwise construction ``edge_draws`` holds
    c_e·z_e (…, E, d) and ``edges`` the graph; for CAPE ``node_draws`` holds ê
    (…, K, d). A coalition's knowledge is a function of these latents.
    """

    noise: FloatArray
    edges: Edges | None = None
    edge_draws: FloatArray | None = None
    node_draws: FloatArray | None = None


def draw_zero_sum(
    design: Design,
    size: int,
    rng: np.random.Generator,
    *,
    batch: tuple[int, ...] = (),
    latents: bool = False,
) -> ZeroSumDraw:
    """Draw ``batch`` independent releases of ``design``'s noise, each (K, size), in float.

    With ``latents`` the pairwise construction always goes edge by edge (so a
    coalition's pair terms are known); otherwise a uniform complete graph uses
    the K-draw form of the module docstring.
    """
    k = len(design.node_ids)
    if design.construction == "cape":
        tau = math.sqrt(design.cape_variance)
        own = rng.standard_normal((*batch, k, size)) * tau
        noise = own - own.mean(axis=-2, keepdims=True)
        return ZeroSumDraw(noise=noise, node_draws=own if latents else None)
    if not latents and is_uniform_complete(design):
        scale = math.sqrt(k * float(design.pair_variances[0, 1]))
        g = rng.standard_normal((*batch, k, size))
        return ZeroSumDraw(noise=scale * (g - g.mean(axis=-2, keepdims=True)))
    edges = design_edges(design)
    terms = rng.standard_normal((*batch, edges.count, size)) * edges.std[:, np.newaxis]
    flat = np.moveaxis(terms, -2, 0).reshape(edges.count, -1)
    noise = np.asarray(edges.incidence @ flat).reshape(k, *batch, size)
    noise = np.moveaxis(noise, 0, -2)
    return ZeroSumDraw(noise=noise, edges=edges, edge_draws=terms if latents else None)


def _quantise(values: FloatArray, codec: FixedPointCodec, what: str) -> IntArray:
    return codec.encode_scaled_int(values, tensor=what)


def zero_sum_fixed(
    design: Design,
    scales: FloatArray,
    rng: np.random.Generator,
    codec: FixedPointCodec,
) -> IntArray:
    """One release of zero-sum masks in fixed point: (K, d) int64 with exactly zero column sums.

    Entry e of every mask is scaled by ``scales[e]`` (the tensor's noise scale)
    before quantisation. Pairwise: each pair term q(s·c·z) is quantised once and
    added at one end and subtracted at the other. Uniform complete graph and
    CAPE: node k's own draw q(ê_k) minus its exact share of Σ q(ê)
    (``noise.masks.cape_share_of_sum``). Either way Σ_k m_k = 0 in integers.
    """
    ids = list(design.node_ids)
    k = len(ids)
    size = int(scales.size)
    if design.construction == "cape" or is_uniform_complete(design):
        tau = (
            math.sqrt(design.cape_variance)
            if design.construction == "cape"
            else math.sqrt(k * float(design.pair_variances[0, 1]))
        )
        own = _quantise(rng.standard_normal((k, size)) * (tau * scales), codec, "zero-sum draw")
        total = own.sum(axis=0).view(np.uint64)
        masks = np.empty_like(own)
        for rank, node in enumerate(ids):
            masks[rank] = own[rank] - cape_share_of_sum(total, ids, node).view(np.int64)
        return masks
    edges = design_edges(design)
    terms = _quantise(
        rng.standard_normal((edges.count, size)) * edges.std[:, np.newaxis] * scales,
        codec,
        "pair term",
    )
    masks = np.zeros((k, size), dtype=np.int64)
    np.add.at(masks, edges.first, terms)
    np.subtract.at(masks, edges.second, terms)
    return masks


def independent_fixed(
    n_nodes: int,
    scales: FloatArray,
    variance: float,
    rng: np.random.Generator,
    codec: FixedPointCodec,
) -> IntArray:
    """Independent N(0, variance·scales²) noise for every node and entry, in fixed point."""
    if variance == 0.0:
        return np.zeros((n_nodes, scales.size), dtype=np.int64)
    draws = rng.standard_normal((n_nodes, scales.size)) * (math.sqrt(variance) * scales)
    return _quantise(draws, codec, "independent noise")
