"""What ``zerosum node --status`` reads from a node's state folder, and how it is shown.

Read-only and offline: the state folder alone (``node.records.state_folder``) tells
which sessions this node took part in and how far each got, what its ledger
holds (releases per session, and per observer class the ε used and left of
``privacy.epsilon_budget``, with the class that binds), the last failure it
recorded, and whether a node process holds the folder now (a non-blocking
shared lock on ``STATE/node.lock``, taken and dropped at once, as
``coordinator.status_view`` does for the coordinator). Nothing is created:
a folder that does not exist reads as a node that has never run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proto.federation import FederationConfig

__all__ = ["node_alive", "read_node_status", "render_node_status"]


def node_alive(lock: Path) -> bool | None:
    """Whether a node process holds ``lock`` now; None when that cannot be told."""
    from coordinator.status_view import lock_held  # the same flock probe as --status there

    return lock_held(lock)


def read_node_status(config: FederationConfig, node_id: str, state: Path) -> dict[str, Any]:
    """The node's status as JSON-ready data (raises SessionStateError, LedgerError)."""
    from node.records.ledger import PrivacyLedger
    from node.records.state_folder import NodeState
    from zerosum.commands.ledger import budget_left

    folder = NodeState(state, node_id)
    sessions = folder.sessions()
    releases: dict[str, int] = {}
    totals: list[dict[str, Any]] = []
    left: dict[str, float] = {}
    binding: str | None = None
    if folder.ledger_path.exists():
        ledger = PrivacyLedger.open(folder.ledger_path, node_id, config.privacy.delta)
        for entry in ledger.entries:
            if entry.kind in ("release", "laplace"):
                releases[entry.session_id] = releases.get(entry.session_id, 0) + 1
        left, binding = budget_left(ledger, config)
        totals = [
            {
                "observer": t.label,
                "releases": t.releases,
                "used": t.epsilon if t.epsilon != float("inf") else "inf",
                "left": left.get(t.label),
                "binds": t.label == binding,
            }
            for t in ledger.totals()
        ]
    failure = folder.last_failure()
    return {
        "node_id": node_id,
        "state": str(state),
        "running": node_alive(folder.lock_path),
        "epsilon_budget": config.privacy.epsilon_budget,
        "sessions": [
            {
                "session_id": s.session_id,
                "joined": s.joined,
                "updated": s.updated,
                "stage": s.stage,
                "progress": s.progress(),
                "releases": releases.get(s.session_id, 0),
                "out": s.out,
            }
            for s in sessions
        ],
        "budget": totals,
        "binding_class": binding,
        "last_failure": failure,
    }


def _eps(value: float | str) -> str:
    return "∞" if isinstance(value, str) else f"{value:.4g}"


def render_node_status(status: dict[str, Any]) -> str:
    """The status as lines for a terminal."""
    from node.egress.budget import describe

    running = {True: "a node process is running on it now", False: "no node process runs on it"}
    lines = [
        f"node {status['node_id']!r}: state folder {status['state']} "
        f"({running.get(status['running'], 'whether a node runs on it cannot be told')})",
        "",
        "  sessions:",
    ]
    for s in status["sessions"]:
        lines.append(
            f"    {s['session_id']}  {s['stage']:<9} joined {s['joined']}; {s['progress']}; "
            f"{s['releases']} release(s) in the ledger; out {s['out']}"
        )
    if not status["sessions"]:
        lines.append("    none yet")
    budget = status["epsilon_budget"]
    lines += ["", f"  privacy budget {budget:g} (privacy.epsilon_budget), per observer class:"]
    for row in status["budget"]:
        line = f"    {row['observer']:<14} {row['releases']} release(s)  used ε {_eps(row['used'])}"
        if row["left"] is None:
            line += "  (not held to the budget: this observer learns an exact sum by design)"
        else:
            line += f"  left {row['left']:.4g}" + ("  <- binds" if row["binds"] else "")
        lines.append(line)
    if not status["budget"]:
        lines.append(f"    nothing released yet: the whole budget {budget:g} is left")
    binding = status["binding_class"]
    if binding is not None:
        left = next(r["left"] for r in status["budget"] if r["observer"] == binding)
        lines.append(
            f"    the budget binds against {describe(binding)} ({binding}): {left:.4g} left"
        )
    failure = status["last_failure"]
    lines += ["", "  last failure:"]
    if failure is None:
        lines.append("    none recorded")
    else:
        where = f" (session {failure['session_id']})" if failure.get("session_id") else ""
        lines.append(f"    {failure['time']}{where}: {failure['reason']}")
    return "\n".join(lines) + "\n"
