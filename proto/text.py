"""Text from a peer, made safe to print: no control characters, no escape sequences, bounded.

A coordinator's status reason, another node's withdrawal reason or a gRPC
error's details are written by someone else and end up on an operator's
terminal and in log files. Written raw, ``ESC [ 2 J`` clears the screen,
``ESC ] 8 ;; url`` plants a link, a carriage return overwrites the line
before it, a newline forges a log entry and U+202E (right-to-left override)
turns the text around. :func:`sanitise_text` writes every such character as
a visible escape (``\\x1b``, ``\\n``, ``\\u202e``), so an escape sequence loses
its ESC and prints as harmless text, and cuts the result to ``limit``
characters. Printable text, accents and non-Latin scripts pass unchanged.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["sanitise_text"]

_ELLIPSIS: Final = "…"
# Unicode categories never printed as themselves: controls (C0, DEL, C1),
# format characters (bidirectional overrides and isolates, zero-width joiners),
# line and paragraph separators, surrogates and unassigned or private code points.
_UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def sanitise_text(text: str, limit: int = 500) -> str:
    """``text`` with every unprintable character escaped, at most ``limit`` characters long.

    Controls, format characters (U+202E and its kin), line separators and
    unassigned code points become ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN``
    (newline, carriage return and tab as ``\\n``, ``\\r``, ``\\t``); a backslash
    is doubled, so an escape in the output is never ambiguous. A longer
    result is cut and ends in "…" (still ``limit`` characters in all). A value
    that is not a string (a peer's field of the wrong type) is shown by its
    ``repr``, sanitised the same way.
    """
    if limit < 1:
        raise ValueError(f"limit = {limit}: must be at least 1 character")
    if not isinstance(text, str):
        text = repr(text)
    out: list[str] = []
    length = 0
    for char in text:
        piece = _escape(char) if _unsafe(char) else char
        if length + len(piece) > limit:
            while out and length + len(_ELLIPSIS) > limit:
                length -= len(out.pop())
            out.append(_ELLIPSIS)
            return "".join(out)
        out.append(piece)
        length += len(piece)
    return "".join(out)


def _unsafe(char: str) -> bool:
    if char == "\\":
        return True
    if " " <= char <= "~":
        return False
    return unicodedata.category(char) in _UNSAFE_CATEGORIES
