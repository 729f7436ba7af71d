"""Text cells of a written table, made safe for the spreadsheet that will open it.

A CSV written here is likely to be opened in a spreadsheet. A cell that
starts with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage return before
one) is a formula there: ``=HYPERLINK("http://...")`` becomes a live link,
and worse runs commands (OWASP, "CSV Injection"). Subject ids come from input
files, so :func:`spreadsheet_safe` is applied to every text cell written back.
"""

from __future__ import annotations

import math

__all__ = ["spreadsheet_safe"]

# A cell starting with one of these is a formula to a spreadsheet (OWASP, "CSV
# Injection"): "=HYPERLINK(...)", "+cmd|...", "@SUM(...)", a tab or carriage
# return before any of them.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(cell: str) -> str:
    """``cell`` as a spreadsheet will show it, not run it.

    A cell that starts like a formula (``=``, ``+``, ``-``, ``@``, tab or
    carriage return) gets a leading apostrophe, the OWASP rule for CSV
    injection; a cell that is a number ("-3.2", "+44", "-1e5") is left as it
    is, so it stays a number. Values the tools compute are written as numbers
    and never pass through here; only text from an input file (subject ids) does.
    """
    if cell.startswith(_FORMULA_STARTS) and not _is_number(cell):
        return "'" + cell
    return cell


def _is_number(cell: str) -> bool:
    try:
        value = float(cell)
    except ValueError:
        return False
    return math.isfinite(value) and cell == cell.strip()
