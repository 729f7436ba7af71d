"""From a privacy policy (ε, δ, Δ, T, construction) to a noise design.

A *policy* states what every single egress must satisfy on its own: an
outsider or reviewer who sees one node's release must face (ε, δ)-DP for a
sensitivity Δ. The analytic Gaussian mechanism (Balle & Wang 2018) turns that
into a per-egress target variance σ_t². The design then spends it:

* the correlated part R (pairwise graph or CAPE) supplies σ_t² − σ_res² on
  each egress, sized so that any T other nodes pooling their secrets still
  leave at least that much (``complete_design`` / ``harary_design``);
  for CAPE, τ² is chosen so that τ²(1 − 1/(K − T)) meets it;
* optional residual noise follows CAPE's split: the aggregate of K nodes must
  itself be (ε, δ)-DP for Δ, so the central variance σ_c² = σ_t² is divided
  as σ_res² = σ_c²/K per node and the K residuals add back to σ_c².

Without residual noise the aggregate is exact (that is the point of zero-sum
noise), and the coordinator, who sees every egress, learns the exact sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from noise.accounting import calibrate_sigma
from noise.designs import (
    Design,
    cape_design,
    complete_design,
    harary_design,
    remaining_variance,
)
from noise.errors import DesignError, InfeasibleDesignError
from noise.residual import cape_residual_variance

__all__ = ["NoisePlan", "plan_noise", "worst_remaining_variance"]


@dataclass(frozen=True)
class NoisePlan:
    """A design together with the residual variance and the target it meets."""

    design: Design
    residual_variance: float
    target_variance: float
    epsilon: float
    delta: float
    sensitivity: float

    @property
    def egress_variance(self) -> float:
        """Smallest per-entry variance any single egress carries (R_kk + σ_res²)."""
        return min(self.design.variance(n) for n in self.design.node_ids) + self.residual_variance


def plan_noise(
    node_ids: Sequence[str],
    *,
    epsilon: float,
    delta: float,
    sensitivity: float,
    construction: Literal["pairwise", "cape"] = "pairwise",
    collusion_threshold: int = 0,
    residual_dp: bool = False,
    graph: Literal["complete", "harary"] = "complete",
    degree: int | None = None,
) -> NoisePlan:
    """Design meeting ``(epsilon, delta)`` per egress for sensitivity ``sensitivity``."""
    ids = sorted(node_ids)
    k = len(ids)
    target = calibrate_sigma(epsilon, delta, sensitivity) ** 2
    residual = cape_residual_variance(target, k) if residual_dp else 0.0
    correlated = target - residual
    if construction == "cape":
        honest = k - collusion_threshold
        if honest < 2:
            raise InfeasibleDesignError(
                None,
                f"CAPE with {k} nodes and collusion threshold {collusion_threshold} leaves "
                f"{honest} honest node(s); at least 2 are needed for any zero-sum noise",
            )
        design = cape_design(ids, correlated / (1.0 - 1.0 / honest))
    elif graph == "harary":
        if degree is None:
            raise DesignError(
                "degree", "graph 'harary' needs a degree (number of pair partners per node)"
            )
        design = harary_design(ids, degree, correlated, collusion_threshold=collusion_threshold)
    else:
        design = complete_design(ids, correlated, collusion_threshold=collusion_threshold)
    return NoisePlan(
        design=design,
        residual_variance=residual,
        target_variance=target,
        epsilon=epsilon,
        delta=delta,
        sensitivity=sensitivity,
    )


def worst_remaining_variance(
    design: Design, node_id: str, coalition_size: int, residual_variance: float = 0.0
) -> float:
    """Least noise variance left on ``node_id``'s egress against any ``coalition_size`` others.

    Pairwise: the coalition learns the pair terms it shares with the node, so
    the worst coalition holds the node's ``coalition_size`` largest c_kj².
    CAPE: every coalition of that size leaves τ²(1 − 1/(K − m)).
    """
    others = [n for n in design.node_ids if n != node_id]
    m = min(max(coalition_size, 0), len(others))
    if design.construction == "cape":
        coalition = others[:m]
    else:
        coalition = sorted(others, key=lambda n: design.pair_std(node_id, n), reverse=True)[:m]
    return remaining_variance(design, coalition, residual_variance)[node_id]
