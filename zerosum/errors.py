"""The root of the errors the commands raise for their user, and the ones several commands share."""

from __future__ import annotations

__all__ = ["CommandError", "KeyFileError", "UsageError"]


class CommandError(Exception):
    """Base class of the commands' own errors; the message is for the user."""


class UsageError(CommandError, ValueError):
    """Options that make sense one by one but not together; names them."""


class KeyFileError(CommandError, ValueError):
    """A file given as a key holds no key of the kind expected; names the file."""
