"""Reproductions of the published claims the design rests on."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import ttest_rel

from noise.accounting import gaussian_mu
from noise.fixed_point import FixedPointCodec
from simulations.config import OverTheAirParams
from simulations.overtheair import optimality_gaps
from simulations.schemes import Variant
from simulations.seeding import cell_seed, child, generator
from simulations.summary import num
from simulations.utility import release_noise

CODEC = FixedPointCodec()


def test_cape_aggregate_noise_is_one_kth_of_independent_at_equal_per_release_noise() -> None:
    """Imtiaz, Mohammadi & Sarwate (2019): with K = 10 the CAPE aggregate carries 1/K.

    Both schemes put the same variance on every single release (the per-egress
    target); the sum over the K releases carries K·σ² independently but only
    σ² with CAPE's zero-sum term plus the σ²/K residual split.
    """
    k, size = 10, 40_000
    mu = gaussian_mu(1.0, 1e-6)
    scales = np.full(size, 1.0 / mu)  # per-entry std of a unit-sensitivity release
    target = 1.0 / mu**2
    rng = generator(cell_seed(11, "0" * 64))
    cape = (
        release_noise(
            Variant("zerosum+residual", "cape"),
            n_nodes=k,
            collusion_threshold=0,
            scales=scales,
            rng=rng,
        ).astype(np.float64)
        * CODEC.resolution
    )
    independent = (
        release_noise(
            Variant("independent"), n_nodes=k, collusion_threshold=0, scales=scales, rng=rng
        ).astype(np.float64)
        * CODEC.resolution
    )
    per_release = (cape.var(axis=1).mean(), independent.var(axis=1).mean())
    assert math.isclose(per_release[0], target, rel_tol=0.02)
    assert math.isclose(per_release[1], target, rel_tol=0.02)
    ratio = cape.sum(axis=0).var() / independent.sum(axis=0).var()
    assert math.isclose(ratio, 1.0 / k, rel_tol=0.05)


def test_zero_sum_perturbations_leave_the_optimality_gap_unchanged() -> None:
    """Liao, Chen & Larsson (2022): zero-sum R keeps the channel-only gap; diagonal R raises it."""
    params = OverTheAirParams(iterations=120, reps=20)
    gaps: dict[str, list[float]] = {}
    expected: dict[str, list[float]] = {}
    root = cell_seed(12, "1" * 64)
    for rep in range(params.reps):
        for row in optimality_gaps(params, child(root, rep)):
            gaps.setdefault(str(row["perturbation"]), []).append(num(row, "gap"))
            expected.setdefault(str(row["perturbation"]), []).append(num(row, "expected_gap"))
    none, zero_sum, uncorrelated = (np.array(gaps[k]) for k in ("none", "zero_sum", "uncorrelated"))
    # Same channel noise, perturbations summing to zero: the same run up to rounding.
    np.testing.assert_allclose(zero_sum, none, rtol=1e-6)
    assert ttest_rel(uncorrelated, zero_sum, alternative="greater").pvalue < 1e-6
    assert uncorrelated.mean() > 100 * zero_sum.mean()
    # The empirical means agree with the exact expectation within sampling error.
    for kind in ("zero_sum", "uncorrelated"):
        sample = np.array(gaps[kind])
        se = sample.std(ddof=1) / math.sqrt(sample.size)
        assert abs(sample.mean() - np.mean(expected[kind])) < 4 * se
