"""What a review finds: one line per check, each passing, noted, for a human look, or failing.

A review's exit status is the worst level found: 0 when every check passes
(notes included), 1 when something needs a human look (a check could not be
made, with the reason named), 2 when a check fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["EXIT_CODES", "Finding", "Level", "exit_code", "fail", "look", "note", "passed"]

Level = Literal["pass", "note", "look", "fail"]
EXIT_CODES: Final[dict[Level, int]] = {"pass": 0, "note": 0, "look": 1, "fail": 2}


@dataclass(frozen=True)
class Finding:
    """One check's outcome: which check, how it went, and a sentence saying what was found."""

    check: str
    level: Level
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "level": self.level, "message": self.message}


def passed(check: str, message: str) -> Finding:
    return Finding(check, "pass", message)


def note(check: str, message: str) -> Finding:
    return Finding(check, "note", message)


def look(check: str, message: str) -> Finding:
    return Finding(check, "look", message)


def fail(check: str, message: str) -> Finding:
    return Finding(check, "fail", message)


def exit_code(findings: tuple[Finding, ...] | list[Finding]) -> int:
    """0 pass, 1 needs a human look, 2 fail: the worst level among ``findings``."""
    return max((EXIT_CODES[f.level] for f in findings), default=0)
