"""The root of the errors proto/ raises.

Every error of the wire protocol, the federation config, the certificates and
the payload layouts derives from :class:`ProtoError` (and, where callers
already expect it, from ``ValueError`` or ``RuntimeError`` as well), so that a
command maps them to its exit status in one place. ``proto.nesting`` keeps
its ``NestingError`` on ``ValueError`` alone: that bounded reader imports only
the standard library, so that ``node.deltab`` can use it inside a TRE.
"""

from __future__ import annotations

__all__ = ["ProtoError"]


class ProtoError(Exception):
    """Base class of every error raised by proto/ (except ``proto.nesting``'s)."""
