"""What a research coordinator sees with ``zerosum coordinator --status``.

The view is read from the SQLite state file alone (opened read-only, without
the coordinator's lock), so it works while the coordinator runs, after it has
stopped, and after a crash. It reports who joined, who never did, who was
dropped and why, and per round its status, who has submitted, who is still
awaited and until when — never any payload or key material.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coordinator.store import Store

__all__ = ["read_status", "render_status"]


def _utc(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def read_status(state: Path, federation_nodes: Sequence[str]) -> dict[str, Any]:
    """The session in ``state`` as plain JSON-ready data (StateFileError if unreadable).

    ``federation_nodes`` are the node ids of the federation config, so that
    nodes that never joined can be named.
    """
    store = Store(state, read_only=True)
    try:
        session = store.session()
        if session is None:
            return {"state_file": str(state), "session": None}
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
                entry["result_sha256"] = result.sha256.hex()
            rounds.append(entry)
        return {
            "state_file": str(state),
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


def render_status(status: dict[str, Any]) -> str:
    """:func:`read_status` as lines of text for a terminal."""
    session = status["session"]
    if session is None:
        return f"{status['state_file']}: no session has started yet\n"
    lines = [
        f"session {session['session_id']} of federation {session['federation_id']}: "
        f"{session['state']}" + (f" — {session['reason']}" if session["reason"] else ""),
        f"  started {session['created']}; join deadline {session['join_deadline']}; "
        f"roster {'final' if session['roster_final'] else 'open'}"
        + (f"; ended {session['ended']}" if session["ended"] else ""),
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
