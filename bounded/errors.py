"""The root of the errors the bounded readers raise."""

from __future__ import annotations

__all__ = ["BoundedReadError"]


class BoundedReadError(Exception):
    """Base class of every refusal of a bounded reader (a file or a text it will not take)."""
