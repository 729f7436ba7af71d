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

gRPC's C core writes its own lines to stderr (a refused TLS handshake among
them, which never reaches Python otherwise); :class:`CoreLogRelay` turns
them into events of this log (``tls-refused``, ``grpc``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from typing import Protocol, TextIO

__all__ = [
    "LOG_FORMATS",
    "CoordinatorLog",
    "CoreLogRelay",
    "EventLog",
    "Note",
    "as_event_log",
    "core_line_event",
]

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


# gRPC's C core logs through abseil: "I1201 22:01:22.569776   10914 file.cc:2563] text".
_CORE_LINE = re.compile(r"^(?P<severity>[IWEF])\d{4} [\d:.]+\s+\d+ [^\]\s]+\] (?P<text>.*)$")
_HANDSHAKE = re.compile(r"Handshake failed with (?:fatal )?error (?P<error>.*)$")


def core_line_event(line: str, *, keep_info: bool = False) -> tuple[str, str, str] | None:
    """(event, level, sentence) for a line of gRPC's C core, or None to drop it.

    A failed TLS handshake becomes ``tls-refused``: the client's certificate
    was not issued by this federation's CA, or the client does not trust this
    coordinator's certificate (it holds another federation's CA). Other
    warnings and errors of the C core become one ``grpc`` line each without
    the file name and thread id; its informational lines are dropped unless
    ``keep_info`` (an operator tracing gRPC with ``GRPC_TRACE``).
    """
    found = _CORE_LINE.match(line)
    if found is None:
        return None
    severity, text = found["severity"], found["text"].strip()
    if text.startswith("Log level INFO is not suitable"):
        return None  # gRPC's note on the level the coordinator asks for on purpose
    handshake = _HANDSHAKE.search(text)
    if handshake is not None:
        error = handshake["error"]
        reason = error.rsplit(":OPENSSL_internal:", 1)[-1] if "OPENSSL_internal" in error else error
        if "CERTIFICATE_VERIFY_FAILED" in error:
            why = (
                "the client's certificate was not issued by this federation's CA (a node "
                "holding another federation's files, or not a node)"
            )
        else:
            why = (
                "the client ended the handshake, as one does that does not trust this "
                "coordinator's certificate (a node holding another federation's CA)"
            )
        return "tls-refused", "warning", f"refused a TLS handshake: {why} [{reason}]"
    if severity == "I" and not keep_info:
        return None
    if severity == "I":
        return "grpc", "info", f"gRPC: {text}"
    return "grpc", "error" if severity in "EF" else "warning", f"gRPC: {text}"


class CoreLogRelay:
    """Turns what gRPC's C core writes to stderr into the coordinator's own log lines.

    The C core writes to file descriptor 2 directly, past Python. While the
    relay runs, descriptor 2 is a pipe read by a thread: each C-core line
    goes through :func:`core_line_event` into ``log``, and every other line
    (a fault handler's dump, say) is passed on unchanged to the original
    stderr, which ``sys.stderr`` writes to meanwhile. :meth:`stop` puts
    descriptor 2 back and drains the pipe. Set ``GRPC_VERBOSITY=INFO``
    before gRPC is loaded for the C core to report failed handshakes at all.
    """

    def __init__(self, log: CoordinatorLog, *, keep_info: bool = False) -> None:
        self._log = log
        self._keep_info = keep_info
        self._saved: int | None = None
        self._stream: TextIO | None = None
        self._previous: TextIO | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        sys.stderr.flush()
        self._saved = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._stream = open(  # noqa: SIM115 (closed in stop)
            os.dup(self._saved), "w", buffering=1, encoding="utf-8", errors="replace"
        )
        self._previous = sys.stderr
        sys.stderr = self._stream
        self._thread = threading.Thread(
            target=self._pump, args=(read_end,), name="zerosum-core-log", daemon=True
        )
        self._thread.start()

    def _pump(self, read_end: int) -> None:
        with open(read_end, "rb") as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                event = core_line_event(line, keep_info=self._keep_info)
                if event is not None:
                    self._log.event(event[0], event[2], level=event[1])
                elif _CORE_LINE.match(line) is None and self._stream is not None:
                    with contextlib.suppress(OSError, ValueError):
                        print(line, file=self._stream, flush=True)

    def stop(self) -> None:
        if self._saved is None:
            return
        os.dup2(self._saved, 2)  # closes the pipe's last write end: the thread sees EOF
        os.close(self._saved)
        self._saved = None
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._previous is not None:
            sys.stderr = self._previous
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def __enter__(self) -> CoreLogRelay:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
