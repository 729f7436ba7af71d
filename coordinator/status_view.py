"""What a research coordinator sees with ``zerosum coordinator --status``.

The view is read from the SQLite state file alone (opened read-only, without
the coordinator's lock), so it works while the coordinator runs, after it has
stopped, and after a crash. It reports who joined, who never did, who was
dropped and why, and per round its status, who has submitted, who is still
awaited and until when — never any payload or key material.

The state file records what the coordinator last wrote, so a coordinator
killed mid-session still reads "running". The view therefore also says when
the state was last written (the newer modification time of the file and its
write-ahead log, and the latest timestamp recorded in it) and whether a
coordinator process is alive. The coordinator holds an exclusive ``flock`` on
``<state>.lock`` for its whole life and the operating system releases it when
the process ends, however it ends (coordinator/store/schema.py); so a non-blocking
shared lock on that file, taken and dropped at once, fails exactly while a
coordinator is alive. (A coordinator starting in the microseconds the test
lock is held would refuse to start, saying the state is in use; started again,
it runs.)
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coordinator.store import Store, lock_path_for

__all__ = ["coordinator_alive", "lock_path", "read_status", "render_status"]

_ENDED = ("completed", "failed")


def _utc(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def lock_path(state: Path) -> Path:
    """The file a running coordinator keeps locked (``<state>.lock``)."""
    return lock_path_for(state)


def coordinator_alive(state: Path) -> bool | None:
    """Whether a coordinator process holds ``state`` now; None if that cannot be told.

    Tries a non-blocking shared lock on the coordinator's lock file and drops
    it at once: refused means a live coordinator holds its exclusive lock. A
    missing lock file means no coordinator ever ran on this state here. The
    file is opened read-only and never created.
    """
    return lock_held(lock_path(state))


def lock_held(lock: Path) -> bool | None:
    """Whether some process holds an flock on ``lock`` now; None when that cannot be told."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _written_ms(state: Path) -> int | None:
    """The newest modification time of the state file and its write-ahead log, in ms."""
    times = []
    for path in (state, state.with_name(state.name + "-wal")):
        try:
            times.append(path.stat().st_mtime_ns // 1_000_000)
        except OSError:
            continue
    return max(times) if times else None


def _liveness(state: Path) -> dict[str, Any]:
    alive = coordinator_alive(state)
    now_ms = time.time_ns() // 1_000_000
    written = _written_ms(state)
    return {
        "coordinator_process": {True: "running", False: "not running", None: "unknown"}[alive],
        "checked": _utc(now_ms),
        "state_written": _utc(written),
        "state_written_seconds_ago": None if written is None else (now_ms - written) / 1000,
    }


def _latest_event_ms(store: Store) -> int | None:
    """The latest timestamp the coordinator recorded: a join, a round, an upload, a result."""
    session = store.session()
    if session is None:
        return None
    stamps = [session.created_ms, session.ended_ms or 0]
    stamps += [m.joined_ms for m in store.members()]
    for r in store.rounds():
        stamps.append(r.opened_ms)
        stamps += [u.received_ms for u in store.uploads(r.round_index)]
        result = store.result(r.round_index)
        if result is not None:
            stamps.append(result.computed_ms)
    return max(stamps)


def read_status(state: Path, federation_nodes: Sequence[str]) -> dict[str, Any]:
    """The session in ``state`` as plain JSON-ready data (StateFileError if unreadable).

    ``federation_nodes`` are the node ids of the federation config, so that
    nodes that never joined can be named.
    """
    store = Store(state, read_only=True)
    try:
        session = store.session()
        liveness = _liveness(state)
        if session is None:
            return {"state_file": str(state), "session": None, **liveness}
        members = store.members()
        joined = {m.node_id for m in members}
        live = {m.node_id for m in members if m.status == "live"}
        dropped_in = {m.node_id: m.dropped_round for m in members if m.status == "dropped"}
        rounds = []
        for r in store.rounds():
            submitted = sorted(u.node_id for u in store.uploads(r.round_index))
            entry: dict[str, Any] = {
                "round_index": r.round_index,
                "name": r.name,
                "status": r.status,
                "participants": list(r.participants),
                # Participants still expected to count in this round: not dropped in it
                # (or earlier) without having uploaded it.
                "expected": [
                    n
                    for n in r.participants
                    if n in live or n in submitted or (dropped_in.get(n) or 0) > r.round_index
                ],
                "submitted": submitted,
                "awaited": [
                    n
                    for n in r.participants
                    if n in live and n not in submitted and r.status == "open"
                ],
                "deadline": _utc(r.deadline_ms),
                "unmask_attempt": r.unmask_attempt,
                "reason": r.reason,
            }
            result = store.result(r.round_index)
            if result is not None:
                entry["survivors"] = list(result.survivors)
                entry["dropped"] = list(result.dropped)
                entry["result_digest"] = result.digest.hex()
            rounds.append(entry)
        return {
            "state_file": str(state),
            **liveness,
            "latest_event": _utc(_latest_event_ms(store)),
            "session": {
                "session_id": session.session_id,
                "federation_id": session.federation_id,
                "config_hash": session.config_hash.hex(),
                "state": session.state,
                "reason": session.reason,
                "created": _utc(session.created_ms),
                "join_deadline": _utc(session.join_deadline_ms),
                "roster_final": session.roster_final,
                "ended": _utc(session.ended_ms),
                "current_round": session.current_round,
            },
            "nodes": [
                {
                    "node_id": m.node_id,
                    "status": m.status,
                    "joined": _utc(m.joined_ms),
                    "dropped_round": m.dropped_round,
                    "dropped_reason": m.dropped_reason or None,
                }
                for m in members
            ],
            "never_joined": sorted(set(federation_nodes) - joined),
            "rounds": rounds,
        }
    finally:
        store.close()


def _names(nodes: Sequence[str]) -> str:
    return ", ".join(nodes) if nodes else "none"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "at an unknown time"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def _process_line(status: dict[str, Any]) -> str:
    process = status["coordinator_process"]
    session = status["session"]
    lock = Path(status["state_file"]).name + ".lock"
    if process == "running":
        return f"coordinator process: running (it holds {lock})"
    if process == "unknown":
        return f"coordinator process: unknown ({lock} could not be tested)"
    if session is not None and session["state"] in _ENDED:
        return "coordinator process: not running (the session has ended)"
    return (
        "coordinator process: NOT RUNNING — the session is not over but no process holds "
        f"{lock}: the coordinator was stopped or crashed; start it again with the same "
        "arguments to resume"
    )


def render_status(status: dict[str, Any]) -> str:
    """:func:`read_status` as lines of text for a terminal."""
    session = status["session"]
    written = (
        f"state last written {status['state_written']} "
        f"({_ago(status['state_written_seconds_ago'])})"
    )
    if session is None:
        return (
            f"{status['state_file']}: no session has started yet\n  {written}\n"
            f"  {_process_line(status)}\n"
        )
    state = session["state"]
    if status["coordinator_process"] == "not running" and state not in _ENDED:
        state += " (as last recorded)"
    lines = [
        f"session {session['session_id']} of federation {session['federation_id']}: "
        f"{state}" + (f" — {session['reason']}" if session["reason"] else ""),
        f"  started {session['created']}; join deadline {session['join_deadline']}; "
        f"roster {'final' if session['roster_final'] else 'open'}"
        + (f"; ended {session['ended']}" if session["ended"] else ""),
        f"  {written}; latest event recorded {status['latest_event']}",
        f"  {_process_line(status)}",
        "",
        "nodes:",
    ]
    for node in status["nodes"]:
        line = f"  {node['node_id']:<16} {node['status']:<8} joined {node['joined']}"
        if node["status"] == "dropped":
            line += f"; dropped in round {node['dropped_round']}: {node['dropped_reason']}"
        lines.append(line)
    if status["never_joined"]:
        lines.append(f"  never joined: {_names(status['never_joined'])}")
    lines += ["", "rounds:"]
    if not status["rounds"]:
        lines.append("  none opened yet")
    for r in status["rounds"]:
        head = f"  {r['round_index']:>3} {r['name']:<22} {r['status']:<10}"
        submitted = f"{len(r['submitted'])} of {len(r['expected'])} submitted"
        line = f"{head} {submitted}"
        if r["status"] == "open":
            line += f"; awaiting {_names(r['awaited'])} until {r['deadline']}"
        if r["status"] == "unmask":
            line += f"; unmask attempt {r['unmask_attempt']}"
        if r.get("dropped"):
            line += f"; aggregated over {_names(r['survivors'])} (dropped {_names(r['dropped'])})"
        if r["reason"]:
            line += f" — {r['reason']}"
        lines.append(line)
    return "\n".join(lines) + "\n"
