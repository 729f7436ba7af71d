"""The noise schemes the simulations compare, and what each one declares per observer.

Schemes (one release = one round's egress of one node, calibrated to (ε, δ)):

* ``none`` — no noise; the baseline of the exact federated fit.
* ``independent`` — every node adds N(0, σ_t²) on its own, σ_t the per-egress
  target of the analytic Gaussian mechanism (Balle & Wang, ICML 2018). The sum
  of K releases carries K·σ_t².
* ``zerosum`` — correlated masks with 1ᵀR1 = 0 (``noise.policy.plan_noise``,
  pairwise graph Laplacian or CAPE construction): every egress carries at least
  σ_t², the aggregate is exact.
* ``zerosum+residual`` — the same plus CAPE's residual split σ_t²/K per node
  (Imtiaz, Mohammadi & Sarwate, arXiv 1904.10059, 2019), so the aggregate
  carries σ_t² — the central DP level — instead of K·σ_t².
* ``seed_fedavg`` — the deltab DP page's literal path: local fits in a shared
  basis, classic Gaussian noise on the coefficients, N-weighted averaging
  (``simulations.seed_fedavg``).

Privacy per observer (docs/design.md §6): ``outsider`` sees one egress;
``outsider_coalition`` sees one egress and pools the secrets of m other nodes
(the noise left on the egress is ``noise.designs.remaining_variance``);
``coordinator`` sees every egress of the round; ``coalition`` is the
coordinator plus m other nodes pooling their secrets. μ comes from
``noise.accounting.observer_mu`` on the observer's covariance
(``noise.designs.conditional_covariance``), ε from ``gaussian_epsilon``.
The designs built here are symmetric in the nodes (complete graph with equal
targets, or CAPE), so node 0 stands for every node and coalition {1, …, m} for
every coalition of that size — which keeps K = 1000 cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from noise.accounting import gaussian_epsilon, gaussian_mu, observer_mu
from noise.designs import conditional_covariance
from noise.policy import NoisePlan, plan_noise

__all__ = [
    "CONSTRUCTIONS",
    "OBSERVERS",
    "SCHEMES",
    "SchemeObserverPrivacy",
    "Variant",
    "declared_privacy",
    "effective_collusion_threshold",
    "node_ids",
    "unit_plan",
    "variants",
]

SCHEMES = ("none", "independent", "zerosum", "zerosum+residual", "seed_fedavg")
CONSTRUCTIONS = ("pairwise", "cape")
OBSERVERS = ("outsider", "outsider_coalition", "coordinator", "coalition")
NO_CONSTRUCTION = "-"


@dataclass(frozen=True)
class Variant:
    """A scheme together with its construction (``"-"`` for schemes without masks)."""

    scheme: str
    construction: str = NO_CONSTRUCTION

    @property
    def zero_sum(self) -> bool:
        return self.scheme in ("zerosum", "zerosum+residual")

    @property
    def residual(self) -> bool:
        return self.scheme == "zerosum+residual"

    @property
    def label(self) -> str:
        if self.construction == NO_CONSTRUCTION:
            return self.scheme
        return f"{self.scheme} ({self.construction})"


def variants(schemes: tuple[str, ...], constructions: tuple[str, ...]) -> tuple[Variant, ...]:
    """Every scheme, the zero-sum ones once per construction, in a fixed order."""
    for s in schemes:
        if s not in SCHEMES:
            raise ValueError(f"unknown scheme {s!r}; the schemes are {list(SCHEMES)}")
    for c in constructions:
        if c not in CONSTRUCTIONS:
            raise ValueError(
                f"unknown construction {c!r}; the constructions are {list(CONSTRUCTIONS)}"
            )
    out: list[Variant] = []
    for s in SCHEMES:
        if s not in schemes:
            continue
        if s in ("zerosum", "zerosum+residual"):
            out.extend(Variant(s, c) for c in CONSTRUCTIONS if c in constructions)
        else:
            out.append(Variant(s))
    return tuple(out)


def node_ids(n_nodes: int) -> list[str]:
    """Sorted node ids ``n0001`` … (zero-padded, so string order is numeric order)."""
    width = max(4, len(str(n_nodes)))
    return [f"n{i:0{width}d}" for i in range(1, n_nodes + 1)]


def effective_collusion_threshold(construction: str, n_nodes: int, requested: int) -> int:
    """The largest collusion threshold ≤ ``requested`` that the design can meet with K nodes.

    Pairwise complete graph: T ≤ K − 2 (one honest partner must remain); CAPE:
    K − T ≥ 2 honest nodes, the same bound.
    """
    del construction  # both constructions share the bound T ≤ K − 2
    return max(0, min(requested, n_nodes - 2))


@lru_cache(maxsize=256)
def unit_plan(
    construction: str, n_nodes: int, collusion_threshold: int, residual: bool
) -> NoisePlan:
    """``plan_noise`` at unit sensitivity and μ* = 1 (target variance 1).

    Every variance of the plan for (ε, δ) is this plan's divided by
    μ*(ε, δ)², so one plan per (construction, K, T, residual) serves the sweep.
    """
    return plan_noise(
        node_ids(n_nodes),
        epsilon=_UNIT_EPSILON,
        delta=_UNIT_DELTA,
        sensitivity=_UNIT_MU,
        construction="cape" if construction == "cape" else "pairwise",
        collusion_threshold=collusion_threshold,
        residual_dp=residual,
    )


# (ε, δ) whose μ* is used to normalise the unit plan; any pair works.
_UNIT_EPSILON = 1.0
_UNIT_DELTA = 1e-6
_UNIT_MU = gaussian_mu(_UNIT_EPSILON, _UNIT_DELTA)


@dataclass(frozen=True)
class SchemeObserverPrivacy:
    """μ and ε at δ of one release, as one observer class faces it."""

    observer: str
    coalition_size: int
    mu: float
    epsilon: float


@lru_cache(maxsize=1024)
def _unit_mus(
    construction: str, n_nodes: int, collusion_threshold: int, residual: bool, coalition: int
) -> tuple[float, float, float, float]:
    """μ of node 0 per observer (order of ``OBSERVERS``) at the unit plan's μ*."""
    plan = unit_plan(construction, n_nodes, collusion_threshold, residual)
    design = plan.design
    res = plan.residual_variance
    outsider = observer_mu(np.array([[design.variance(design.node_ids[0]) + res]]), 0, _UNIT_MU)
    full = design.covariance()
    full[np.diag_indices(n_nodes)] += res
    coordinator = observer_mu(full, 0, _UNIT_MU)
    m = min(coalition, n_nodes - 1)
    honest, sigma = conditional_covariance(design, design.node_ids[1 : 1 + m], res)
    position = honest.index(design.node_ids[0])
    egress_left = observer_mu(sigma[position : position + 1, position : position + 1], 0, _UNIT_MU)
    colluded = observer_mu(sigma, position, _UNIT_MU)
    return outsider, egress_left, coordinator, colluded


def declared_privacy(
    variant: Variant,
    *,
    n_nodes: int,
    epsilon: float,
    delta: float,
    collusion_threshold: int,
    coalition_size: int,
    seed_fedavg_tensors: int = 5,
) -> dict[str, SchemeObserverPrivacy]:
    """Per observer class, the (μ, ε) one release of ``variant`` is calibrated to give.

    ``none`` gives μ = ε = ∞. ``independent``: every observer faces the node's
    own N(0, σ_t²), μ = μ*(ε, δ). Zero-sum schemes: the plan's covariances.
    ``seed_fedavg`` reports the page's own declaration — ε per coefficient
    tensor, composed by basic composition over ``seed_fedavg_tensors`` tensors
    (its sensitivity is a heuristic, not a proven bound; μ is NaN).
    """
    m = min(coalition_size, n_nodes - 1)
    if variant.scheme == "none":
        mus: tuple[float, ...] = (math.inf,) * len(OBSERVERS)
    elif variant.scheme == "independent":
        mus = (gaussian_mu(epsilon, delta),) * len(OBSERVERS)
    elif variant.scheme == "seed_fedavg":
        total = epsilon * seed_fedavg_tensors
        return {
            name: SchemeObserverPrivacy(
                name, m if name.endswith("coalition") else 0, math.nan, total
            )
            for name in OBSERVERS
        }
    else:
        threshold = effective_collusion_threshold(
            variant.construction, n_nodes, collusion_threshold
        )
        unit = _unit_mus(variant.construction, n_nodes, threshold, variant.residual, m)
        ratio = gaussian_mu(epsilon, delta) / _UNIT_MU
        mus = tuple(u * ratio for u in unit)
    return {
        name: SchemeObserverPrivacy(
            name, m if name.endswith("coalition") else 0, mu, gaussian_epsilon(mu, delta)
        )
        for name, mu in zip(OBSERVERS, mus, strict=True)
    }
