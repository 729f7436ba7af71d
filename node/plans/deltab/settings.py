"""The brain-age plan's settings: ``[plan.model]`` and ``[plan.clipping]``, validated here.

The federation config keeps a plan's tables as written and never interprets
them (proto/federation); the brain-age plan reads its own:

``[plan.model]``
    ``kind`` — one of the five models of Smith et al. 2019 (NeuroImage
    200:528-539); ``n_features`` P and ``n_components`` J (J ≤ P); and
    ``nan_policy`` — "drop" (each node leaves out its subjects with a missing
    feature value; complete data lose nothing) or "mean" (a missing value is
    replaced by the global mean of the observed values, which takes a first
    round of means).
``[plan.clipping]``
    ``age_low``/``age_high`` and ``feature_low``/``feature_high`` (one number
    for all features, or one per feature): the public bounds every value is
    clipped to, which fix every tensor's sensitivity; ``feature_names``, the
    feature each bound belongs to, in the order of the cohorts' columns (a
    node refuses a cohort whose header differs, ``node.plans.deltab.cohort``); and
    ``max_clipped_fraction`` (default 0.05), the largest share of a node's
    subjects any one feature (or age) may be clipped for before the node
    refuses to take part (``node.preflight``) and the review fails
    (``node.review.clipping``). Bounds that clip most subjects do not fail
    loudly anywhere else: the fit runs on values flattened to the bounds.
    A config without ``feature_names`` (written before bounds were tied to
    names) is refused with a sentence saying so.
``[plan.delta_summary]`` (optional, off unless present with ``enabled = true``)
    each node's Laplace-noised summary of its subjects' delta, released as a
    reviewed output of its own after the model (``node.plans.deltab.delta_summary``).

Errors are :class:`~proto.federation.ConfigError` naming the dotted setting,
like every other setting of the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from node.deltab._params import MODELS
from node.deltab.scaling import Bounds
from node.plans.deltab.delta_summary import DeltaSummarySettings
from proto.federation.checks import MISSING, ConfigError, choice, finite, whole

__all__ = ["DEFAULT_MAX_CLIPPED_FRACTION", "NAN_POLICIES", "ClippingBounds", "DeltabSettings"]

NAN_POLICIES: Final = ("drop", "mean")
_MODEL_KEYS: Final = ("kind", "n_features", "n_components", "nan_policy")
_CLIPPING_KEYS: Final = ("age_low", "age_high", "feature_low", "feature_high")
_OPTIONAL_CLIPPING_KEYS: Final = ("feature_names", "max_clipped_fraction")
# A feature (or age) clipped for more than this share of a node's subjects stops the node.
DEFAULT_MAX_CLIPPED_FRACTION: Final = 0.05

FeatureBound = float | tuple[float, ...]


def _known(table: Mapping[str, Any], name: str, keys: tuple[str, ...]) -> None:
    for key, value in table.items():
        if key not in keys:
            raise ConfigError(
                f"{name}.{key}", value, f"unknown setting; expected one of {', '.join(keys)}"
            )


def _bound(name: str, value: object) -> FeatureBound:
    if isinstance(value, list | tuple):
        if not value:
            raise ConfigError(name, value, "must be a number or a non-empty list of numbers")
        return tuple(finite(f"{name}[{i}]", v) for i, v in enumerate(value))
    return finite(name, value)


def _names(name: str, value: object, n_features: int) -> tuple[str, ...]:
    if value is MISSING:
        raise ConfigError(
            name,
            MISSING,
            "is required: every bound must name the feature it belongs to, so that each node "
            "can check its columns against them (this config was written before bounds were "
            "tied to feature names; make a new one with `zerosum federation init "
            "--feature-bounds`)",
        )
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(name, value, "must be a list of non-empty column names")
    if len(value) != n_features:
        raise ConfigError(name, list(value), f"lists {len(value)} names for {n_features} features")
    seen: set[str] = set()
    for index, item in enumerate(value):
        if item in seen:
            raise ConfigError(f"{name}[{index}]", item, "names a feature twice")
        seen.add(item)
    return tuple(value)


def _fraction(name: str, value: object) -> float:
    number = finite(name, value)
    if not 0.0 <= number < 1.0:
        raise ConfigError(name, value, "must be a fraction in [0, 1), e.g. 0.05 for 5 %")
    return number


@dataclass(frozen=True)
class ClippingBounds:
    """Public clipping bounds: age to [age_low, age_high], each named feature to its [low, high].

    ``feature_names[j]`` is the column whose bounds are ``feature_low[j]``,
    ``feature_high[j]``; ``max_clipped_fraction`` is the refusal threshold of
    the pre-flight and the review.
    """

    age_low: float
    age_high: float
    feature_low: tuple[float, ...]
    feature_high: tuple[float, ...]
    feature_names: tuple[str, ...] = ()
    max_clipped_fraction: float = DEFAULT_MAX_CLIPPED_FRACTION

    def __post_init__(self) -> None:
        if self.feature_names and len(self.feature_names) != len(self.feature_low):
            raise ValueError(
                f"{len(self.feature_names)} feature names for {len(self.feature_low)} bounds"
            )

    @classmethod
    def from_table(cls, table: Mapping[str, Any], n_features: int) -> ClippingBounds:
        """Validate ``[plan.clipping]`` for a model of ``n_features`` features."""
        name = "plan.clipping"
        _known(table, name, _CLIPPING_KEYS + _OPTIONAL_CLIPPING_KEYS)
        values = {}
        for key in _CLIPPING_KEYS:
            if key not in table:
                raise ConfigError(f"{name}.{key}", MISSING, "is required")
            values[key] = table[key]
        names = _names(f"{name}.feature_names", table.get("feature_names", MISSING), n_features)
        threshold = _fraction(
            f"{name}.max_clipped_fraction",
            table.get("max_clipped_fraction", DEFAULT_MAX_CLIPPED_FRACTION),
        )
        low = finite(f"{name}.age_low", values["age_low"])
        high = finite(f"{name}.age_high", values["age_high"])
        if high <= low:
            raise ConfigError(
                f"{name}.age_high", values["age_high"], f"must exceed {name}.age_low = {low!r}"
            )
        lows = cls._expand(f"{name}.feature_low", values["feature_low"], n_features)
        highs = cls._expand(f"{name}.feature_high", values["feature_high"], n_features)
        per_feature = isinstance(values["feature_high"], list | tuple)
        for index, (lo, hi) in enumerate(zip(lows, highs, strict=True)):
            if hi <= lo:
                where = f"[{index}]" if per_feature else ""
                raise ConfigError(
                    f"{name}.feature_high{where}", hi, f"must exceed the lower bound {lo!r}"
                )
        return cls(low, high, lows, highs, names, threshold)

    @staticmethod
    def _expand(name: str, value: object, n_features: int) -> tuple[float, ...]:
        bound = _bound(name, value)
        if isinstance(bound, tuple):
            if len(bound) != n_features:
                raise ConfigError(
                    name, list(bound), f"lists {len(bound)} bounds for {n_features} features"
                )
            return bound
        return (bound,) * n_features

    def to_table(self) -> dict[str, Any]:
        """``[plan.clipping]``: one number for all features when they share their bounds."""

        def compact(values: tuple[float, ...]) -> float | list[float]:
            return values[0] if len(set(values)) == 1 else list(values)

        table: dict[str, Any] = {
            "age_low": self.age_low,
            "age_high": self.age_high,
            "feature_names": list(self.feature_names),
            "feature_low": compact(self.feature_low),
            "feature_high": compact(self.feature_high),
            "max_clipped_fraction": self.max_clipped_fraction,
        }
        if not self.feature_names:
            del table["feature_names"]
        return table

    def bounds(self) -> Bounds:
        """The bounds as the brain-age code takes them."""
        return Bounds(
            feature_lo=np.asarray(self.feature_low, dtype=np.float64),
            feature_hi=np.asarray(self.feature_high, dtype=np.float64),
            age_lo=self.age_low,
            age_hi=self.age_high,
        )


@dataclass(frozen=True)
class DeltabSettings:
    """The brain-age plan's settings, from ``[plan.model]`` and ``[plan.clipping]``."""

    kind: str
    n_features: int
    n_components: int
    nan_policy: str
    clipping: ClippingBounds
    delta_summary: DeltaSummarySettings | None = None

    @classmethod
    def from_tables(cls, tables: Mapping[str, Mapping[str, Any]]) -> DeltabSettings:
        """Validate the plan's tables (``PlanSpec.settings``); ConfigError names the field."""
        for key in tables:
            if key not in ("model", "clipping", "delta_summary"):
                raise ConfigError(
                    f"plan.{key}",
                    tables[key],
                    "unknown table; the deltab plan reads [plan.model], [plan.clipping] and "
                    "[plan.delta_summary]",
                )
        if "model" not in tables:
            raise ConfigError("plan.model", MISSING, "the deltab plan needs a [plan.model] table")
        if "clipping" not in tables:
            raise ConfigError(
                "plan.clipping", MISSING, "the deltab plan needs a [plan.clipping] table"
            )
        model = tables["model"]
        _known(model, "plan.model", _MODEL_KEYS)
        kind = choice("plan.model.kind", model.get("kind", "unbiased"), MODELS)
        for key in ("n_features", "n_components"):
            if key not in model:
                raise ConfigError(f"plan.model.{key}", MISSING, "is required")
        n_features = whole("plan.model.n_features", model["n_features"], 1)
        n_components = whole("plan.model.n_components", model["n_components"], 1)
        if n_components > n_features:
            raise ConfigError(
                "plan.model.n_components",
                n_components,
                f"must not exceed plan.model.n_features = {n_features}",
            )
        nan_policy = choice("plan.model.nan_policy", model.get("nan_policy", "drop"), NAN_POLICIES)
        clipping = ClippingBounds.from_table(tables["clipping"], n_features)
        summary = None
        if "delta_summary" in tables:
            summary = DeltaSummarySettings.from_table(tables["delta_summary"])
        return cls(kind, n_features, n_components, nan_policy, clipping, summary)

    def to_tables(self) -> dict[str, dict[str, Any]]:
        """The plan's tables for ``PlanSpec.settings`` (inverse of :meth:`from_tables`)."""
        return {
            "model": {
                "kind": self.kind,
                "n_features": self.n_features,
                "n_components": self.n_components,
                "nan_policy": self.nan_policy,
            },
            "clipping": self.clipping.to_table(),
            **(
                {"delta_summary": self.delta_summary.to_table()}
                if self.delta_summary is not None
                else {}
            ),
        }

    @staticmethod
    def comments() -> dict[str, str]:
        """One line per setting, for ``dump_federation``."""
        return {
            "plan.model.kind": ", ".join(MODELS),
            "plan.model.n_features": "feature columns every node's cohort has, in the same order",
            "plan.model.n_components": "principal components the model keeps",
            "plan.model.nan_policy": (
                '"drop": leave out subjects with a missing value; "mean": impute global means'
            ),
            "plan.clipping.age_low": "public bounds every value is clipped to; they fix the noise",
            "plan.clipping.feature_names": (
                "the feature each bound belongs to, in the order of every cohort's columns"
            ),
            "plan.clipping.feature_low": "one number for all features, or one per feature",
            "plan.clipping.max_clipped_fraction": (
                "a node refuses to start when a feature is clipped for more of its subjects"
            ),
            "plan.delta_summary.enabled": (
                "release each node's Laplace-noised delta mean, SD and quantiles after the model"
            ),
            "plan.delta_summary.delta_low": "public delta range (years) the deltas are clipped to",
        }
