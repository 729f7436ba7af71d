"""The delta summary's mechanism: sensitivities that hold, the declared Laplace scale, settings."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest

from node.egress.budget import over_budget
from node.plans.deltab.delta_summary import (
    DeltaSummarySettings,
    quantiles_from_histogram,
    summarise,
)
from node.records.ledger import PrivacyLedger
from proto.federation import ConfigError

SETTINGS = DeltaSummarySettings(enabled=True, epsilon=1.0, delta_low=-10.0, delta_high=10.0)
N0 = 50


def _exact(values: np.ndarray) -> tuple[float, float, np.ndarray]:
    summary = summarise(values, SETTINGS, n_floor=N0, seed=bytes([0 + 1]) * 32)
    return (
        summary.exact["mean"],
        summary.exact["second_moment"],
        np.asarray(summary.exact_histogram, dtype=np.float64),
    )


def test_adding_one_subject_moves_each_query_by_at_most_its_declared_sensitivity() -> None:
    # The worst neighbours: cohorts piled at one end (or spread), one subject
    # more at either end of the range or inside it; every smaller cohort N ≥ N₀.
    rng = np.random.default_rng(20261201)
    queries = {q.name: q.sensitivity for q in SETTINGS.queries(N0)}
    worst = {"mean": 0.0, "second_moment": 0.0, "histogram": 0.0}
    cohorts = [np.full(N0, -10.0), np.full(N0, 10.0), np.zeros(N0), np.full(N0 + 7, 9.9)]
    cohorts += [rng.uniform(-14, 14, size=int(rng.integers(N0, 3 * N0))) for _ in range(40)]
    for cohort in cohorts:
        base = _exact(cohort)
        for extra in (-10.0, 10.0, -30.0, 30.0, 0.0, float(rng.uniform(-10, 10))):
            more = _exact(np.append(cohort, extra))
            worst["mean"] = max(worst["mean"], abs(more[0] - base[0]))
            worst["second_moment"] = max(worst["second_moment"], abs(more[1] - base[1]))
            worst["histogram"] = max(worst["histogram"], float(np.abs(more[2] - base[2]).sum()))
    for name, largest in worst.items():
        assert largest <= queries[name], (name, largest, queries[name])
    # The bounds are nearly tight: a pile at one end plus one subject at the other.
    assert worst["mean"] > 0.9 * queries["mean"]
    assert worst["second_moment"] > 0.9 * queries["second_moment"]
    assert worst["histogram"] == 1.0


def test_the_noise_has_the_declared_laplace_scale_and_fresh_draws_each_time() -> None:
    deltas = np.random.default_rng(3).normal(1.0, 3.0, size=300)
    scales = {q.name: q.scale for q in SETTINGS.queries(N0)}
    mean_noise, second_noise, hist_noise = [], [], []
    for i in range(1000):
        # A fresh private seed per release (each session's seed is its own).
        s = summarise(deltas, SETTINGS, n_floor=N0, seed=hashlib.sha256(b"%d" % i).digest())
        mean_noise.append(s.released["mean"] - s.exact["mean"])
        second_noise.append(s.released["second_moment"] - s.exact["second_moment"])
        hist_noise.extend(np.subtract(s.noised_histogram, s.exact_histogram))
    # For Laplace(b), E|X| = b; 1000 draws give a relative standard error of 3.2 %.
    for name, noise in (
        ("mean", mean_noise),
        ("second_moment", second_noise),
        ("histogram", hist_noise),
    ):
        mad = float(np.mean(np.abs(noise)))
        assert mad == pytest.approx(scales[name], rel=0.1), name
        assert abs(float(np.mean(noise))) < 0.15 * scales[name], name
    # Fresh draws each time (values are rounded to 10⁻⁴, so a few coincide).
    assert len(set(mean_noise)) > 0.95 * len(mean_noise)


def test_derived_statistics_are_post_processing_of_the_noised_queries() -> None:
    deltas = np.random.default_rng(4).normal(-2.0, 4.0, size=400)
    s = summarise(deltas, SETTINGS, n_floor=N0, seed=bytes([5 + 1]) * 32)
    r = s.released
    centre = 0.0
    assert r["variance"] == pytest.approx(
        max(r["second_moment"] - (r["mean"] - centre) ** 2, 0), abs=2e-4
    )
    assert r["sd"] == pytest.approx(math.sqrt(r["variance"]), abs=2e-4)
    again = quantiles_from_histogram(s.noised_histogram, s.edges, SETTINGS.quantiles)
    for q, value in zip(SETTINGS.quantiles, again, strict=True):
        assert r[f"q{100 * q:g}"] == pytest.approx(value, abs=1e-4)
    # Exact values: the clipped deltas' own statistics.
    clipped = np.clip(deltas, -10, 10)
    assert s.exact["mean"] == pytest.approx(clipped.mean())
    assert s.exact["sd"] == pytest.approx(clipped.std())
    assert s.clipped == int(np.sum(np.abs(deltas) > 10))


def test_quantiles_from_an_exact_histogram_are_within_one_bin_of_the_data() -> None:
    values = np.random.default_rng(6).uniform(-9, 9, size=2000)
    edges = np.linspace(-10, 10, 31)
    counts, _ = np.histogram(values, bins=edges)
    got = quantiles_from_histogram(counts, edges, (0.05, 0.5, 0.95))
    want = np.quantile(values, (0.05, 0.5, 0.95))
    assert np.all(np.abs(got - want) <= edges[1] - edges[0])
    assert quantiles_from_histogram(np.zeros(30) - 1, edges, (0.5,))[0] == 0.0


def test_too_few_subjects_or_bad_deltas_release_nothing() -> None:
    seed = bytes(32)
    with pytest.raises(ValueError, match="49 subjects is below the minimum cohort size 50"):
        summarise(np.zeros(49), SETTINGS, n_floor=N0, seed=seed)
    with pytest.raises(ValueError, match="must be finite"):
        summarise(np.array([0.0] * 60 + [math.nan]), SETTINGS, n_floor=N0, seed=seed)


@pytest.mark.parametrize(
    ("table", "field", "words"),
    [
        ({"epsilon": 0}, "plan.delta_summary.epsilon", "greater than 0"),
        ({"delta_low": 5, "delta_high": 5}, "plan.delta_summary.delta_high", "must exceed"),
        ({"bins": 1}, "plan.delta_summary.bins", ""),
        ({"quantiles": [0.5, 1.0]}, "plan.delta_summary.quantiles[1]", "strictly in (0, 1)"),
        ({"quantiles": [0.5, 0.25]}, "plan.delta_summary.quantiles", "increasing"),
        ({"enabled": "yes"}, "plan.delta_summary.enabled", "true or false"),
        ({"range": 3}, "plan.delta_summary.range", "unknown setting"),
    ],
)
def test_settings_name_the_field_and_value(
    table: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        DeltaSummarySettings.from_table(table)
    assert field in str(refused.value)
    assert words in str(refused.value)


def test_settings_round_trip_and_default_on_when_the_table_is_given() -> None:
    settings = DeltaSummarySettings.from_table({"epsilon": 0.5})
    assert settings.enabled and settings.epsilon == 0.5
    assert DeltaSummarySettings.from_table(settings.to_table()) == settings


def _summary_release(ledger: PrivacyLedger, epsilon: float, payload: str) -> None:
    """The Laplace release of a delta summary of session s1 (round -1, no manifest)."""
    ledger.record_laplace(
        session_id="s1",
        round_index=-1,
        round_name="delta-summary",
        epsilon=epsilon,
        manifest_sha256="",
        payload_sha256=payload,
    )


def test_the_ledger_adds_a_laplace_release_to_every_observer_class_once(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "ledger.json", "a", 1e-6)
    mu = {"outsider": 0.3, "colluders:1": 0.5, "coordinator": math.inf}
    ledger.record_release(
        session_id="s1",
        round_index=0,
        round_name="sums",
        mu=mu,
        manifest_sha256="m" * 64,
        payload_sha256="1" * 64,
    )
    before = {t.label: t.epsilon for t in ledger.totals()}
    for _ in range(2):  # the same values recorded twice are one release
        _summary_release(ledger, 0.75, "2" * 64)
    after = {t.label: t for t in PrivacyLedger.open(ledger.path, "a", 1e-6).totals()}
    for label, epsilon in before.items():
        assert after[label].epsilon == pytest.approx(epsilon + 0.75)
        assert after[label].laplace_epsilon == 0.75
        assert after[label].releases == 2
    # The budget sees a prospective summary too, against every checked class.
    excess = over_budget(
        ledger, [], budget=before["colluders:1"] + 0.8, residual_dp=False, laplace=[0.1]
    )
    assert [e.label for e in excess] == ["colluders:1"]


def test_a_ledger_with_only_a_laplace_release_has_an_outsider_total(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path / "ledger.json", "a", 1e-6)
    _summary_release(ledger, 0.5, "3" * 64)
    (total,) = ledger.totals()
    assert (total.label, total.epsilon, total.releases) == ("outsider", 0.5, 1)
