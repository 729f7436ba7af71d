"""Warnings and exceptions raised by the brain-age estimator.

Bad arguments raise ``ValueError`` with a sentence that names the argument and
the offending value; what the brain-age library itself refuses (an unfitted
model, a bad model file, bad input tables, values out of range) is a
:class:`DeltabError`, the library's one root, itself a ``ValueError`` and a
:class:`node.errors.NodeError` (the node package's root).
Conditions the estimator can work around (a feature without variance, a
degenerate quadratic term) are reported with :class:`DeltabWarning` so that
callers can filter them precisely.
"""

from __future__ import annotations

from node.errors import NodeError

__all__ = ["DeltabError", "DeltabWarning", "ModelFileError", "NotFittedError"]


class DeltabWarning(UserWarning):
    """The estimator adjusted the problem (e.g. left out a constant feature) and carried on."""


class DeltabError(NodeError, ValueError):
    """The root of what the brain-age library refuses; each names the field or file and value."""


class NotFittedError(DeltabError, AttributeError):
    """A prediction was requested from a model that has not been fitted (or loaded)."""


class ModelFileError(DeltabError):
    """A saved model is malformed, of another format or version, or internally inconsistent."""
