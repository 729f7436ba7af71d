"""The utility pipeline: exact where it should be, noised where it should be, and repaired."""

from __future__ import annotations

import math

import numpy as np
import pytest

from node.deltab._linalg import pack_symmetric
from noise.accounting import gaussian_mu, privacy_report
from simulations.config import UtilityParams
from simulations.repair import repair_means, repair_sums
from simulations.schemes import (
    CONSTRUCTIONS,
    SCHEMES,
    Variant,
    declared_privacy,
    unit_plan,
    variants,
)
from simulations.seeding import cell_seed, child
from simulations.utility import utility_rep

PARAMS = UtilityParams(n_nodes=4, n_per_node=150, n_features=5, holdout_size=200)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, object]]:
    root = cell_seed(5, "c" * 64)
    result = utility_rep(PARAMS, variants(SCHEMES, CONSTRUCTIONS), child(root, 0), child(root, 1))
    return {Variant(str(r["scheme"]), str(r["construction"])).label: r for r in result}


def test_none_is_the_pooled_fit_and_zerosum_is_bit_identical(
    rows: dict[str, dict[str, object]],
) -> None:
    none = rows["none"]
    assert float(none["param_rel_error"]) < 1e-8  # type: ignore[arg-type]
    assert none["mae_years"] == pytest.approx(none["reference_mae_years"], rel=1e-9)
    for construction in ("pairwise", "cape"):
        zerosum = rows[f"zerosum ({construction})"]
        assert zerosum["mae_years"] == none["mae_years"]
        assert zerosum["param_rel_error"] == none["param_rel_error"]
        assert zerosum["aggregate_noise_var"] == 0.0


def test_noised_schemes_carry_their_aggregate_noise(rows: dict[str, dict[str, object]]) -> None:
    root = cell_seed(6, "d" * 64)
    chosen = variants(("independent", "zerosum+residual"), CONSTRUCTIONS)
    ratios: dict[str, list[float]] = {}
    for rep in range(4):  # 4 × 35 entries: the mean is within ±12 % (1 sd)
        for r in utility_rep(PARAMS, chosen, child(root, 2 * rep), child(root, 2 * rep + 1)):
            label = Variant(str(r["scheme"]), str(r["construction"])).label
            ratios.setdefault(label, []).append(float(r["aggregate_noise_var"]))  # type: ignore[arg-type]
    assert np.mean(ratios["independent"]) == pytest.approx(PARAMS.n_nodes, rel=0.35)
    for construction in ("pairwise", "cape"):
        residual = np.mean(ratios[f"zerosum+residual ({construction})"])
        assert residual == pytest.approx(1.0, rel=0.35)
    for label in ("independent", "zerosum+residual (cape)", "seed_fedavg"):
        assert float(rows[label]["param_rel_error"]) > 1e-3  # type: ignore[arg-type]
    assert all(r["fit_ok"] == 1 for r in rows.values())


def test_declared_privacy_matches_the_accounting_report() -> None:
    k, eps, delta = 5, 0.7, 1e-6
    for construction in ("pairwise", "cape"):
        for residual in (False, True):
            variant = Variant("zerosum+residual" if residual else "zerosum", construction)
            ours = declared_privacy(
                variant,
                n_nodes=k,
                epsilon=eps,
                delta=delta,
                collusion_threshold=1,
                coalition_size=2,
            )
            plan = unit_plan(construction, k, 1, residual)
            # The unit plan's target variance is 1 at sensitivity μ*(1, 1e-6); at
            # sensitivity μ*(ε, δ) the same covariances give the (ε, δ) release.
            sensitivity = gaussian_mu(eps, delta)
            report = privacy_report(
                plan.design,
                residual_variance=plan.residual_variance,
                sensitivity=sensitivity,
                delta=delta,
                coalition_sizes=[2],
            )
            node = plan.design.node_ids[0]
            theirs = {r.observer: r for r in report if r.node_id == node}
            for observer in ("outsider", "coordinator", "coalition"):
                a, b = ours[observer].mu, theirs[observer].mu
                assert (math.isinf(a) and math.isinf(b)) or a == pytest.approx(b, rel=1e-9)


def test_repair_leaves_valid_sums_alone_and_fixes_an_impossible_one() -> None:
    rng = np.random.default_rng(0)
    # Uncentred, pre-scaled values: the means are far from zero.
    x = 0.4 + rng.standard_normal((50, 3)) * 0.2
    y = -0.3 + rng.standard_normal(50) * 0.3
    valid = {
        "n": np.array(50.0),
        "sum_x": x.sum(axis=0),
        "sum_xx": pack_symmetric(x.T @ x),
        "sum_xy": x.T @ y,
        "sum_xy2": x.T @ y**2,
        "sum_y": np.array(y.sum()),
        "sum_y2": np.array(y @ y),
        "sum_y3": np.array(np.sum(y**3)),
        "sum_y4": np.array(np.sum(y**4)),
    }
    repaired, raised = repair_sums(valid)
    assert raised == 0
    for name, value in valid.items():
        np.testing.assert_array_equal(repaired[name], value)
    broken = dict(valid)
    broken["n"] = np.array(-3.0)
    broken["sum_xx"] = pack_symmetric(-np.eye(3))
    repaired, raised = repair_sums(broken)
    assert raised >= 3 and float(repaired["n"]) == 2.0
    full = np.zeros((3, 3))
    full[np.triu_indices(3)] = repaired["sum_xx"]
    full = full + full.T - np.diag(np.diag(full))
    centred = full - np.outer(repaired["sum_x"], repaired["sum_x"]) / 2.0
    assert np.linalg.eigvalsh(centred).min() > 0.0


def test_repair_of_the_means_round_keeps_every_count_positive() -> None:
    noisy = {"count_x": np.array([12.5, -3.0, 0.2]), "sum_x": np.array([1.0, 2.0, -0.5])}
    repaired = repair_means(noisy)
    np.testing.assert_array_equal(repaired["count_x"], [12.5, 1.0, 1.0])
    np.testing.assert_array_equal(repaired["sum_x"], noisy["sum_x"])
