"""Sufficient statistics: federated sums reproduce the pooled fit exactly.

The tests of the centred two-round plan (moments, scatter) live here; the
one-release plan's own layout, sensitivities and fixed-point behaviour are
tested in ``test_sums``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from node.deltab import MODELS, Bounds, BrainAgeModel
from node.deltab.plan import ROUNDS, PlanSettings, run_in_process
from node.deltab.stats import (
    combine,
    count_clipped,
    expected_shapes,
    local_moments,
    local_scatter,
    model_from_scatter,
    round_sensitivity,
    sensitivity,
    standardisation_from_moments,
)
from tests.support.cohorts import Cohort, CohortFactory

FloatArray = NDArray[np.float64]

REDUCTIONS: list[dict[str, Any]] = [
    {"n_components": 1},
    {"n_components": 4},
    {"feature_proportion": 0.3},
    {"feature_proportion": 1.0},
    {"variance_explained": 0.6},
    {"variance_explained": 0.95},
    {"kaiser_guttman": True},
    {},
]


Parts = list[NDArray[np.intp]]


def _split(n: int, n_nodes: int, rng: np.random.Generator, by_age: FloatArray | None) -> Parts:
    order = np.argsort(by_age, kind="stable") if by_age is not None else rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), size=n_nodes - 1, replace=False))
    return np.split(order, cuts)


def _cohorts(data: Cohort, parts: Parts) -> list[tuple[FloatArray, FloatArray, FloatArray | None]]:
    return [
        (data.X[i], data.age[i], None if data.confounds is None else data.confounds[i])
        for i in parts
    ]


@dataclass(frozen=True)
class Scenario:
    seed: int
    n: int
    p: int
    n_nodes: int
    model: str
    reduction: dict[str, Any]
    nan_policy: str
    with_nan: bool
    n_confounds: int
    by_age: bool
    centred: bool


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    return Scenario(
        seed=draw(st.integers(0, 10_000)),
        n=draw(st.integers(60, 160)),
        p=draw(st.integers(3, 24)),
        n_nodes=draw(st.integers(2, 10)),
        model=draw(st.sampled_from(MODELS)),
        reduction=draw(st.sampled_from(REDUCTIONS)),
        nan_policy=draw(st.sampled_from(["mean", "drop"])),
        with_nan=draw(st.booleans()),
        n_confounds=draw(st.sampled_from([0, 0, 2])),
        by_age=draw(st.booleans()),
        centred=draw(st.booleans()),
    )


@settings(max_examples=100, deadline=None)
@given(scenario=scenarios())
def test_federated_fit_equals_pooled_fit(cohort_factory: CohortFactory, scenario: Scenario) -> None:
    """Random cohorts split at random (or by age: non-IID) into 2-10 nodes, either plan."""
    sc = scenario
    data = cohort_factory(
        sc.seed, n=sc.n, p=sc.p, n_confounds=sc.n_confounds, nan_fraction=0.02 * sc.with_nan
    )
    rng = np.random.default_rng(sc.seed)
    parts = _split(sc.n, sc.n_nodes, rng, data.age if sc.by_age else None)
    pooled_model = BrainAgeModel(sc.model, nan_policy=sc.nan_policy, **sc.reduction)
    plan = PlanSettings(model=sc.model, nan_policy=sc.nan_policy, **sc.reduction)
    rounds = ROUNDS if sc.centred else None
    try:
        pooled = pooled_model.fit(data.X, data.age, data.confounds)
    except ValueError as refusal:
        event("both refused")
        with pytest.raises(ValueError) as federated_refusal:
            run_in_process(_cohorts(data, parts), plan, rounds=rounds)
        assert str(federated_refusal.value) == str(refusal)
        return
    event("compared")
    federated = run_in_process(_cohorts(data, parts), plan, rounds=rounds)
    assert federated.n_components_ == pooled.n_components_
    complete = ~np.isnan(data.X).any(axis=1)
    X, age = data.X[complete], data.age[complete]
    confounds = None if data.confounds is None else data.confounds[complete]
    expected = pooled.predict_age(X, age, confounds)
    # Relative to the largest prediction: a predicted age near 0 has no digits to compare.
    got = federated.predict_age(X, age, confounds)
    assert np.max(np.abs(got - expected)) <= 1e-9 * np.max(np.abs(expected))


@pytest.mark.parametrize("model", MODELS)
def test_federated_fit_of_wide_data_equals_pooled_fit(
    cohort_factory: CohortFactory, model: str
) -> None:
    """Pooled fit through the N×N Gram matrix, federated through the P×P scatter."""
    data = cohort_factory(50, n=70, p=120)
    parts = np.array_split(np.random.default_rng(1).permutation(70), 4)
    pooled = BrainAgeModel(model, n_components=10, nan_policy="mean").fit(data.X, data.age)
    federated = run_in_process(_cohorts(data, parts), PlanSettings(model=model, n_components=10))
    np.testing.assert_allclose(
        federated.predict_age(data.X, data.age), pooled.predict_age(data.X, data.age), rtol=1e-9
    )


def test_node_dropping_out_between_rounds_leaves_the_survivors_model_exact(
    cohort_factory: CohortFactory,
) -> None:
    data = cohort_factory(51, n=240, p=15, nan_fraction=0.02)
    parts = np.array_split(np.arange(240), 3)
    moments = combine([local_moments(data.X[i], data.age[i]) for i in parts])
    standardisation = standardisation_from_moments(moments)
    survivors = parts[:2]
    scatter = combine([local_scatter(data.X[i], data.age[i], standardisation) for i in survivors])
    federated = model_from_scatter(
        scatter, standardisation, model="unbiased_quadratic", n_components=5
    )
    rows = np.concatenate(survivors)
    # The survivors' model imputes with the three-node means, so compare on complete rows.
    complete = rows[~np.isnan(data.X[rows]).any(axis=1)]
    X, age = data.X[complete], data.age[complete]
    pooled = BrainAgeModel("unbiased_quadratic", n_components=5, nan_policy="drop").fit(X, age)
    fed_complete = model_from_scatter(
        combine(
            [
                local_scatter(data.X[i], data.age[i], standardisation, nan_policy="drop")
                for i in survivors
            ]
        ),
        standardisation,
        model="unbiased_quadratic",
        n_components=5,
        nan_policy="drop",
    )
    np.testing.assert_allclose(
        fed_complete.predict_age(X, age), pooled.predict_age(X, age), rtol=1e-9
    )
    assert federated.n_subjects_ == rows.size


# -- tensors --------------------------------------------------------------------------


@pytest.mark.parametrize("n_confounds", [0, 3])
def test_tensors_have_the_declared_names_and_shapes(
    cohort_factory: CohortFactory, n_confounds: int
) -> None:
    data = cohort_factory(52, n=50, p=7, n_confounds=n_confounds)
    moments = local_moments(data.X, data.age, confounds=data.confounds)
    standardisation = standardisation_from_moments(moments)
    scatter = local_scatter(data.X, data.age, standardisation, confounds=data.confounds)
    for name, tensors in (("moments", moments), ("scatter", scatter)):
        shapes = expected_shapes(name, 7, n_confounds)
        assert {k: v.shape for k, v in tensors.items()} == shapes
        assert all(v.dtype == np.float64 for v in tensors.values())
    assert expected_shapes("scatter", 7)["sum_xx"] == (28,)


def test_combine_is_an_elementwise_sum_and_checks_its_inputs() -> None:
    a = {"n": np.array(2.0), "sum_x": np.array([1.0, 2.0])}
    b = {"n": np.array(3.0), "sum_x": np.array([0.5, -1.0])}
    total = combine([a, b])
    assert float(total["n"]) == 5.0
    np.testing.assert_array_equal(total["sum_x"], [1.5, 1.0])
    np.testing.assert_array_equal(a["sum_x"], [1.0, 2.0])
    with pytest.raises(ValueError, match="at least one"):
        combine([])
    with pytest.raises(ValueError, match="contribution 1 has tensors"):
        combine([a, {"n": np.array(1.0)}])
    with pytest.raises(ValueError, match=r"'sum_x' of contribution 1 has shape \(3,\)"):
        combine([a, {"n": np.array(1.0), "sum_x": np.zeros(3)}])


def test_malformed_aggregates_are_refused(cohort: Cohort) -> None:
    moments = local_moments(cohort.X, cohort.age)
    standardisation = standardisation_from_moments(moments)
    scatter = local_scatter(cohort.X, cohort.age, standardisation)
    with pytest.raises(ValueError, match=r"'sum_xy' has shape \(3,\); expected \(20,\)"):
        model_from_scatter(scatter | {"sum_xy": np.zeros(3)}, standardisation)
    with pytest.raises(ValueError, match=r"missing \['sum_y4'\]"):
        model_from_scatter({k: v for k, v in scatter.items() if k != "sum_y4"}, standardisation)
    with pytest.raises(ValueError, match="NaN or infinite"):
        model_from_scatter(scatter | {"sum_y": np.array(np.nan)}, standardisation)
    empty = moments | {"count_x": np.where(np.arange(20) == 6, 0.0, moments["count_x"])}
    with pytest.raises(ValueError, match="feature 6 has no observed value"):
        standardisation_from_moments(empty)
    with pytest.raises(ValueError, match="nan_policy must be one of"):
        local_moments(cohort.X, cohort.age, nan_policy="median")


def test_standardisation_is_the_pooled_mean_and_sd(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(53, n=200, p=9, nan_fraction=0.05)
    parts = np.array_split(np.arange(200), 3)
    s = standardisation_from_moments(
        combine([local_moments(data.X[i], data.age[i]) for i in parts])
    )
    np.testing.assert_allclose(s.feature_mean, np.nanmean(data.X, axis=0), rtol=1e-12)
    np.testing.assert_allclose(s.feature_std, np.nanstd(data.X, axis=0), rtol=1e-7)
    assert s.age_mean == pytest.approx(data.age.mean(), rel=1e-13)
    assert s.n == 200


# -- bounds, clipping and sensitivity -------------------------------------------------


def _bounds_around(data: Cohort, shrink: float) -> Bounds:
    lo, hi = np.nanmin(data.X, axis=0), np.nanmax(data.X, axis=0)
    margin = (hi - lo) * shrink
    return Bounds(lo + margin, hi - margin, float(data.age.min()) + 1.0, 90.0)


def test_clipping_counts_stay_local_and_fit_equals_pooled_fit_on_clipped_data(
    cohort_factory: CohortFactory,
) -> None:
    data = cohort_factory(54, n=240, p=12)
    bounds = _bounds_around(data, 0.05)
    parts = np.array_split(np.arange(240), 3)
    clipped = count_clipped(data.X, data.age, bounds)
    assert clipped.features.sum() == np.count_nonzero(
        (bounds.feature_lo > data.X) | (bounds.feature_hi < data.X)
    )
    assert clipped.age == np.count_nonzero(data.age < bounds.age_lo)
    assert clipped.total > 0
    moments = local_moments(data.X[parts[0]], data.age[parts[0]], bounds=bounds)
    assert set(moments) == set(expected_shapes("moments", 12))

    settings_ = PlanSettings(model="alternate_quadratic", n_components=4, bounds=bounds)
    federated = run_in_process(_cohorts(data, parts), settings_)
    X = np.clip(data.X, bounds.feature_lo, bounds.feature_hi)
    age = np.clip(data.age, bounds.age_lo, bounds.age_hi)
    pooled = BrainAgeModel("alternate_quadratic", n_components=4, nan_policy="mean").fit(X, age)
    np.testing.assert_allclose(federated.predict_age(X, age), pooled.predict_age(X, age), rtol=1e-9)


def test_bounded_sums_stay_inside_a_fixed_range(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(55, n=300, p=10, n_confounds=2)
    assert data.confounds is not None
    bounds = Bounds(
        np.nanmin(data.X, axis=0),
        np.nanmax(data.X, axis=0),
        40.0,
        90.0,
        confound_lo=data.confounds.min(axis=0),
        confound_hi=data.confounds.max(axis=0),
    )
    moments = local_moments(data.X, data.age, confounds=data.confounds, bounds=bounds)
    assert all(np.abs(v).max() <= 300 for v in moments.values())
    s = standardisation_from_moments(moments, bounds)
    scatter = local_scatter(data.X, data.age, s, confounds=data.confounds)
    assert all(np.abs(v).max() <= 16 * 300 for v in scatter.values())
    assert np.abs(scatter["sum_xx"]).max() <= 4 * 300


def test_sensitivity_bounds_the_change_from_one_subject(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(56, n=120, p=8, n_confounds=1)
    assert data.confounds is not None
    bounds = Bounds(
        np.nanmin(data.X, axis=0) - 1.0,
        np.nanmax(data.X, axis=0) + 1.0,
        40.0,
        90.0,
        confound_lo=np.array([-5.0]),
        confound_hi=np.array([5.0]),
    )
    s = standardisation_from_moments(
        local_moments(data.X, data.age, confounds=data.confounds, bounds=bounds), bounds
    )
    # An extreme subject: every value at the bound farther from the global mean.
    far = np.where(s.feature_mean > bounds.feature_centre, bounds.feature_lo, bounds.feature_hi)
    far_age = bounds.age_lo if s.age_mean > bounds.age_centre else bounds.age_hi
    far_conf = np.where(s.confound_mean > 0, -5.0, 5.0)
    X = np.vstack([data.X, far])
    age = np.append(data.age, far_age)
    conf = np.vstack([data.confounds, far_conf])
    for round_name in ("moments", "scatter"):
        limits = sensitivity(round_name, bounds, s)
        worst = dict.fromkeys(limits, 0.0)
        for drop in [*range(0, 120, 17), 120]:
            keep = np.arange(121) != drop
            if round_name == "moments":
                with_all = local_moments(X, age, confounds=conf, bounds=bounds)
                without = local_moments(X[keep], age[keep], confounds=conf[keep], bounds=bounds)
            else:
                with_all = local_scatter(X, age, s, confounds=conf)
                without = local_scatter(X[keep], age[keep], s, confounds=conf[keep])
            for name, limit in limits.items():
                change = float(np.linalg.norm(with_all[name] - without[name]))
                assert change <= limit * (1 + 1e-12), (round_name, name, change, limit)
                worst[name] = max(worst[name], change)
        if round_name == "scatter":
            # The extreme subject attains the bound on the linear sums.
            for name in ("n", "sum_x", "sum_y", "sum_xy", "sum_c"):
                assert worst[name] == pytest.approx(limits[name], rel=1e-9)
    total = round_sensitivity("scatter", bounds, s)
    assert total == pytest.approx(
        math.sqrt(sum(v * v for v in sensitivity("scatter", bounds, s).values()))
    )


def test_worst_case_sensitivity_without_a_standardisation() -> None:
    bounds = Bounds(np.zeros(100), np.ones(100), 40.0, 90.0)
    moments = sensitivity("moments", bounds)
    assert moments["sum_x"] == 10.0 and moments["n"] == 1.0
    scatter = sensitivity("scatter", bounds)
    assert scatter["sum_x"] == 20.0
    assert scatter["sum_xx"] == 400.0
    assert scatter["sum_y4"] == 16.0
    with pytest.raises(ValueError, match="round_name must be one of"):
        sensitivity("coefficients", bounds)


def test_bounds_are_validated() -> None:
    with pytest.raises(ValueError, match=r"feature 1 has lower bound 2\.0 and upper bound 1\.0"):
        Bounds(np.array([0.0, 2.0]), np.array([1.0, 1.0]), 40, 90)
    with pytest.raises(ValueError, match=r"age 0 has lower bound 90\.0"):
        Bounds(np.zeros(1), np.ones(1), 90, 40)
    with pytest.raises(ValueError, match=r"feature_hi\[0\] is inf"):
        Bounds(np.zeros(1), np.array([np.inf]), 40, 90)
    bounds = Bounds(np.zeros(1), np.ones(1), 40, 90)
    with pytest.raises(ValueError, match="declare 1 features but the data has 2"):
        local_moments(np.ones((3, 2)), [50.0, 60.0, 70.0], bounds=bounds)
    with pytest.raises(ValueError, match="every confound needs public bounds"):
        local_moments(np.ones((3, 1)), [50.0, 60.0, 70.0], bounds=bounds, confounds=np.ones(3))
