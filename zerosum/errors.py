"""The root of the errors the commands raise for their user."""

from __future__ import annotations

__all__ = ["CommandError"]


class CommandError(Exception):
    """Base class of the commands' own errors; the message is for the user."""
