"""Membership inference never beats the declared bound; the harness itself is sound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulations.attacks import View, likelihood_ratio_scores, membership_attack, observer_view
from simulations.config import AttackParams, ReconstructionParams
from simulations.reconstruction import reconstruction_attack
from simulations.roc import dp_tpr_bound, gdp_tpr_bound, roc_summary
from simulations.schemes import Variant
from simulations.seeding import cell_seed


@pytest.fixture(scope="module")
def attack_rows() -> list[dict[str, object]]:
    params = AttackParams(
        n_nodes=4, n_per_node=60, n_features=3, coalition_sizes=(1, 2), trials=1500
    )
    return membership_attack(params, cell_seed(3, "a" * 64))


def test_every_attack_stays_within_the_declared_bound(attack_rows: list[dict[str, object]]) -> None:
    assert len(attack_rows) == 6 * 6  # variants × (outsider, +1, +2, coordinator, +1, +2)
    assert all(r["within_bound"] == 1 for r in attack_rows)


def test_exact_aggregates_are_found_out_and_noised_egresses_are_not(
    attack_rows: list[dict[str, object]],
) -> None:
    by_key = {
        (r["scheme"], r["construction"], r["observer"], r["coalition_size"]): r for r in attack_rows
    }
    for construction in ("pairwise", "cape"):
        # The coordinator sums zero-sum egresses and sees the node's contribution exactly.
        coordinator = by_key[("zerosum", construction, "coordinator", 0)]
        assert coordinator["tpr_1"] == 1.0 and math.isinf(float(coordinator["mu_declared"]))  # type: ignore[arg-type]
        # One egress is as private as declared: the empirical rate tracks the exact
        # rate for this target, which attains the bound (a subject at a corner of the
        # bounds moves every tensor by exactly its declared sensitivity).
        outsider = by_key[("zerosum", construction, "outsider", 0)]
        declared = float(outsider["mu_declared"])  # type: ignore[arg-type]
        assert float(outsider["mu_target"]) == pytest.approx(declared, rel=1e-12)  # type: ignore[arg-type]
        assert abs(float(outsider["tpr_10"]) - float(outsider["tpr_10_expected"])) < 0.05  # type: ignore[arg-type]
    assert by_key[("none", "-", "outsider", 0)]["auc"] == 1.0
    # Residual noise makes the coordinator's view private again.
    residual = by_key[("zerosum+residual", "cape", "coordinator", 0)]
    assert math.isfinite(float(residual["mu_declared"])) and float(residual["auc"]) < 0.8  # type: ignore[arg-type]


def test_likelihood_ratio_test_reaches_the_gaussian_tradeoff() -> None:
    """With known noise the empirical ROC of T matches Φ(Φ⁻¹(α) + μ_v)."""
    rng = np.random.default_rng(9)

    def outsider_view() -> View:
        return observer_view(
            Variant("independent"),
            "outsider",
            0,
            n_nodes=3,
            collusion_threshold=0,
            trials=20_000,
            size=4,
            rng=rng,
        )

    view = outsider_view()
    signal = np.array([0.5, -0.5, 0.5, 0.5])
    scales = np.ones(4)
    null = likelihood_ratio_scores(view, signal, scales, member=False)
    view2 = outsider_view()
    member = likelihood_ratio_scores(view2, signal, scales, member=True)
    summary = roc_summary(null, member)
    mu = 1.0  # ‖v‖ with unit noise
    assert abs(summary.tpr[1] - gdp_tpr_bound(summary.fpr[1], mu)) < 0.02
    assert abs(summary.auc - 0.7602499389065233) < 0.01  # Φ(1/√2)


def test_bounds() -> None:
    assert gdp_tpr_bound(0.01, 0.0) == pytest.approx(0.01)
    assert gdp_tpr_bound(0.1, math.inf) == 1.0
    assert dp_tpr_bound(0.01, 1.0, 1e-6) == pytest.approx(math.e * 0.01 + 1e-6)
    assert dp_tpr_bound(0.9, 1.0, 0.0) == pytest.approx(1 - math.exp(-1) * 0.1)


def test_reconstruction_is_exact_without_noise_and_prior_level_with_it() -> None:
    rows = reconstruction_attack(ReconstructionParams(targets=40), cell_seed(4, "b" * 64))
    by_key = {(r["scheme"], r["construction"], r["observer"]): r for r in rows}
    assert float(by_key[("none", "-", "outsider")]["rmse_sd"]) < 1e-9  # type: ignore[arg-type]
    for construction in ("pairwise", "cape"):
        egress = by_key[("zerosum", construction, "outsider")]
        prior = float(egress["prior_rmse_sd"])  # type: ignore[arg-type]
        assert float(egress["rmse_sd"]) > 0.95 * prior  # type: ignore[arg-type]
        # The aggregate difference is exact without residual noise...
        assert float(by_key[("zerosum", construction, "coordinator")]["rmse_sd"]) < 1e-9  # type: ignore[arg-type]
        # ...and back at the prior with it.
        residual = by_key[("zerosum+residual", construction, "coordinator")]
        assert float(residual["rmse_sd"]) > 0.95 * prior  # type: ignore[arg-type]
