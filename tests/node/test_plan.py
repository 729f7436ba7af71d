"""The federated plans, driven round by round, and the seed documents' coefficient averaging."""

from __future__ import annotations

import numpy as np
import pytest

from node.deltab import MODELS, Bounds, BrainAgeModel
from node.deltab.fedavg import coefficient_shapes, local_coefficients, model_from_coefficients
from node.deltab.plan import (
    ROUNDS,
    SEED_LITERAL_ROUNDS,
    NodeMemory,
    PlanSettings,
    finish,
    finish_seed_literal,
    receive,
    round_tensors,
    rounds_for,
    run_in_process,
)
from node.deltab.stats import combine, expected_shapes
from tests.support.cohorts import Cohort, CohortFactory


def _by_age(data: Cohort, n_nodes: int) -> list[tuple[np.ndarray, np.ndarray]]:
    parts = np.array_split(np.argsort(data.age), n_nodes)
    return [(data.X[i], data.age[i]) for i in parts]


def test_rounds_are_named_in_order() -> None:
    assert rounds_for("drop") == ("sums",)
    assert rounds_for("mean") == ("means", "sums")
    assert PlanSettings().nan_policy == "drop"
    assert PlanSettings().rounds == ("sums",)
    assert PlanSettings(nan_policy="mean").rounds == ("means", "sums")
    # The centred two-round plan, still run by the session.
    assert ROUNDS == ("moments", "scatter")
    assert SEED_LITERAL_ROUNDS == ("moments", "scatter", "coefficients")


@pytest.mark.parametrize(
    ("nan_policy", "rounds"),
    [("mean", ("means", "sums")), ("drop", ("sums",)), ("mean", ROUNDS), ("drop", ROUNDS)],
)
def test_driving_the_plan_round_by_round_gives_the_pooled_model(
    cohort_factory: CohortFactory, nan_policy: str, rounds: tuple[str, ...]
) -> None:
    data = cohort_factory(61, n=300, p=14, nan_fraction=0.02)
    bounds = Bounds(np.nanmin(data.X, axis=0), np.nanmax(data.X, axis=0), 40.0, 85.0)
    settings = PlanSettings(
        model="unbiased_quadratic", variance_explained=0.9, bounds=bounds, nan_policy=nan_policy
    )
    nodes = _by_age(data, 3)
    states = [NodeMemory(settings=settings) for _ in nodes]
    aggregates = {}
    for round_name in rounds:
        sent = [
            round_tensors(round_name, X, age, state)
            for (X, age), state in zip(nodes, states, strict=True)
        ]
        for tensors in sent:
            assert {k: v.shape for k, v in tensors.items()} == expected_shapes(round_name, 14)
        aggregates[round_name] = combine(sent)
        for state in states:
            receive(round_name, aggregates[round_name], state)
        assert all(set(state.clipped) >= {round_name} for state in states)
    model = finish(aggregates, settings)
    assert model.nan_policy == nan_policy
    assert all(state.model is not None for state in states)
    pooled = BrainAgeModel("unbiased_quadratic", variance_explained=0.9, nan_policy=nan_policy)
    pooled.fit(data.X, data.age)
    rows = ~np.isnan(data.X).any(axis=1) if nan_policy == "drop" else slice(None)
    X, age = data.X[rows], data.age[rows]
    np.testing.assert_allclose(model.predict_age(X, age), pooled.predict_age(X, age), rtol=1e-9)
    node_model = states[0].model
    assert node_model is not None
    np.testing.assert_array_equal(node_model.predict_age(X, age), model.predict_age(X, age))


def test_rounds_out_of_order_are_refused(cohort: Cohort) -> None:
    state = NodeMemory()
    with pytest.raises(ValueError, match="call receive\\('moments'"):
        round_tensors("scatter", cohort.X, cohort.age, state)
    with pytest.raises(ValueError, match="needs the shared basis"):
        round_tensors("coefficients", cohort.X, cohort.age, state)
    with pytest.raises(ValueError, match="round_name must be one of"):
        round_tensors("gradients", cohort.X, cohort.age, state)
    with pytest.raises(ValueError, match="round_name must be one of"):
        receive("gradients", {}, state)
    with pytest.raises(ValueError, match="the means round belongs to nan_policy='mean'"):
        round_tensors("means", cohort.X, cohort.age, state)
    imputing = NodeMemory(PlanSettings(nan_policy="mean"))
    # The zero-filled sums need no means; completing their aggregate does.
    sums = round_tensors("sums", cohort.X, cohort.age, imputing)
    with pytest.raises(ValueError, match="call receive\\('means'"):
        receive("sums", sums, imputing)
    with pytest.raises(ValueError, match=r"receive\('moments', \.\.\.\) must come before"):
        receive("scatter", {}, state)
    with pytest.raises(
        ValueError, match=r"finish needs the aggregate of round 'sums'.*\['means'\]"
    ):
        finish({"means": {}})


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="model must be one of"):
        PlanSettings(model="linear")
    with pytest.raises(ValueError, match="nan_policy must be one of \\('mean', 'drop'\\)"):
        PlanSettings(nan_policy="median")
    with pytest.raises(ValueError, match="at most one"):
        PlanSettings(n_components=3, kaiser_guttman=True)


def test_confounds_travel_with_the_node_state(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(62, n=240, p=10, n_confounds=2)
    assert data.confounds is not None
    parts = np.array_split(np.arange(240), 3)
    cohorts = [(data.X[i], data.age[i], data.confounds[i]) for i in parts]
    model = run_in_process(cohorts, PlanSettings(model="alternate", n_components=4))
    pooled = BrainAgeModel("alternate", n_components=4, nan_policy="mean")
    pooled.fit(data.X, data.age, data.confounds)
    np.testing.assert_allclose(
        model.predict_age(data.X, data.age, data.confounds),
        pooled.predict_age(data.X, data.age, data.confounds),
        rtol=1e-9,
    )


# -- seed-literal comparison mode -----------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_seed_literal_mode_is_exact_with_one_node(cohort: Cohort, model: str) -> None:
    settings = PlanSettings(model=model, n_components=5)
    exact = run_in_process([(cohort.X, cohort.age)], settings)
    literal = run_in_process([(cohort.X, cohort.age)], settings, seed_literal=True)
    np.testing.assert_allclose(
        literal.predict_age(cohort.X, cohort.age),
        exact.predict_age(cohort.X, cohort.age),
        rtol=1e-9,
    )


@pytest.mark.parametrize("model", MODELS)
def test_seed_literal_mode_differs_from_the_exact_fit_on_non_iid_nodes(
    cohort: Cohort, model: str
) -> None:
    settings = PlanSettings(model=model, n_components=5)
    exact = run_in_process(_by_age(cohort, 3), settings)
    literal = run_in_process(_by_age(cohort, 3), settings, seed_literal=True)
    gap = np.abs(
        literal.predict_age(cohort.X, cohort.age) - exact.predict_age(cohort.X, cohort.age)
    )
    assert gap.max() > 0.5  # years
    np.testing.assert_array_equal(literal.components_, exact.components_)  # shared basis


def test_coefficient_round_tensors_and_averaging(cohort: Cohort) -> None:
    settings = PlanSettings(model="unbiased", n_components=4)
    nodes = _by_age(cohort, 2)
    basis = run_in_process(nodes, settings)
    sent = [local_coefficients(X, age, basis) for X, age in nodes]
    for tensors in sent:
        assert {k: v.shape for k, v in tensors.items()} == coefficient_shapes(4)
    averaged = model_from_coefficients(combine(sent), basis)
    n = [float(t["n"]) for t in sent]
    expected_b1 = (sent[0]["n_b1"] + sent[1]["n_b1"]) / sum(n)
    np.testing.assert_allclose(averaged.b1_, expected_b1)
    np.testing.assert_array_equal(averaged.age_adjust_, basis.age_adjust_)
    assert basis.b1_ is not averaged.b1_
    literal = finish_seed_literal(
        {
            "moments": combine(
                [round_tensors("moments", X, a, NodeMemory(settings)) for X, a in nodes]
            ),
            **_scatter_and_coefficients(nodes, settings),
        },
        settings,
    )
    np.testing.assert_allclose(literal.b1_, averaged.b1_, rtol=1e-9)
    with pytest.raises(ValueError, match="expected"):
        model_from_coefficients({"n": np.array(1.0)}, basis)


Node = tuple[np.ndarray, np.ndarray]


def _scatter_and_coefficients(
    nodes: list[Node], settings: PlanSettings
) -> dict[str, dict[str, np.ndarray]]:
    states = [NodeMemory(settings) for _ in nodes]
    moments = combine(
        [round_tensors("moments", X, a, s) for (X, a), s in zip(nodes, states, strict=True)]
    )
    for state in states:
        receive("moments", moments, state)
    scatter = combine(
        [round_tensors("scatter", X, a, s) for (X, a), s in zip(nodes, states, strict=True)]
    )
    for state in states:
        receive("scatter", scatter, state)
    coefficients = combine(
        [round_tensors("coefficients", X, a, s) for (X, a), s in zip(nodes, states, strict=True)]
    )
    return {"scatter": scatter, "coefficients": coefficients}


def test_seed_literal_mode_clips_like_the_exact_plan(cohort: Cohort) -> None:
    lo, hi = np.nanmin(cohort.X, axis=0), np.nanmax(cohort.X, axis=0)
    bounds = Bounds(lo + 0.05 * (hi - lo), hi - 0.05 * (hi - lo), 46.0, 80.0)
    settings = PlanSettings(model="unbiased_quadratic", n_components=4, bounds=bounds)
    exact = run_in_process([(cohort.X, cohort.age)], settings)
    literal = run_in_process([(cohort.X, cohort.age)], settings, seed_literal=True)
    X = np.clip(cohort.X, bounds.feature_lo, bounds.feature_hi)
    age = np.clip(cohort.age, bounds.age_lo, bounds.age_hi)
    np.testing.assert_allclose(literal.predict_age(X, age), exact.predict_age(X, age), rtol=1e-9)
