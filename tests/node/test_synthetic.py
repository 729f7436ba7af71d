"""Synthetic cohorts: reproducible by seed, with the intended ages, deltas and site effects."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from node.deltab.synthetic import (
    Population,
    SiteEffect,
    concatenate_cohorts,
    feature_names,
    make_cohort,
    make_federation_cohorts,
    write_cohort_csv,
)


def test_same_seed_same_cohort_and_different_seed_differs() -> None:
    a = make_cohort(200, 30, seed=7)
    b = make_cohort(200, 30, seed=7)
    c = make_cohort(200, 30, seed=8)
    np.testing.assert_array_equal(a.features, b.features)
    np.testing.assert_array_equal(a.age, b.age)
    np.testing.assert_array_equal(a.true_delta, b.true_delta)
    assert a.ids == b.ids
    assert not np.allclose(a.features, c.features)


def test_seed_sequence_is_not_consumed_by_use() -> None:
    seed = np.random.SeedSequence(2**100 + 3)  # a wide seed, kept whole
    first = make_cohort(50, 5, seed=seed)
    second = make_cohort(50, 5, seed=seed)
    np.testing.assert_array_equal(first.features, second.features)


def test_global_numpy_rng_is_untouched() -> None:
    # Reading the legacy global state is the point of this test.
    state = np.random.get_state(legacy=False)  # noqa: NPY002
    make_federation_cohorts([40, 60], 10, seed=1, holdout_size=20)
    after = np.random.get_state(legacy=False)  # noqa: NPY002
    assert state["bit_generator"] == after["bit_generator"]
    np.testing.assert_array_equal(state["state"]["key"], after["state"]["key"])
    assert state["state"]["pos"] == after["state"]["pos"]


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_bad_seed_is_rejected(seed: object) -> None:
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        make_cohort(10, 3, seed=seed)  # type: ignore[arg-type]


def test_ages_stay_in_range_and_skew_moves_the_mass() -> None:
    uniform = make_cohort(4000, 4, seed=1, age_range=(45, 80))
    young = make_cohort(4000, 4, seed=1, age_range=(45, 80), age_skew=2.0)
    old = make_cohort(4000, 4, seed=1, age_range=(45, 80), age_skew=-2.0)
    for cohort in (uniform, young, old):
        assert cohort.age.min() >= 45 and cohort.age.max() <= 80
    assert abs(np.median(uniform.age) - 62.5) < 1.0
    assert np.median(young.age) < 58
    assert np.median(old.age) > 67


def test_true_delta_has_the_requested_spread_and_enters_brain_age() -> None:
    cohort = make_cohort(5000, 4, seed=2, delta_sd=3.0)
    assert abs(cohort.true_delta.std() - 3.0) < 0.15
    assert abs(cohort.true_delta.mean()) < 0.15
    np.testing.assert_allclose(cohort.brain_age, cohort.age + cohort.true_delta)


def test_features_carry_age_signal() -> None:
    cohort = make_cohort(3000, 40, seed=3)
    centred = cohort.features - cohort.features.mean(axis=0)
    design = np.column_stack([centred, np.ones(cohort.n_subjects)])
    coef, *_ = np.linalg.lstsq(design, cohort.brain_age, rcond=None)
    fitted = design @ coef
    r2 = 1 - np.var(cohort.brain_age - fitted) / np.var(cohort.brain_age)
    assert r2 > 0.8


def test_site_effect_shifts_and_scales_every_feature() -> None:
    population = Population.draw(20, seed=4)
    effect = SiteEffect.draw("scanner", 20, seed=5, offset_sd=1.0, scale_sd=0.2)
    plain = make_cohort(300, 20, seed=6, population=population)
    shifted = make_cohort(300, 20, seed=6, population=population, site=effect)
    # Same subjects, same noise: the scanner is exactly an affine map per feature.
    expected = (
        population.feature_mean
        + (plain.features - population.feature_mean) * effect.scale
        + effect.offset * population.feature_sd
    )
    np.testing.assert_allclose(shifted.features, expected, rtol=1e-10, atol=1e-10)
    assert shifted.ids[0] == "scanner-000001"


def test_site_effect_validates_its_arrays() -> None:
    with pytest.raises(ValueError, match="every scale must be positive"):
        SiteEffect("s", offset=np.zeros(3), scale=np.array([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="equal length"):
        SiteEffect("s", offset=np.zeros(3), scale=np.ones(2))
    with pytest.raises(ValueError, match="has effects for 3 features"):
        make_cohort(5, 4, seed=1, site=SiteEffect("s", offset=np.zeros(3), scale=np.ones(3)))


def test_cohort_arrays_are_read_only() -> None:
    cohort = make_cohort(10, 3, seed=1)
    with pytest.raises(ValueError, match="read-only"):
        cohort.features[0, 0] = 1.0


def test_missing_fraction_blanks_about_that_share_of_cells() -> None:
    cohort = make_cohort(500, 20, seed=9, missing_fraction=0.1)
    share = np.isnan(cohort.features).mean()
    assert 0.08 < share < 0.12
    assert not np.isnan(cohort.age).any()


def test_federation_sites_differ_in_size_age_and_scanner() -> None:
    fed = make_federation_cohorts([100, 250, 400], 12, seed=11, holdout_size=150)
    assert [s.n_subjects for s in fed.sites] == [100, 250, 400]
    assert [s.site for s in fed.sites] == ["site1", "site2", "site3"]
    assert (fed.sites[0].age.min(), fed.sites[0].age.max()) >= (45.0, 0.0)
    assert fed.sites[0].age.max() <= 75.0
    assert fed.sites[1].age.min() >= 50.0 and fed.sites[1].age.max() <= 82.0
    assert fed.sites[2].age.min() >= 40.0 and fed.sites[2].age.max() <= 70.0
    assert not np.allclose(fed.site_effects[0].offset, fed.site_effects[1].offset)
    # The holdout is split across scanners in proportion to site size.
    assert fed.holdout.n_subjects == 150
    prefixes = [i.rsplit("-", 1)[0] for i in fed.holdout.ids]
    assert prefixes.count("holdout-site1") == 20
    assert prefixes.count("holdout-site2") == 50
    assert prefixes.count("holdout-site3") == 80
    pooled = fed.pooled()
    assert pooled.n_subjects == 750
    assert len(set(pooled.ids) | set(fed.holdout.ids)) == 900


def test_federation_is_deterministic_and_shares_one_population() -> None:
    a = make_federation_cohorts([30, 40], 8, seed=5, holdout_size=10)
    b = make_federation_cohorts([30, 40], 8, seed=5, holdout_size=10)
    np.testing.assert_array_equal(a.population.mixing, b.population.mixing)
    for x, y in zip(a.sites, b.sites, strict=True):
        np.testing.assert_array_equal(x.features, y.features)
    np.testing.assert_array_equal(a.holdout.features, b.holdout.features)


def test_federation_rejects_mismatched_age_ranges() -> None:
    with pytest.raises(ValueError, match="2 sites need 2 age ranges"):
        make_federation_cohorts([10, 10], 3, seed=1, age_ranges=[(40, 60)])


def test_concatenate_requires_matching_features() -> None:
    a = make_cohort(5, 3, seed=1)
    b = make_cohort(5, 4, seed=1)
    with pytest.raises(ValueError, match="different features"):
        concatenate_cohorts([a, b], site="x")


def test_feature_names_are_zero_padded() -> None:
    assert feature_names(3) == ("f0001", "f0002", "f0003")
    assert feature_names(12345)[-1] == "f12345"


def test_write_cohort_csv_layout(tmp_path: Path) -> None:
    cohort = make_cohort(6, 3, seed=1, missing_fraction=0.3)
    path = write_cohort_csv(cohort, tmp_path / "c.csv")
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["id", "age", "f0001", "f0002", "f0003"]
    assert len(rows) == 7
    assert rows[1][0] == cohort.ids[0]
    assert float(rows[1][1]) == pytest.approx(cohort.age[0], abs=1e-6)
    for i, row in enumerate(rows[1:]):
        for j, cell in enumerate(row[2:]):
            value = cohort.features[i, j]
            if np.isnan(value):
                assert cell == ""
            else:
                assert float(cell) == pytest.approx(value, rel=1e-6)


def test_write_cohort_tsv_halves(tmp_path: Path) -> None:
    cohort = make_cohort(4, 2, seed=1)
    ages = write_cohort_csv(cohort, tmp_path / "ages.tsv", False, include_features=False)
    feats = write_cohort_csv(cohort, tmp_path / "x.tsv", include_age=False, header=False)
    assert ages.read_text().splitlines()[0] == "age"
    first = feats.read_text().splitlines()[0].split("\t")
    assert first[0] == cohort.ids[0] and len(first) == 3


def test_population_seed_separates_the_population_from_the_sample() -> None:
    shared = Population.draw(12, np.random.SeedSequence(3, spawn_key=(0,)))
    by_seed = make_cohort(80, 12, seed=21, population_seed=3)
    by_object = make_cohort(80, 12, seed=21, population=shared)
    np.testing.assert_array_equal(by_seed.features, by_object.features)
    # The subjects follow the sample seed only; the population seed changes the features.
    other_world = make_cohort(80, 12, seed=21, population_seed=4)
    np.testing.assert_array_equal(other_world.age, by_seed.age)
    assert not np.allclose(other_world.features, by_seed.features)
    # population_seed equal to seed is the self-contained single-seed cohort.
    np.testing.assert_array_equal(
        make_cohort(80, 12, seed=21, population_seed=21).features,
        make_cohort(80, 12, seed=21).features,
    )
    with pytest.raises(ValueError, match="population or population_seed, not both"):
        make_cohort(10, 12, seed=1, population=shared, population_seed=3)
