"""Checks shared by every part of the federation config: one error, one rule per kind of value.

Every setting is validated once, at the edge, and anything wrong raises
:class:`ConfigError` naming the dotted setting and its value, e.g.
``privacy.epsilon = -1.0: must be greater than 0``. The helpers here are
also what a plan uses to validate its own tables (``plan.model``, ...), so
its errors read the same.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Final

from proto.errors import ProtoError

__all__ = [
    "MISSING",
    "ConfigError",
    "choice",
    "finite",
    "positive",
    "split_address",
    "validate_identifier",
    "whole",
]

# Node and federation ids name folders and travel in length-prefixed fields:
# start with a letter or digit (never "." or ".."), at most 64 characters.
_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ID_RULE: Final = (
    "must be 1 to 64 characters from A-Z, a-z, 0-9, '_', '.', '-', starting with a letter or digit"
)
_DNS_LABEL: Final = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_RE: Final = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Final = _Missing()


class ConfigError(ProtoError, ValueError):
    """A federation setting is missing, of the wrong type, or out of range.

    ``field`` is the dotted TOML path (``privacy.epsilon``, ``nodes[2].node_id``),
    ``value`` the offending value (:data:`MISSING` when absent) and ``reason``
    what a valid value looks like.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        if value is MISSING:
            message = f"{field} is missing: {reason}"
        else:
            shown = repr(value)
            if len(shown) > 80:
                shown = shown[:77] + "..."
            message = f"{field} = {shown}: {reason}"
        super().__init__(message)


def finite(name: str, value: object) -> float:
    """``value`` as a finite float (ints accepted, booleans not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, value, "must be a number")
    result = float(value)
    if not math.isfinite(result):
        raise ConfigError(name, value, "must be a finite number")
    return result


def positive(name: str, value: object) -> float:
    """``value`` as a finite float greater than 0."""
    result = finite(name, value)
    if result <= 0:
        raise ConfigError(name, value, "must be greater than 0")
    return result


def whole(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi] (booleans and floats refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, "must be a whole number")
    if value < lo or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise ConfigError(name, value, f"must be {bound}")
    return value


def choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ConfigError(name, value, f"must be one of {listed}")
    return value


def validate_identifier(name: str, value: object) -> str:
    """Return ``value`` if it is a valid node or federation id, else raise ConfigError.

    Ids name folders and travel in length-prefixed fields: 1 to 64 characters
    from A-Z, a-z, 0-9, '_', '.', '-', the first a letter or digit.
    """
    if not isinstance(value, str) or _ID_RE.fullmatch(value) is None:
        raise ConfigError(name, value, _ID_RULE)
    return value


def split_address(name: str, value: object) -> tuple[str, int]:
    """``host:port`` split and checked (a DNS name, IPv4 or bracketed IPv6 address)."""
    rule = "must be host:port (a DNS name, an IPv4 address or a bracketed IPv6 address)"
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(name, value, rule)
    host, _, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ConfigError(name, value, rule) from None
        host = host[1:-1]
    elif _HOST_RE.fullmatch(host) is None or len(host) > 253:
        raise ConfigError(name, value, rule)
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(name, value, "port must be a whole number between 1 and 65535")
    return host, int(port_text)
