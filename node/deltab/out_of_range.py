"""Subjects outside a model's training bounds: clipped to them, or refused, and counted.

A federated brain-age model is fitted on values clipped to the federation's
public bounds (``[plan.clipping]``), so it has never seen a value beyond
them, and its linear terms extrapolate without limit: one feature ten times
its usual size moves the predicted delta by decades. A model file carries
those bounds (``node.deltab.persist``, ``training_bounds``); before a
prediction :func:`fit_to_training_bounds` clips every feature to them —
exactly what the fit did to the training data — or, with ``refuse``, raises
:class:`OutOfRangeError` naming the features, and in either case reports how
many subjects and which features lay outside. Missing values (NaN) are left
as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from node.deltab._checks import FloatArray
from node.deltab.exceptions import DeltabError

__all__ = ["OUT_OF_RANGE_CHOICES", "OutOfRange", "OutOfRangeError", "fit_to_training_bounds"]

OUT_OF_RANGE_CHOICES = ("clip", "refuse")


class OutOfRangeError(DeltabError):
    """Values lie outside the model's training bounds and the caller asked to refuse them."""


@dataclass(frozen=True)
class OutOfRange:
    """How many subjects had a value outside the training bounds, and in which features."""

    n_subjects: int
    affected: int  # subjects with at least one value outside
    by_feature: tuple[tuple[str, int], ...]  # (feature, values outside), only those with any

    @property
    def any(self) -> bool:
        return self.affected > 0

    def sentence(self, source: str, action: str) -> str:
        """One sentence: ``N of M subjects of SOURCE ...``, features by name, and ``action``."""
        shown = ", ".join(f"{name} {count}" for name, count in self.by_feature[:5])
        more = len(self.by_feature) - 5
        if more > 0:
            shown += f" and {more} more feature{'s' if more > 1 else ''}"
        return (
            f"{self.affected} of {self.n_subjects} subjects of {source} have values outside the "
            f"model's training bounds ({len(self.by_feature)} feature"
            f"{'s' if len(self.by_feature) != 1 else ''}, values outside: {shown}); {action}"
        )


def fit_to_training_bounds(
    features: FloatArray,
    bounds: tuple[FloatArray, FloatArray] | None,
    names: Sequence[str],
    *,
    policy: str = "clip",
    source: str = "the data",
) -> tuple[FloatArray, OutOfRange]:
    """``features`` clipped to ``bounds`` (unchanged without bounds) and what lay outside.

    ``policy`` "refuse" raises :class:`OutOfRangeError` instead of clipping
    when any value lies outside.
    """
    if policy not in OUT_OF_RANGE_CHOICES:
        raise ValueError(f"policy must be one of {OUT_OF_RANGE_CHOICES}; got {policy!r}.")
    values = np.asarray(features, dtype=np.float64)
    if bounds is None:
        return values, OutOfRange(int(values.shape[0]), 0, ())
    low, high = bounds
    with np.errstate(invalid="ignore"):
        outside = (values < low) | (values > high)
    per_feature = outside.sum(axis=0)
    report = OutOfRange(
        n_subjects=int(values.shape[0]),
        affected=int(outside.any(axis=1).sum()),
        by_feature=tuple((str(names[j]), int(n)) for j, n in enumerate(per_feature.tolist()) if n),
    )
    if report.any and policy == "refuse":
        raise OutOfRangeError(
            report.sentence(
                source,
                "refused (--out-of-range refuse); use --out-of-range clip "
                "to clip them to the bounds, as the fit did.",
            )
        )
    # One copy of the features: clipped, then NaN (missing) put back where it was.
    clipped: FloatArray = np.clip(values, low, high)
    np.copyto(clipped, values, where=np.isnan(values))
    return clipped, report
