"""Policies turn into designs that meet the per-egress target, also against coalitions."""

from __future__ import annotations

import math

import pytest

from noise.accounting import calibrate_sigma, epsilon_for_sigma
from noise.errors import InfeasibleDesignError
from noise.policy import plan_noise, worst_remaining_variance

IDS = [f"n{i}" for i in range(6)]


@pytest.mark.parametrize("construction", ["pairwise", "cape"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("threshold", [0, 1, 3])
def test_every_egress_meets_the_target_against_t_colluders(
    construction: str, residual: bool, threshold: int
) -> None:
    plan = plan_noise(
        IDS,
        epsilon=1.0,
        delta=1e-6,
        sensitivity=2.0,
        construction=construction,  # type: ignore[arg-type]
        collusion_threshold=threshold,
        residual_dp=residual,
    )
    target = calibrate_sigma(1.0, 1e-6, 2.0) ** 2
    assert plan.target_variance == pytest.approx(target)
    for node in IDS:
        left = worst_remaining_variance(plan.design, node, threshold, plan.residual_variance)
        assert left >= target * (1 - 1e-12)
        eps = epsilon_for_sigma(math.sqrt(left), 1e-6, 2.0)
        assert eps <= 1.0 + 1e-9
    if residual:
        # CAPE split: K residuals add back to the central level.
        assert plan.residual_variance * len(IDS) == pytest.approx(target)
    else:
        assert plan.residual_variance == 0.0
    assert plan.egress_variance >= target * (1 - 1e-12)


def test_harary_policy_and_its_errors() -> None:
    ids = [f"n{i:02d}" for i in range(12)]
    plan = plan_noise(
        ids,
        epsilon=1.0,
        delta=1e-6,
        sensitivity=1.0,
        graph="harary",
        degree=4,
        collusion_threshold=2,
    )
    assert all(len(plan.design.neighbours(n)) == 4 for n in ids)
    with pytest.raises(ValueError, match="needs a degree"):
        plan_noise(ids, epsilon=1.0, delta=1e-6, sensitivity=1.0, graph="harary")


def test_cape_needs_two_honest_nodes() -> None:
    with pytest.raises(InfeasibleDesignError, match="leaves 1 honest node"):
        plan_noise(
            IDS[:3],
            epsilon=1.0,
            delta=1e-6,
            sensitivity=1.0,
            construction="cape",
            collusion_threshold=2,
        )
