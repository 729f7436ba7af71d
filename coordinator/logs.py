"""The coordinator's log: one line per event, as text for people or JSON for collectors.

Every line has a time (UTC), a level (info, warning, error), an event name,
the session id, the node it concerns (empty when none) and a sentence. The
session's transitions arrive as :class:`Note` strings, which carry their
event name and node; the server's own events (a caller at its call limit, a
silent stream ended, an unexpected error) arrive through
:meth:`CoordinatorLog.event`.

Text (the default) is ``2026-01-01T12:00:00Z zerosum coordinator: <sentence>``,
with ``warning:`` or ``error:`` before the sentence when it is one. JSON
(``zerosum coordinator --log-format json``) is one object per line::

    {"time": "2026-01-01T12:00:00.123Z", "level": "info", "event": "node-joined",
     "session": "9f…", "node": "site-a", "message": "node 'site-a' joined (1 of 3, …)"}

JSON escapes every control character, so a line is one line whatever a
sentence quotes.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
from collections.abc import Callable
from typing import Protocol, TextIO

__all__ = ["LOG_FORMATS", "CoordinatorLog", "EventLog", "Note", "as_event_log"]

LOG_FORMATS = ("text", "json")
LEVELS = ("info", "warning", "error")


class Note(str):
    """A log sentence that also names its event and the node it concerns."""

    event: str
    node: str

    def __new__(cls, text: str, *, event: str = "transition", node: str = "") -> Note:
        note = super().__new__(cls, text)
        note.event = event
        note.node = node
        return note


class EventLog(Protocol):
    """Where the server's events go: plain sentences, or events with their fields."""

    def __call__(self, line: str) -> None: ...

    def event(self, event: str, message: str, *, level: str = "info", node: str = "") -> None: ...


class _PlainLines:
    """An :class:`EventLog` over a callable that takes sentences only."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log

    def __call__(self, line: str) -> None:
        self._log(line)

    def event(self, event: str, message: str, *, level: str = "info", node: str = "") -> None:
        self._log(message if level == "info" else f"{level}: {message}")


def as_event_log(log: Callable[[str], None] | None) -> EventLog | None:
    """``log`` as an :class:`EventLog` (a :class:`CoordinatorLog` is one already)."""
    if log is None:
        return None
    if isinstance(log, CoordinatorLog):
        return log
    return _PlainLines(log)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CoordinatorLog:
    """Writes the coordinator's log lines to ``stream`` in ``log_format`` (text or json).

    ``session`` is filled in once the session id is known. Thread-safe: each
    line is written and flushed whole.
    """

    def __init__(
        self,
        log_format: str = "text",
        *,
        stream: TextIO | None = None,
        prefix: str = "zerosum coordinator",
        now: Callable[[], dt.datetime] = _utc_now,
    ) -> None:
        if log_format not in LOG_FORMATS:
            raise ValueError(f"log format {log_format!r}: must be one of {', '.join(LOG_FORMATS)}.")
        self.log_format = log_format
        self.session = ""
        self._stream = stream
        self._prefix = prefix
        self._now = now
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        """A sentence; a :class:`Note` brings its event and node."""
        self.event(
            getattr(line, "event", "message"), str(line), node=str(getattr(line, "node", ""))
        )

    def event(self, event: str, message: str, *, level: str = "info", node: str = "") -> None:
        """One line for ``event``."""
        if level not in LEVELS:
            raise ValueError(f"log level {level!r}: must be one of {', '.join(LEVELS)}.")
        moment = self._now()
        if self.log_format == "json":
            line = json.dumps(
                {
                    "time": moment.strftime("%Y-%m-%dT%H:%M:%S.")
                    + f"{moment.microsecond // 1000:03d}Z",
                    "level": level,
                    "event": event,
                    "session": self.session,
                    "node": node,
                    "message": message,
                },
                ensure_ascii=True,
            )
        else:
            stamp = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
            kind = "" if level == "info" else f"{level}: "
            line = f"{stamp} {self._prefix}: {kind}{message}"
        stream = self._stream or sys.stderr
        with self._lock:
            print(line, file=stream, flush=True)
