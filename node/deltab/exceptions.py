"""Warnings and exceptions raised by the brain-age estimator.

Bad arguments raise ``ValueError`` (or a subclass below) with a sentence that
names the argument and the offending value; conditions the estimator can work
around (a feature without variance, a degenerate quadratic term) are reported
with :class:`DeltabWarning` so that callers can filter them precisely.
"""

from __future__ import annotations

__all__ = ["DeltabWarning", "ModelFileError", "NotFittedError"]


class DeltabWarning(UserWarning):
    """The estimator adjusted the problem (e.g. left out a constant feature) and carried on."""


class NotFittedError(ValueError, AttributeError):
    """A prediction was requested from a model that has not been fitted (or loaded)."""


class ModelFileError(ValueError):
    """A saved model is malformed, of another format or version, or internally inconsistent."""
