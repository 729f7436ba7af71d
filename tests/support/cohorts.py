"""Small synthetic cohorts for the brain-age tests (the fixtures are in tests/node/conftest.py).

Each subject has an age drawn from a right-skewed distribution (most subjects
young, a long tail of older ones — the shape that exposes a badly
orthogonalised quadratic term) and a true brain-age delta. The features are
driven by a few latent components: an ageing component with a linear and a
quadratic effect of brain age, plus age-unrelated components, plus noise, each
feature with its own offset and unit (like imaging-derived phenotypes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Cohort:
    X: FloatArray
    age: FloatArray
    delta: FloatArray
    confounds: FloatArray | None

    def subset(self, rows: NDArray[np.intp] | NDArray[np.bool_]) -> Cohort:
        return Cohort(
            X=self.X[rows],
            age=self.age[rows],
            delta=self.delta[rows],
            confounds=None if self.confounds is None else self.confounds[rows],
        )


def make_cohort(
    seed: int,
    n: int = 300,
    p: int = 20,
    *,
    n_latent: int = 3,
    quadratic: float = 0.8,
    noise: float = 0.5,
    delta_sd: float = 4.0,
    n_confounds: int = 0,
    nan_fraction: float = 0.0,
    age_range: tuple[float, float] = (45.0, 82.0),
) -> Cohort:
    """A cohort of ``n`` subjects and ``p`` features from ``seed`` (deterministic)."""
    rng = np.random.default_rng(seed)
    lo, hi = age_range
    age = lo + (hi - lo) * rng.beta(1.5, 4.0, n)
    delta = rng.normal(0.0, delta_sd, n)
    brain_age = age + delta
    s = (brain_age - (lo + hi) / 2.0) / ((hi - lo) / 2.0)
    ageing = np.column_stack([s, s * s])
    effects = np.vstack([rng.normal(1.0, 0.5, p), quadratic * rng.normal(1.0, 0.5, p)])
    signal = ageing @ effects
    if n_latent > 1:
        other = rng.normal(size=(n, n_latent - 1)) @ rng.normal(size=(n_latent - 1, p))
        signal += 0.6 * other
    confounds = None
    if n_confounds:
        confounds = np.column_stack(
            [rng.normal(size=n) + 0.03 * (age - lo) for _ in range(n_confounds)]
        )
        signal += confounds @ rng.normal(0.0, 0.5, (n_confounds, p))
    signal += noise * rng.normal(size=(n, p))
    unit = np.exp(rng.uniform(-3.0, 6.0, p))
    offset = rng.uniform(-2.0, 10.0, p) * unit
    X = offset + unit * signal
    if nan_fraction:
        X[rng.random(X.shape) < nan_fraction] = np.nan
    return Cohort(X=X, age=age, delta=delta, confounds=confounds)


CohortFactory = Callable[..., Cohort]


def correlation(a: FloatArray, b: FloatArray) -> float:
    return float(np.corrcoef(a, b)[0, 1])
