"""The root of the errors proto/ raises.

Every error of the wire protocol, the federation config, the certificates and
the payload layouts derives from :class:`ProtoError` (and, where callers
already expect it, from ``ValueError`` or ``RuntimeError`` as well), so that a
command maps them to its exit status in one place. The bounded readers of
local files and nested text are a package of their own (``bounded``, root
``BoundedReadError``).
"""

from __future__ import annotations

__all__ = ["MalformedMessage", "ProtoError"]


class ProtoError(Exception):
    """Base class of every error raised by proto/."""


class MalformedMessage(ProtoError, ValueError):
    """A protobuf message that cannot be read as its plain type (the sentence names why)."""
