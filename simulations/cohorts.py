"""Synthetic federations for the simulations, their public bounds, and worst-case subjects.

Cohorts come from ``node.deltab.synthetic`` (Smith et al. 2019, Simulation 1
in spirit): one population, one scanner effect and one age distribution per
site, so every federation is non-IID in ages and, with ``site_offset_sd`` > 0,
in feature offsets.

Public bounds. The noise is calibrated to L2 sensitivities that follow from
declared clipping ranges (docs/design.md §6). A federation would declare them from
what is known about the measures; here they come from the generator's
population: feature j is declared to lie in μ_j ± w·σ_j with
w = 5 + 2.5·site_offset_sd (wide enough that clipping is rare: the largest
standardised value in 20 000 subjects is about 5.6, 6.3 and 7.6 for offsets
0, 0.5 and 1), and age in [40, 90] years, which covers every default site range.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from node.deltab.scaling import Bounds, clip_to_bounds
from node.deltab.synthetic import Federation, Population, make_federation_cohorts

__all__ = [
    "AGE_BOUNDS",
    "clip_features",
    "make_federation",
    "public_bounds",
    "worst_case_subject",
]

FloatArray = NDArray[np.float64]

AGE_BOUNDS = (40.0, 90.0)


def public_bounds(population: Population, site_offset_sd: float) -> Bounds:
    """Declared clipping ranges μ_j ± (5 + 2.5·site_offset_sd)·σ_j and age in [40, 90]."""
    width = (5.0 + 2.5 * site_offset_sd) * population.feature_sd
    return Bounds(
        feature_lo=population.feature_mean - width,
        feature_hi=population.feature_mean + width,
        age_lo=AGE_BOUNDS[0],
        age_hi=AGE_BOUNDS[1],
    )


def make_federation(
    *,
    n_nodes: int,
    n_per_node: int,
    n_features: int,
    site_offset_sd: float,
    holdout_size: int,
    seed: np.random.SeedSequence,
) -> Federation:
    """K equal-sized sites and a holdout drawn through the same scanners."""
    return make_federation_cohorts(
        [n_per_node] * n_nodes,
        n_features,
        seed,
        holdout_size=holdout_size,
        offset_sd=site_offset_sd,
    )


def clip_features(X: FloatArray, age: FloatArray, bounds: Bounds) -> tuple[FloatArray, FloatArray]:
    """Features and ages clipped to the public bounds (what every node sums)."""
    clipped_x, clipped_age, _, _ = clip_to_bounds(X, age, np.zeros((X.shape[0], 0)), bounds)
    return clipped_x, clipped_age


def worst_case_subject(bounds: Bounds) -> tuple[FloatArray, float]:
    """A subject whose sums-round contribution is as large as the bounds allow.

    Every feature and the age sit at their upper bounds, so every pre-scaled
    value is 1 and each tensor's term has exactly the norm that
    ``node.deltab.sums.sensitivity`` declares (any corner of the cube would
    do: the figures depend only on |value| = 1). Membership attacks against
    this subject are the strongest the declared sensitivity has to cover.
    """
    return np.array(bounds.feature_hi, dtype=np.float64), float(bounds.age_hi)
