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
    clipped to, which fix every tensor's sensitivity.
``[plan.delta_summary]`` (optional, off unless present with ``enabled = true``)
    each node's Laplace-noised summary of its subjects' delta, released as a
    reviewed output of its own after the model (``node.delta_summary``).

Errors are :class:`~proto.federation.ConfigError` naming the dotted setting,
like every other setting of the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from node.delta_summary import DeltaSummarySettings
from node.deltab._params import MODELS
from node.deltab.scaling import Bounds
from proto.federation.checks import MISSING, ConfigError, choice, finite, whole

__all__ = ["NAN_POLICIES", "ClippingBounds", "DeltabSettings"]

NAN_POLICIES: Final = ("drop", "mean")
_MODEL_KEYS: Final = ("kind", "n_features", "n_components", "nan_policy")
_CLIPPING_KEYS: Final = ("age_low", "age_high", "feature_low", "feature_high")

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


@dataclass(frozen=True)
class ClippingBounds:
    """Public clipping bounds: age to [age_low, age_high], each feature to its [low, high]."""

    age_low: float
    age_high: float
    feature_low: tuple[float, ...]
    feature_high: tuple[float, ...]

    @classmethod
    def from_table(cls, table: Mapping[str, Any], n_features: int) -> ClippingBounds:
        """Validate ``[plan.clipping]`` for a model of ``n_features`` features."""
        name = "plan.clipping"
        _known(table, name, _CLIPPING_KEYS)
        values = {}
        for key in _CLIPPING_KEYS:
            if key not in table:
                raise ConfigError(f"{name}.{key}", MISSING, "is required")
            values[key] = table[key]
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
        return cls(low, high, lows, highs)

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

        return {
            "age_low": self.age_low,
            "age_high": self.age_high,
            "feature_low": compact(self.feature_low),
            "feature_high": compact(self.feature_high),
        }

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
            "plan.clipping.feature_low": "one number for all features, or one per feature",
            "plan.delta_summary.enabled": (
                "release each node's Laplace-noised delta mean, SD and quantiles after the model"
            ),
            "plan.delta_summary.delta_low": "public delta range (years) the deltas are clipped to",
        }
