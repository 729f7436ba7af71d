"""How deeply a TOML or JSON document nests, found before (and after) it is parsed.

Python's ``json`` and ``tomllib`` parse nested arrays and tables by recursion:
a file of 50,000 ``[`` raises RecursionError from deep inside the parser (and
code that walks the result recurses as deeply). No file zerosum reads nests
more than a few levels, so :func:`check_text_nesting` scans the text once for
its deepest bracket, skipping strings and comments, and refuses anything
deeper than a limit with one sentence naming the file. TOML can also nest by
dotted keys and table headers (``a.b.c.d = 1``, ``[a.b.c.d]``), which have no
brackets; :func:`check_value_nesting` measures the parsed value without
recursion. :func:`parse_json` does both for a JSON document.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final, Literal

from bounded.errors import BoundedReadError

__all__ = [
    "MAX_NESTING",
    "NestingError",
    "check_text_nesting",
    "check_value_nesting",
    "parse_json",
]

# The deepest legitimate document (a plan table holding an array of arrays
# inside the federation config) nests 4 levels; 64 leaves room and stays far
# below Python's recursion limit of 1000.
MAX_NESTING: Final = 64

# Tokens that matter for nesting: strings (skipped whole, so brackets inside
# them do not count), comments (TOML only) and the brackets themselves.
_JSON_TOKENS: Final = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)
_TOML_TOKENS: Final = re.compile(
    r'"""(?:[^\\]|\\.)*?(?:"""|$)'
    r"|'''.*?(?:'''|$)"
    r'|"(?:[^"\\\n]|\\.)*"?'
    r"|'[^'\n]*'?"
    r"|#[^\n]*"
    r"|[\[\]{}]",
    re.DOTALL,
)


class NestingError(BoundedReadError, ValueError):
    """A document nests deeper than its reader allows; names the document and the limit."""


def _refuse(what: str, limit: int, where: str = "") -> NestingError:
    return NestingError(
        f"{what} nests arrays or tables more than {limit} levels deep{where}; none that "
        "zerosum writes or reads nests that deep, so it is not read"
    )


def check_text_nesting(
    text: str, *, what: str, syntax: Literal["json", "toml"], limit: int = MAX_NESTING
) -> None:
    """Raise :class:`NestingError` if ``text`` opens more than ``limit`` brackets at once.

    Counts ``[`` and ``{`` outside strings (and, for TOML, outside comments).
    Unbalanced text is left for the parser to report; this only bounds depth.
    """
    tokens = _JSON_TOKENS if syntax == "json" else _TOML_TOKENS
    depth = 0
    for match in tokens.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > limit:
                line = text.count("\n", 0, match.start()) + 1
                raise _refuse(what, limit, f" (line {line})")
        elif token in ("]", "}"):
            depth = max(0, depth - 1)


def check_value_nesting(value: object, *, what: str, limit: int = MAX_NESTING) -> None:
    """Raise :class:`NestingError` if the parsed ``value`` holds lists or dicts over ``limit`` deep.

    Walks the value with an explicit stack, so the walk itself cannot overflow.
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > limit:
            raise _refuse(what, limit)
        stack.extend((child, depth + 1) for child in children)


def parse_json(
    text: str,
    *,
    what: str,
    limit: int = MAX_NESTING,
    parse_constant: Callable[[str], Any] | None = None,
) -> Any:
    """``json.loads(text)`` once the text is known to nest at most ``limit`` deep.

    Raises :class:`NestingError` for deeper text and ``json.JSONDecodeError``
    (a ValueError) for text that is not JSON.
    """
    check_text_nesting(text, what=what, syntax="json", limit=limit)
    return json.loads(text, parse_constant=parse_constant)
