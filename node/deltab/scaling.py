"""Public clipping bounds and the global standardisation shared by every node.

Two ideas live here.

*Bounds.* A federation declares, in public, a range [lo, hi] for every feature,
for age and for every confound. Nodes clip their values to those ranges (and
count, locally, how many they clipped) and then map each range affinely onto
[-1, 1]: x' = (x - (lo + hi)/2) / ((hi - lo)/2). Every per-subject term of
every summed tensor is then bounded by a constant that depends only on the
public bounds, which gives the L2 sensitivities used to calibrate noise (see
``sums.sensitivity``) and keeps the sums well inside the fixed-point range
(|x'| ≤ 1, so a sum over N subjects of a product of such terms is at most N
in magnitude; the centred plan's |x' - m'| ≤ 2 gives at most 16 N). The affine
map does not change the model: standardised features are invariant to it and
ages are mapped back to years in the fitted model.

*Standardisation.* The per-feature means (and, for information, standard
deviations) of the pooled cohort. The one-release plan derives them after
aggregation from the uncentred sums (``uncentred.centred_from_sums``); the
centred two-round plan takes them from its first round and centres every value
with them before forming products.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from node.deltab._checks import FloatArray

IntArray = NDArray[np.int64]

__all__ = ["Bounds", "ClipCounts", "Standardisation"]


def _bound_vector(values: ArrayLike, name: str) -> FloatArray:
    array = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of bounds; got shape {array.shape}.")
    if not np.isfinite(array).all():
        index = int(np.flatnonzero(~np.isfinite(array))[0])
        raise ValueError(f"{name}[{index}] is {array[index]}; bounds must be finite numbers.")
    return array


def _check_order(lo: FloatArray, hi: FloatArray, what: str) -> None:
    if lo.shape != hi.shape:
        raise ValueError(
            f"{what} lower and upper bounds differ in length ({lo.size} and {hi.size})."
        )
    bad = np.flatnonzero(~(lo < hi))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{what} {i} has lower bound {lo[i]} and upper bound {hi[i]}; the lower bound must "
            "be strictly below the upper bound."
        )


@dataclass(frozen=True, eq=False)
class Bounds:
    """Public clipping ranges: one [lo, hi] per feature, one for age, one per confound.

    ``confound_lo``/``confound_hi`` may be omitted when no confounds are used.
    """

    feature_lo: FloatArray
    feature_hi: FloatArray
    age_lo: float
    age_hi: float
    confound_lo: FloatArray = field(default_factory=lambda: np.zeros(0))
    confound_hi: FloatArray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        feature_lo = _bound_vector(self.feature_lo, "feature_lo")
        feature_hi = _bound_vector(self.feature_hi, "feature_hi")
        _check_order(feature_lo, feature_hi, "feature")
        confound_lo = _bound_vector(self.confound_lo, "confound_lo")
        confound_hi = _bound_vector(self.confound_hi, "confound_hi")
        _check_order(confound_lo, confound_hi, "confound")
        age = _bound_vector([self.age_lo, self.age_hi], "age bounds")
        _check_order(age[:1], age[1:], "age")
        for name, value in (
            ("feature_lo", feature_lo),
            ("feature_hi", feature_hi),
            ("confound_lo", confound_lo),
            ("confound_hi", confound_hi),
        ):
            value.setflags(write=False)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "age_lo", float(age[0]))
        object.__setattr__(self, "age_hi", float(age[1]))

    @property
    def n_features(self) -> int:
        return int(self.feature_lo.size)

    @property
    def n_confounds(self) -> int:
        return int(self.confound_lo.size)

    @property
    def feature_centre(self) -> FloatArray:
        centre: FloatArray = (self.feature_lo + self.feature_hi) / 2.0
        return centre

    @property
    def feature_half(self) -> FloatArray:
        half: FloatArray = (self.feature_hi - self.feature_lo) / 2.0
        return half

    @property
    def age_centre(self) -> float:
        return (self.age_lo + self.age_hi) / 2.0

    @property
    def age_half(self) -> float:
        return (self.age_hi - self.age_lo) / 2.0

    @property
    def confound_centre(self) -> FloatArray:
        centre: FloatArray = (self.confound_lo + self.confound_hi) / 2.0
        return centre

    @property
    def confound_half(self) -> FloatArray:
        half: FloatArray = (self.confound_hi - self.confound_lo) / 2.0
        return half

    def check_shapes(self, n_features: int, n_confounds: int) -> None:
        """Raise unless the bounds cover exactly these features and confounds."""
        if self.n_features != n_features:
            raise ValueError(
                f"the bounds declare {self.n_features} features but the data has {n_features}."
            )
        if self.n_confounds != n_confounds:
            raise ValueError(
                f"the bounds declare {self.n_confounds} confounds but {n_confounds} were given; "
                "every confound needs public bounds when bounds are used."
            )


@dataclass(frozen=True, eq=False)
class ClipCounts:
    """How many values a node clipped to the public bounds (kept locally, never sent)."""

    features: IntArray
    age: int
    confounds: IntArray

    @property
    def total(self) -> int:
        return int(self.features.sum()) + self.age + int(self.confounds.sum())

    @classmethod
    def none(cls, n_features: int, n_confounds: int) -> ClipCounts:
        return cls(
            features=np.zeros(n_features, dtype=np.int64),
            age=0,
            confounds=np.zeros(n_confounds, dtype=np.int64),
        )


def _outside(values: FloatArray, lo: FloatArray | float, hi: FloatArray | float) -> IntArray:
    with np.errstate(invalid="ignore"):
        mask = (values < lo) | (values > hi)
    counts: IntArray = mask.sum(axis=0).astype(np.int64)
    return counts


def clip_counts(
    X: FloatArray, age: FloatArray, confounds: FloatArray, bounds: Bounds | None
) -> ClipCounts:
    """The values :func:`clip_to_bounds` would clip, per column, without clipping anything."""
    if bounds is None:
        return ClipCounts.none(X.shape[1], confounds.shape[1])
    bounds.check_shapes(X.shape[1], confounds.shape[1])
    return ClipCounts(
        features=_outside(X, bounds.feature_lo, bounds.feature_hi),
        age=int(_outside(age, bounds.age_lo, bounds.age_hi)),
        confounds=_outside(confounds, bounds.confound_lo, bounds.confound_hi),
    )


def clip_to_bounds(
    X: FloatArray, age: FloatArray, confounds: FloatArray, bounds: Bounds | None
) -> tuple[FloatArray, FloatArray, FloatArray, ClipCounts]:
    """Clip to the bounds (NaN stays NaN) and count the clipped values per column."""
    counts = clip_counts(X, age, confounds, bounds)
    if bounds is None:
        return X, age, confounds, counts
    return (
        np.clip(X, bounds.feature_lo, bounds.feature_hi),
        np.clip(age, bounds.age_lo, bounds.age_hi),
        np.clip(confounds, bounds.confound_lo, bounds.confound_hi),
        counts,
    )


@dataclass(frozen=True, eq=False)
class Standardisation:
    """Global location and spread of every variable, in original units.

    Built from an aggregate (``uncentred.centred_from_sums``, or
    ``stats.standardisation_from_moments`` for the centred plan's first round)
    identically at every node, since it is a deterministic function of the
    aggregate, or from a single cohort for an in-memory fit. ``n`` is the
    number of subjects behind the moments. The half-ranges are the divisors of
    the [-1, 1] pre-scaling (1 when there are no bounds), so the centred
    quantities the solve works with are ``(x - feature_mean) / feature_half``
    and likewise for age and confounds.

    ``feature_std`` is informational: Σx²/N - mean² loses digits when |mean| is
    much larger than the spread, so the solve step standardises with standard
    deviations recomputed from the centred sums instead.
    """

    n: float
    feature_mean: FloatArray
    feature_std: FloatArray
    age_mean: float
    age_std: float
    confound_mean: FloatArray
    confound_std: FloatArray
    bounds: Bounds | None = None

    @property
    def n_features(self) -> int:
        return int(self.feature_mean.size)

    @property
    def n_confounds(self) -> int:
        return int(self.confound_mean.size)

    @property
    def feature_half(self) -> FloatArray:
        if self.bounds is None:
            return np.ones(self.n_features)
        return self.bounds.feature_half

    @property
    def age_half(self) -> float:
        return 1.0 if self.bounds is None else self.bounds.age_half

    @property
    def confound_half(self) -> FloatArray:
        if self.bounds is None:
            return np.ones(self.n_confounds)
        return self.bounds.confound_half

    @property
    def feature_location(self) -> FloatArray:
        """|mean| / half-range: the rounding scale of centred values (spots constant features)."""
        location: FloatArray = np.abs(self.feature_mean) / self.feature_half
        return location
