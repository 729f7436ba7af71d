"""Covariance designs for zero-sum correlated noise.

A design fixes the joint covariance R of the K nodes' noise. Every design here
satisfies R ⪰ 0 and R1 = 0, so the noise cancels in the sum over nodes while
each node's own egress carries variance R_kk.

Pairwise construction. Nodes i and j share a seed and draw the same z_ij ~
N(0, 1); node i adds c_ij·z_ij, node j subtracts it. The covariance is the
weighted graph Laplacian

    R = Σ_{i<j} c_ij² (e_i − e_j)(e_i − e_j)ᵀ,

(the zero-sum conditions 1ᵀR1 = 0, R ⪰ 0 of correlated additive perturbations,
Liao, Chen & Larsson, arXiv 2210.02235, 2022). A coalition
C of colluding nodes knows every pair term it takes part in, so an honest node
h keeps Σ_{j∉C, j≠h} c_hj² of its noise.

CAPE construction (Imtiaz, Mohammadi & Sarwate, "Distributed differentially
private computation of functions with correlated noise", arXiv 1904.10059,
2019). Node k draws ê_k ~ N(0, τ²), the nodes learn Σê through a secure sum,
and node k uses e_k = ê_k − Σê/K. Marginally R = τ²(I − 11ᵀ/K), the complete
graph with c² = τ²/K, but a coalition learns only its own ê_j and Σê, so with
n_H honest nodes each keeps τ²(1 − 1/n_H).

Collusion targets. Given per-node targets σ_k² and a collusion threshold T,
the pairwise builders choose c² so that every node keeps at least σ_k² against
any T other nodes pooling their seeds: node k with d_k partners, each edge
weighted at least σ_k²/(d_k − T), still holds d_k − T of them whatever T the
coalition removes. An edge takes the larger of its two ends' requirements.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from noise.errors import CalibrationError, DesignError, InfeasibleDesignError

__all__ = [
    "Construction",
    "Design",
    "cape_design",
    "complete_design",
    "conditional_covariance",
    "explicit_design",
    "harary_design",
    "remaining_variance",
]

Construction = Literal["pairwise", "cape"]

_KINDS: dict[str, Construction] = {
    "complete": "pairwise",
    "harary": "pairwise",
    "explicit": "pairwise",
    "cape": "cape",
}


@dataclass(frozen=True)
class Design:
    """An immutable covariance design over sorted node ids.

    ``pair_variances[i, j]`` is c_ij², symmetric with a zero diagonal; for the
    CAPE construction it holds the equivalent complete graph c² = τ²/K (for
    reporting) and ``cape_variance`` holds τ². The array is stored read-only.
    """

    node_ids: tuple[str, ...]
    pair_variances: NDArray[np.float64]
    construction: Construction
    kind: str
    cape_variance: float = 0.0
    collusion_threshold: int = 0

    def __post_init__(self) -> None:  # noqa: C901 - one check per field, in field order
        ids = self.node_ids
        if not isinstance(ids, tuple) or not all(isinstance(n, str) for n in ids):
            raise TypeError(f"node_ids must be a tuple of strings; got {ids!r}")
        if list(ids) != sorted(set(ids)):
            raise DesignError("node_ids", f"node_ids must be sorted and unique; got {ids!r}")
        k = len(ids)
        w = np.array(self.pair_variances, dtype=np.float64)
        if w.shape != (k, k):
            raise DesignError(
                "pair_variances", f"pair_variances must be a {k}×{k} matrix; got shape {w.shape}"
            )
        if not np.all(np.isfinite(w)) or np.any(w < 0.0):
            raise DesignError("pair_variances", "pair_variances must be finite and non-negative")
        if not np.array_equal(w, w.T):
            raise DesignError("pair_variances", "pair_variances must be exactly symmetric")
        if np.any(np.diag(w) != 0.0):
            raise DesignError(
                "pair_variances",
                "pair_variances must have a zero diagonal (no node pairs with itself)",
            )
        if _KINDS.get(self.kind) != self.construction:
            raise DesignError(
                "kind", f"kind {self.kind!r} does not belong to construction {self.construction!r}"
            )
        if self.construction == "cape":
            if not (math.isfinite(self.cape_variance) and self.cape_variance > 0.0):
                raise DesignError(
                    "cape_variance",
                    f"cape_variance must be finite and > 0; got {self.cape_variance}",
                )
        elif self.cape_variance != 0.0:
            raise DesignError(
                "cape_variance", "cape_variance is only meaningful for the 'cape' construction"
            )
        if isinstance(self.collusion_threshold, bool) or not isinstance(
            self.collusion_threshold, int
        ):
            raise TypeError(f"collusion_threshold must be an int; got {self.collusion_threshold!r}")
        if self.collusion_threshold < 0:
            raise DesignError(
                "collusion_threshold",
                f"collusion_threshold must be >= 0; got {self.collusion_threshold}",
            )
        w.setflags(write=False)
        object.__setattr__(self, "pair_variances", w)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Design):
            return NotImplemented
        return (
            self.node_ids == other.node_ids
            and np.array_equal(self.pair_variances, other.pair_variances)
            and self.construction == other.construction
            and self.kind == other.kind
            and self.cape_variance == other.cape_variance
            and self.collusion_threshold == other.collusion_threshold
        )

    def __hash__(self) -> int:
        return hash(
            (
                self.node_ids,
                self.pair_variances.tobytes(),
                self.construction,
                self.kind,
                self.cape_variance,
                self.collusion_threshold,
            )
        )

    def index(self, node_id: str) -> int:
        """Position of ``node_id`` in ``node_ids``; ValueError for an unknown id."""
        try:
            return self.node_ids.index(node_id)
        except ValueError:
            raise DesignError(
                "node_id",
                f"unknown node id {node_id!r}; the design's nodes are {list(self.node_ids)}",
            ) from None

    def covariance(self) -> NDArray[np.float64]:
        """R = Σ_{i<j} c_ij² (e_i − e_j)(e_i − e_j)ᵀ = diag(W1) − W, with W = [c_ij²]."""
        w = self.pair_variances
        r = -w.copy()
        np.fill_diagonal(r, w.sum(axis=1))
        return r

    def pair_std(self, a: str, b: str) -> float:
        """c_ab, the pair standard deviation; identical at both ends (0 for a == b)."""
        return math.sqrt(float(self.pair_variances[self.index(a), self.index(b)]))

    def neighbours(self, node_id: str) -> tuple[str, ...]:
        """Ids of the nodes sharing a positive pair variance with ``node_id``, sorted."""
        row = self.pair_variances[self.index(node_id)]
        return tuple(n for n, c2 in zip(self.node_ids, row, strict=True) if c2 > 0.0)

    def variance(self, node_id: str) -> float:
        """R_kk = Σ_j c_kj², the variance of node ``node_id``'s correlated noise."""
        return float(self.pair_variances[self.index(node_id)].sum())


def _normalise_ids(node_ids: Collection[str]) -> tuple[str, ...]:
    if isinstance(node_ids, str):
        raise TypeError(f"node_ids must be a collection of node ids, not the string {node_ids!r}")
    ids = list(node_ids)
    for n in ids:
        if not isinstance(n, str) or not n:
            raise TypeError(f"every node id must be a non-empty string; got {n!r}")
    seen: set[str] = set()
    for n in ids:
        if n in seen:
            raise InfeasibleDesignError(n, "the node id appears more than once")
        seen.add(n)
    if len(ids) < 2:
        raise InfeasibleDesignError(
            None, f"zero-sum noise needs at least 2 nodes; got {len(ids)} ({ids!r})"
        )
    return tuple(sorted(ids))


def _positive_finite(value: object) -> bool:
    return (
        isinstance(value, Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
        and float(value) > 0.0
    )


def _normalise_targets(
    ids: tuple[str, ...], target_variance: float | Mapping[str, float]
) -> NDArray[np.float64]:
    if isinstance(target_variance, Mapping):
        unknown = sorted(set(target_variance) - set(ids), key=str)
        if unknown:
            raise DesignError(
                "target_variance",
                f"target variance given for unknown node id {unknown[0]!r}; "
                f"the design's nodes are {list(ids)}",
            )
        values: list[float] = []
        for n in ids:
            if n not in target_variance:
                raise InfeasibleDesignError(n, "no target variance was given for this node")
            v = target_variance[n]
            if not _positive_finite(v):
                raise InfeasibleDesignError(n, f"target variance {v!r} must be finite and > 0")
            values.append(float(v))
        return np.array(values, dtype=np.float64)
    if not _positive_finite(target_variance):
        raise InfeasibleDesignError(
            None, f"target variance {target_variance!r} must be finite and > 0"
        )
    return np.full(len(ids), float(target_variance), dtype=np.float64)


def _check_threshold(collusion_threshold: int) -> int:
    if isinstance(collusion_threshold, bool) or not isinstance(collusion_threshold, int):
        raise TypeError(f"collusion_threshold must be an int; got {collusion_threshold!r}")
    if collusion_threshold < 0:
        raise InfeasibleDesignError(
            None, f"collusion threshold must be >= 0; got {collusion_threshold}"
        )
    return collusion_threshold


def _graph_weights(
    ids: tuple[str, ...],
    adjacency: NDArray[np.bool_],
    targets: NDArray[np.float64],
    threshold: int,
    context: str,
) -> NDArray[np.float64]:
    """c_ij² = max(σ_i²/(d_i − T), σ_j²/(d_j − T)) on every edge of the graph."""
    degree = adjacency.sum(axis=1)
    for n, d in zip(ids, degree, strict=True):
        if d - threshold < 1:
            raise InfeasibleDesignError(
                n,
                f"{context} and collusion threshold {threshold}, node {n!r} has no pair left "
                "that the coalition does not know; lower the threshold or add nodes",
            )
    need = targets / (degree - threshold)
    w = np.where(adjacency, np.maximum.outer(need, need), 0.0)
    np.fill_diagonal(w, 0.0)
    return w


def complete_design(
    node_ids: Collection[str],
    target_variance: float | Mapping[str, float],
    *,
    collusion_threshold: int = 0,
) -> Design:
    """Complete graph with c_ij² = max(σ_i², σ_j²)/(K − 1 − T).

    Every node keeps at least σ_k² against any T colluders (module docstring);
    infeasible when K − 1 − T < 1, i.e. a coalition of T could hold every pair.
    """
    ids = _normalise_ids(node_ids)
    targets = _normalise_targets(ids, target_variance)
    threshold = _check_threshold(collusion_threshold)
    k = len(ids)
    adjacency = ~np.eye(k, dtype=np.bool_)
    w = _graph_weights(ids, adjacency, targets, threshold, f"with {k} nodes")
    return Design(ids, w, "pairwise", "complete", collusion_threshold=threshold)


def _harary_adjacency(k_nodes: int, degree: int) -> NDArray[np.bool_]:
    """Harary graph H_{degree, K} on a ring of the sorted nodes (Harary, PNAS 1962).

    Even degree: each node joins the degree/2 nearest nodes on either side.
    Odd degree, even K: additionally the diametrically opposite node.
    Odd degree, odd K: additionally i ↔ i + (K+1)/2 for i = 0 … (K−1)/2, so
    node 0 gets degree + 1 and every other node has the given degree (a
    regular graph of odd degree on an odd number of nodes does not exist).
    """
    adj = np.zeros((k_nodes, k_nodes), dtype=np.bool_)

    def join(i: int, j: int) -> None:
        adj[i % k_nodes, j % k_nodes] = True
        adj[j % k_nodes, i % k_nodes] = True

    for i in range(k_nodes):
        for step in range(1, degree // 2 + 1):
            join(i, i + step)
    if degree % 2 == 1:
        if k_nodes % 2 == 0:
            for i in range(k_nodes // 2):
                join(i, i + k_nodes // 2)
        else:
            for i in range((k_nodes - 1) // 2 + 1):
                join(i, i + (k_nodes + 1) // 2)
    return adj


def harary_design(
    node_ids: Collection[str],
    degree: int,
    target_variance: float | Mapping[str, float],
    *,
    collusion_threshold: int = 0,
) -> Design:
    """Sparse design on the Harary graph H_{degree, K}: the fewest pairs for that connectivity.

    Harary graphs are degree-connected with the minimum number of edges, so
    a node's noise survives the loss of any degree − 1 partners. Weights are
    c_ij² = max(σ_i²/(d_i − T), σ_j²/(d_j − T)), i.e. σ²/(degree − T) for a
    uniform target. Requires T < degree < K.
    """
    ids = _normalise_ids(node_ids)
    targets = _normalise_targets(ids, target_variance)
    threshold = _check_threshold(collusion_threshold)
    k = len(ids)
    if isinstance(degree, bool) or not isinstance(degree, int):
        raise TypeError(f"degree must be an int; got {degree!r}")
    if degree < 1:
        raise InfeasibleDesignError(None, f"degree must be at least 1; got {degree}")
    if degree >= k:
        raise InfeasibleDesignError(
            None,
            f"degree {degree} needs at least {degree + 1} nodes; got {k} "
            f"(a graph on {k} nodes has degree at most {k - 1})",
        )
    if degree <= threshold:
        raise InfeasibleDesignError(
            None,
            f"with degree {degree} and collusion threshold {threshold}, a coalition could "
            "hold every pair partner of a node; choose a degree above the threshold",
        )
    adjacency = _harary_adjacency(k, degree)
    w = _graph_weights(ids, adjacency, targets, threshold, f"with degree {degree}")
    return Design(ids, w, "pairwise", "harary", collusion_threshold=threshold)


def explicit_design(
    node_ids: Collection[str], pair_variances: Mapping[tuple[str, str], float]
) -> Design:
    """Design from explicit pair variances {(a, b): c_ab²}; unlisted pairs are 0.

    Each unordered pair may be given once, or twice with the same value.
    Every node needs at least one positive pair, otherwise its mask is zero.
    """
    ids = _normalise_ids(node_ids)
    position = {n: i for i, n in enumerate(ids)}
    k = len(ids)
    w = np.zeros((k, k), dtype=np.float64)
    given: dict[tuple[int, int], float] = {}
    for pair, value in pair_variances.items():
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"pair keys must be (node id, node id) tuples; got {pair!r}")
        a, b = pair
        for n in (a, b):
            if n not in position:
                raise DesignError(
                    "pair_variances",
                    f"pair {pair!r} names unknown node id {n!r}; "
                    f"the design's nodes are {list(ids)}",
                )
        if a == b:
            raise InfeasibleDesignError(a, f"pair {pair!r} joins the node to itself")
        if not (
            isinstance(value, Real)
            and not isinstance(value, bool)
            and math.isfinite(float(value))
            and float(value) >= 0.0
        ):
            raise InfeasibleDesignError(
                None, f"pair {pair!r} has variance {value!r}; it must be finite and >= 0"
            )
        i, j = sorted((position[a], position[b]))
        if (i, j) in given and given[(i, j)] != float(value):
            raise InfeasibleDesignError(
                None,
                f"pair {pair!r} is given twice with different variances "
                f"{given[(i, j)]!r} and {value!r}",
            )
        given[(i, j)] = float(value)
        w[i, j] = w[j, i] = float(value)
    for n, row in zip(ids, w, strict=True):
        if not np.any(row > 0.0):
            raise InfeasibleDesignError(
                n, f"node {n!r} has no pair partner, so its mask would be zero"
            )
    return Design(ids, w, "pairwise", "explicit")


def cape_design(node_ids: Collection[str], variance: float) -> Design:
    """CAPE zero-sum noise with draw variance τ² = ``variance``: R = τ²(I − 11ᵀ/K).

    Stored as the complete graph with c² = τ²/K (same marginal covariance).
    """
    ids = _normalise_ids(node_ids)
    if not _positive_finite(variance):
        raise InfeasibleDesignError(None, f"CAPE variance {variance!r} must be finite and > 0")
    tau2 = float(variance)
    k = len(ids)
    w = np.full((k, k), tau2 / k, dtype=np.float64)
    np.fill_diagonal(w, 0.0)
    return Design(ids, w, "cape", "cape", cape_variance=tau2)


def _split(design: Design, coalition: Collection[str]) -> tuple[list[int], list[int]]:
    """Honest and colluding positions; validates the coalition's ids."""
    if isinstance(coalition, str):
        raise TypeError(f"coalition must be a collection of node ids, not the string {coalition!r}")
    colluding = {design.index(n) for n in coalition}
    honest = [i for i in range(len(design.node_ids)) if i not in colluding]
    if not honest:
        raise DesignError(
            "coalition", "the coalition contains every node; no honest node is left to protect"
        )
    return honest, sorted(colluding)


def _check_residual(residual_variance: float) -> float:
    if not (
        isinstance(residual_variance, Real)
        and not isinstance(residual_variance, bool)
        and math.isfinite(float(residual_variance))
        and float(residual_variance) >= 0.0
    ):
        raise CalibrationError(
            "residual_variance", residual_variance, "must be a finite number >= 0"
        )
    return float(residual_variance)


def conditional_covariance(
    design: Design, coalition: Collection[str], residual_variance: float = 0.0
) -> tuple[tuple[str, ...], NDArray[np.float64]]:
    """Covariance of the honest nodes' egress noise given what the coalition pools.

    Returns (honest ids, Σ_H). Pairwise: the coalition knows every pair term
    it shares, so Σ_H is the Laplacian of the edges inside the honest set H
    plus σ_res² I. CAPE: the coalition knows its own ê_j and Σê, hence the
    honest sum Σ_{h∈H} ê_h, leaving Σ_H = τ²(I − 11ᵀ/n_H) + σ_res² I. The
    empty coalition gives R + σ_res² I, what the coordinator faces alone.
    """
    honest, _ = _split(design, coalition)
    res = _check_residual(residual_variance)
    n_h = len(honest)
    if design.construction == "cape":
        sigma = design.cape_variance * (np.eye(n_h) - np.full((n_h, n_h), 1.0 / n_h))
    else:
        w = design.pair_variances[np.ix_(honest, honest)]
        sigma = -w.copy()
        np.fill_diagonal(sigma, w.sum(axis=1))
    sigma[np.diag_indices(n_h)] += res
    return tuple(design.node_ids[i] for i in honest), sigma


def remaining_variance(
    design: Design, coalition: Collection[str], residual_variance: float = 0.0
) -> dict[str, float]:
    """Each honest node's noise variance left once the coalition pools everything it knows.

    Pairwise: Σ_{j∉C, j≠h} c_hj² + σ_res². CAPE: τ²(1 − 1/n_H) + σ_res² with
    n_H = K − |C| (the diagonal of :func:`conditional_covariance`).
    """
    ids, sigma = conditional_covariance(design, coalition, residual_variance)
    return {n: float(v) for n, v in zip(ids, np.diag(sigma), strict=True)}
