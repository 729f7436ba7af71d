"""Gaussian DP accounting: exact tradeoff, calibration round trips, per-observer report."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import norm

from noise import accounting
from noise.accounting import (
    ObserverPrivacy,
    calibrate_sigma,
    compose_mu,
    epsilon_for_sigma,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu,
    observer_mu,
    privacy_report,
)
from noise.designs import (
    cape_design,
    complete_design,
    conditional_covariance,
    explicit_design,
    harary_design,
)
from noise.errors import CalibrationError

# δ(ε; μ) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), evaluated with 60-digit arithmetic.
_KNOWN_DELTAS = [
    (1.0, 0.0, 0.38292492254802621),
    (1.0, 0.5, 0.23842170813487663),
    (1.0, 4.5, 5.8676896497695565e-6),
    (0.1, 0.05, 0.020267457137435374),
    (0.1, 0.5, 6.8565824558387371e-9),
    (0.01, 0.05, 5.4814402007468726e-10),
    (0.5, 10.0, 9.8551206108501659e-89),
    (2.0, 30.0, 9.6621066829751802e-46),
    (3.0, 60.0, 1.4338597021611082e-77),
    (5.0, 20.0, 0.047322964188519659),
    (10.0, 400.0, 2.4969886689126536e-269),
    (20.0, 250.0, 0.0054321595538071977),
    (50.0, 1400.0, 0.0012663079870596574),
    (50.0, 1500.0, 2.5962923508245379e-7),
]


@pytest.mark.parametrize(("mu", "epsilon", "expected"), _KNOWN_DELTAS)
def test_gaussian_delta_known_answers(mu: float, epsilon: float, expected: float) -> None:
    assert gaussian_delta(mu, epsilon) == pytest.approx(expected, rel=1e-11)


def test_gaussian_delta_edges() -> None:
    assert gaussian_delta(0.0, 1.0) == 0.0
    assert gaussian_delta(math.inf, 1.0) == 1.0
    assert gaussian_delta(2.0, math.inf) == 0.0
    assert gaussian_delta(50.0, 500.0) == 1.0  # δ within 1e-50 of 1
    assert gaussian_delta(0.01, 500.0) == 0.0  # underflows quietly, no warning
    # far below what doubles resolve: log Φ overflows, or its two terms round together
    assert gaussian_delta(1e-200, 1.0) == 0.0
    assert gaussian_delta(1e-4, 10.0) == 0.0
    # at ε = 0 the tradeoff is the total variation 2Φ(μ/2) − 1
    assert gaussian_delta(0.7, 0.0) == pytest.approx(2 * norm.cdf(0.35) - 1, rel=1e-14)


def test_gaussian_delta_is_monotone() -> None:
    eps = np.linspace(0.0, 40.0, 81)
    for mu in (0.05, 0.5, 1.0, 3.0, 8.0):
        deltas = [gaussian_delta(mu, e) for e in eps]
        assert all(a >= b for a, b in itertools.pairwise(deltas))
    mus = np.geomspace(0.01, 40.0, 60)
    for e in (0.1, 1.0, 5.0):
        deltas = [gaussian_delta(float(m), e) for m in mus]
        assert all(a <= b for a, b in itertools.pairwise(deltas))


@pytest.mark.parametrize("mu", [0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-6, 1e-10, 1e-30])
def test_gaussian_epsilon_solves_the_tradeoff(mu: float, delta: float) -> None:
    eps = gaussian_epsilon(mu, delta)
    if eps == 0.0:
        assert gaussian_delta(mu, 0.0) <= delta
    else:
        assert gaussian_delta(mu, eps) == pytest.approx(delta, rel=1e-9)


def test_gaussian_epsilon_edges() -> None:
    assert gaussian_epsilon(math.inf, 1e-5) == math.inf
    assert gaussian_epsilon(0.0, 1e-5) == 0.0
    # δ(0; μ) = 2Φ(μ/2) − 1 ≈ 0.4μ: tiny μ meets δ = 1e-3 at ε = 0
    assert gaussian_epsilon(1e-4, 1e-3) == 0.0
    assert gaussian_epsilon(1.0, 1e-5) == pytest.approx(4.3771780956812, rel=1e-12)


_SIGMAS = [0.05, 0.2, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0]
_DELTAS = [1e-3, 1e-5, 1e-6, 1e-10]
_SENSITIVITIES = [0.1, 1.0, 7.0]


def test_round_trip_sigma_to_epsilon_to_sigma() -> None:
    checked = 0
    for sigma, delta, sens in itertools.product(_SIGMAS, _DELTAS, _SENSITIVITIES):
        eps = epsilon_for_sigma(sigma, delta, sens)
        if eps == 0.0:  # so much noise that (0, δ)-DP already holds: nothing to invert
            assert gaussian_delta(sens / sigma, 0.0) <= delta
            continue
        assert calibrate_sigma(eps, delta, sens) == pytest.approx(sigma, rel=1e-9)
        checked += 1
    assert checked >= 90


def test_round_trip_epsilon_to_sigma_to_epsilon() -> None:
    epsilons = [1e-3, 0.01, 0.1, 0.5, 1.0, 2.0, 8.0, 50.0, 200.0, 500.0]
    for eps, delta, sens in itertools.product(epsilons, _DELTAS, _SENSITIVITIES):
        sigma = calibrate_sigma(eps, delta, sens)
        assert epsilon_for_sigma(sigma, delta, sens) == pytest.approx(eps, rel=1e-9)


def test_calibration_is_monotone() -> None:
    epsilons = np.geomspace(0.01, 100.0, 40)
    sigmas = [calibrate_sigma(float(e), 1e-5, 1.0) for e in epsilons]
    assert all(a > b for a, b in itertools.pairwise(sigmas))
    deltas = np.geomspace(1e-12, 0.5, 40)
    sigmas = [calibrate_sigma(1.0, float(d), 1.0) for d in deltas]
    assert all(a > b for a, b in itertools.pairwise(sigmas))
    assert calibrate_sigma(1.0, 1e-5, 3.0) == pytest.approx(3 * calibrate_sigma(1.0, 1e-5, 1.0))


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.3, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8])
def test_analytic_sigma_beats_classic_formula(epsilon: float, delta: float) -> None:
    classic = math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    analytic = calibrate_sigma(epsilon, delta, 1.0)
    assert analytic < classic
    # and is genuinely (ε, δ)-DP: the exact tradeoff at σ is exactly δ
    assert gaussian_delta(1.0 / analytic, epsilon) == pytest.approx(delta, rel=1e-9)


def test_gaussian_mu_is_inverse_of_the_tradeoff() -> None:
    mu = gaussian_mu(2.0, 1e-6)
    assert gaussian_delta(mu, 2.0) == pytest.approx(1e-6, rel=1e-12)
    assert gaussian_epsilon(mu, 1e-6) == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: calibrate_sigma(0.0, 1e-5, 1.0), "epsilon"),
        (lambda: calibrate_sigma(-1.0, 1e-5, 1.0), "epsilon"),
        (lambda: calibrate_sigma(math.inf, 1e-5, 1.0), "epsilon"),
        (lambda: calibrate_sigma(math.nan, 1e-5, 1.0), "epsilon"),
        (lambda: calibrate_sigma(1.0, 0.0, 1.0), "delta"),
        (lambda: calibrate_sigma(1.0, 1.0, 1.0), "delta"),
        (lambda: calibrate_sigma(1.0, 1e-5, 0.0), "sensitivity"),
        (lambda: calibrate_sigma(1.0, 1e-5, -2.0), "sensitivity"),
        (lambda: calibrate_sigma(1.0, 1e-5, "1"), "sensitivity"),  # type: ignore[arg-type]
        (lambda: calibrate_sigma(True, 1e-5, 1.0), "epsilon"),
        (lambda: epsilon_for_sigma(0.0, 1e-5, 1.0), "sigma"),
        (lambda: epsilon_for_sigma(-1.0, 1e-5, 1.0), "sigma"),
        (lambda: epsilon_for_sigma(1.0, 2.0, 1.0), "delta"),
        (lambda: epsilon_for_sigma(1.0, 1e-5, math.inf), "sensitivity"),
        (lambda: gaussian_epsilon(-1.0, 1e-5), "mu"),
        (lambda: gaussian_epsilon(math.nan, 1e-5), "mu"),
        (lambda: gaussian_delta(-1.0, 1.0), "mu"),
        (lambda: gaussian_delta(1.0, -1.0), "epsilon"),
        (lambda: compose_mu([1.0, -1.0]), "mus[1]"),
        (lambda: observer_mu(np.eye(2), 0, 0.0), "sensitivity"),
    ],
)
def test_bad_parameters_name_themselves(call: object, parameter: str) -> None:
    with pytest.raises(CalibrationError) as info:
        call()  # type: ignore[operator]
    assert info.value.parameter == parameter
    assert str(info.value).startswith(f"{parameter}=")


def test_compose_mu() -> None:
    assert compose_mu([]) == 0.0
    assert compose_mu([3.0, 4.0]) == 5.0
    assert compose_mu([1.0] * 100) == pytest.approx(10.0, rel=1e-15)
    assert compose_mu([1.0, math.inf]) == math.inf
    assert compose_mu(iter([0.5, 0.5, 0.5, 0.5])) == pytest.approx(1.0)


# --- observers of correlated noise ------------------------------------------


def test_observer_mu_of_independent_noise() -> None:
    sigma = np.diag([4.0, 9.0])
    assert observer_mu(sigma, 0, 1.0) == pytest.approx(0.5, rel=1e-15)
    assert observer_mu(sigma, 1, 3.0) == pytest.approx(1.0, rel=1e-15)


def test_observer_mu_infinite_outside_range() -> None:
    laplacian = complete_design(["a", "b", "c"], 1.0).covariance()
    for i in range(3):
        assert observer_mu(laplacian, i, 1.0) == math.inf
    assert observer_mu(np.zeros((2, 2)), 0, 1.0) == math.inf
    # a degenerate but in-range direction stays finite
    sigma = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    assert observer_mu(sigma, 0, 1.0) == pytest.approx(1.0, rel=1e-12)
    assert observer_mu(sigma, 1, 1.0) == math.inf


def test_observer_mu_matches_closed_form_for_complete_graph_plus_residual() -> None:
    k, c2, res = 6, 0.3, 0.05
    design = complete_design([f"n{i}" for i in range(k)], c2 * (k - 1))
    sigma = design.covariance() + res * np.eye(k)
    # e_i = 1/K + (e_i − 1/K): eigenvalue σ_res² on 1, K c² + σ_res² on 1⊥
    q = (1 / k) / res + (1 - 1 / k) / (k * c2 + res)
    assert observer_mu(sigma, 2, 2.0) == pytest.approx(2.0 * math.sqrt(q), rel=1e-12)


def test_observer_mu_validation() -> None:
    with pytest.raises(ValueError, match="square matrix"):
        observer_mu(np.ones(3), 0, 1.0)
    with pytest.raises(ValueError, match="square matrix"):
        observer_mu(np.ones((2, 3)), 0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        observer_mu(np.array([[math.nan]]), 0, 1.0)
    with pytest.raises(ValueError, match=r"index must be an integer in \[0, 2\); got 2"):
        observer_mu(np.eye(2), 2, 1.0)
    with pytest.raises(ValueError, match="index"):
        observer_mu(np.eye(2), True, 1.0)


def _rows(report: list[ObserverPrivacy], node: str) -> dict[tuple[str, int], ObserverPrivacy]:
    return {(r.observer, r.coalition_size): r for r in report if r.node_id == node}


def test_privacy_report_pairwise_closed_forms() -> None:
    k, target, res, sens, delta = 5, 2.0, 0.1, 1.5, 1e-6
    ids = [f"n{i}" for i in range(k)]
    design = complete_design(ids, target)
    c2 = target / (k - 1)
    report = privacy_report(
        design, residual_variance=res, sensitivity=sens, delta=delta, coalition_sizes=[2, 4]
    )
    assert len(report) == k * 4
    assert [r.observer for r in report[:4]] == ["outsider", "coordinator", "coalition", "coalition"]
    rows = _rows(report, "n3")
    outsider = rows[("outsider", 0)]
    assert outsider.noise_std == pytest.approx(math.sqrt(target + res), rel=1e-14)
    assert outsider.mu == pytest.approx(sens / math.sqrt(target + res), rel=1e-14)
    assert outsider.epsilon == pytest.approx(gaussian_epsilon(outsider.mu, delta), rel=1e-14)
    assert outsider.coalition == ()
    for size, row in ((0, rows[("coordinator", 0)]), (2, rows[("coalition", 2)])):
        n_h = k - size
        q = (1 / n_h) / res + (1 - 1 / n_h) / (n_h * c2 + res)
        assert row.mu == pytest.approx(sens * math.sqrt(q), rel=1e-12)
        assert row.noise_std == pytest.approx(1 / math.sqrt(q), rel=1e-12)
        assert row.delta == delta
        assert row.rounds == 1
    assert rows[("coalition", 4)].mu == pytest.approx(sens / math.sqrt(res), rel=1e-12)
    assert rows[("coalition", 4)].coalition == ("n0", "n1", "n2", "n4")
    # symmetric design: ties keep the first coalition in sorted order
    assert rows[("coalition", 2)].coalition == ("n0", "n1")
    # observers with more knowledge learn more
    assert outsider.mu < rows[("coordinator", 0)].mu < rows[("coalition", 2)].mu


def test_privacy_report_without_residual_coordinator_learns_the_sum() -> None:
    design = harary_design([f"n{i}" for i in range(6)], 2, 1.0)
    report = privacy_report(design, residual_variance=0.0, sensitivity=1.0, delta=1e-5)
    for row in report:
        if row.observer == "coordinator":
            assert row.mu == math.inf
            assert row.epsilon == math.inf
            assert row.noise_std == 0.0
        else:
            assert row.mu == pytest.approx(1.0, rel=1e-14)


def test_privacy_report_coalition_without_residual_is_infinite() -> None:
    design = complete_design(["a", "b", "c", "d"], 1.0, collusion_threshold=1)
    report = privacy_report(
        design, residual_variance=0.0, sensitivity=1.0, delta=1e-5, coalition_sizes=[2]
    )
    row = _rows(report, "c")[("coalition", 2)]
    assert row.mu == math.inf
    assert row.epsilon == math.inf
    assert row.coalition == ("a", "b")


def test_privacy_report_composes_rounds() -> None:
    design = cape_design(["a", "b", "c"], 1.0)
    one = privacy_report(design, residual_variance=0.2, sensitivity=1.0, delta=1e-5)
    many = privacy_report(design, residual_variance=0.2, sensitivity=1.0, delta=1e-5, rounds=9)
    for a, b in zip(one, many, strict=True):
        assert b.mu == pytest.approx(3 * a.mu, rel=1e-14)
        assert b.noise_std == a.noise_std
        assert b.rounds == 9
        assert b.epsilon == pytest.approx(gaussian_epsilon(b.mu, 1e-5), rel=1e-14)
        assert b.epsilon > a.epsilon


def test_privacy_report_cape_coalition_matches_conditional_formula() -> None:
    k, tau2, res = 6, 1.0, 1.0 / 6
    design = cape_design([f"n{i}" for i in range(k)], tau2)
    report = privacy_report(
        design, residual_variance=res, sensitivity=1.0, delta=1e-5, coalition_sizes=[3]
    )
    row = _rows(report, "n5")[("coalition", 3)]
    n_h = k - 3
    q = (1 / n_h) / res + (1 - 1 / n_h) / (tau2 + res)
    assert row.mu == pytest.approx(math.sqrt(q), rel=1e-12)


def test_privacy_report_finds_the_worst_coalition() -> None:
    # node a's noise comes mostly from its pair with b: b is the worst colluder
    design = explicit_design(
        ["a", "b", "c", "d"],
        {("a", "b"): 10.0, ("a", "c"): 1.0, ("a", "d"): 1.0, ("b", "c"): 1.0, ("c", "d"): 1.0},
    )
    report = privacy_report(
        design, residual_variance=0.5, sensitivity=1.0, delta=1e-5, coalition_sizes=[1]
    )
    row = _rows(report, "a")[("coalition", 1)]
    assert row.coalition == ("b",)
    for other in ("c", "d"):
        honest, sigma = conditional_covariance(design, [other], 0.5)
        assert observer_mu(sigma, honest.index("a"), 1.0) < row.mu


def test_greedy_search_for_large_federations() -> None:
    k = 16  # C(15, 5) = 3003 > ENUMERATION_LIMIT coalitions of 5: greedy search
    ids = [f"n{i:02d}" for i in range(k)]
    targets = {n: 1.0 + i for i, n in enumerate(ids)}
    design = complete_design(ids, targets)
    report = privacy_report(
        design, residual_variance=0.1, sensitivity=1.0, delta=1e-5, coalition_sizes=[5]
    )
    row = _rows(report, "n00")[("coalition", 5)]
    assert len(row.coalition) == 5
    assert "n00" not in row.coalition
    # n00's pairs with high-target nodes carry the most noise; greedy takes those first
    assert row.coalition == ("n11", "n12", "n13", "n14", "n15")


def test_greedy_agrees_with_enumeration_on_small_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [f"n{i}" for i in range(6)]
    designs = [
        complete_design(ids, {n: 1.0 + 2 * i for i, n in enumerate(ids)}, collusion_threshold=1),
        cape_design(ids, 2.0),
    ]
    for design in designs:
        kwargs = {"residual_variance": 0.3, "sensitivity": 1.0, "delta": 1e-5}
        exact = privacy_report(design, coalition_sizes=[1, 2, 3], **kwargs)  # type: ignore[arg-type]
        monkeypatch.setattr(accounting, "ENUMERATION_LIMIT", 0)
        greedy = privacy_report(design, coalition_sizes=[1, 2, 3], **kwargs)  # type: ignore[arg-type]
        monkeypatch.undo()
        for e, g in zip(exact, greedy, strict=True):
            assert g.mu <= e.mu * (1 + 1e-12)
            assert g.mu == pytest.approx(e.mu, rel=1e-9)


def test_privacy_report_per_node_sensitivity() -> None:
    design = complete_design(["a", "b", "c"], 1.0)
    report = privacy_report(
        design, residual_variance=0.1, sensitivity={"a": 1.0, "b": 2.0, "c": 4.0}, delta=1e-5
    )
    outsider = {r.node_id: r for r in report if r.observer == "outsider"}
    assert outsider["b"].mu == pytest.approx(2 * outsider["a"].mu, rel=1e-14)
    assert outsider["c"].mu == pytest.approx(4 * outsider["a"].mu, rel=1e-14)
    assert outsider["c"].noise_std == outsider["a"].noise_std


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"residual_variance": -0.1}, "residual_variance"),
        ({"residual_variance": math.inf}, "residual_variance"),
        ({"residual_variance": math.nan}, "residual_variance"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.5}, "delta"),
        ({"sensitivity": 0.0}, "sensitivity"),
        ({"sensitivity": {"a": 1.0, "b": -1.0, "c": 1.0}}, "sensitivity['b']"),
        ({"sensitivity": {"a": 1.0, "b": 1.0}}, "sensitivity['c']"),
        ({"rounds": 0}, "rounds"),
        ({"rounds": 2.0}, "rounds"),
        ({"coalition_sizes": [0]}, "coalition_sizes"),
        ({"coalition_sizes": [3]}, "coalition_sizes"),
        ({"coalition_sizes": [True]}, "coalition_sizes"),
    ],
)
def test_privacy_report_validation(kwargs: dict[str, object], parameter: str) -> None:
    design = complete_design(["a", "b", "c"], 1.0)
    arguments: dict[str, object] = {"residual_variance": 0.1, "sensitivity": 1.0, "delta": 1e-5}
    arguments.update(kwargs)
    with pytest.raises(CalibrationError) as info:
        privacy_report(design, **arguments)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


def test_privacy_report_rejects_unknown_sensitivity_node() -> None:
    design = complete_design(["a", "b"], 1.0)
    with pytest.raises(ValueError, match="unknown node id 'z'"):
        privacy_report(
            design,
            residual_variance=0.1,
            sensitivity={"a": 1.0, "b": 1.0, "z": 1.0},
            delta=1e-5,
        )


def test_the_root_finder_converges_to_the_tolerance_and_refuses_an_unbracketed_interval() -> None:
    root = accounting._root(lambda x: x**3 - 2.0, 0.0, 4.0)
    assert abs(root - 2.0 ** (1.0 / 3.0)) <= 4 * np.finfo(np.float64).eps * root
    assert accounting._root(lambda x: x - 1.0, 1.0, 3.0) == 1.0  # a root at an end
    with pytest.raises(ArithmeticError, match="same sign"):
        accounting._root(lambda x: x * x + 1.0, -1.0, 1.0)


@pytest.mark.parametrize(("mu", "delta"), [(0.5, 1e-5), (1.0, 1e-8), (3.0, 1e-12), (20.0, 1e-50)])
def test_epsilon_is_the_root_of_the_exact_tradeoff(mu: float, delta: float) -> None:
    """The ε found solves δ(ε; μ) = δ: checked in 300-bit arithmetic."""
    import mpmath

    epsilon = gaussian_epsilon(mu, delta)
    with mpmath.workprec(300):
        m, e = mpmath.mpf(mu), mpmath.mpf(epsilon)
        exact = mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)
        assert abs(float(exact) / delta - 1.0) < 1e-12
