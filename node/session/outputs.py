"""The node's output folder: a previous session's records moved aside, results written.

``OUT/egress/`` and ``OUT/audit/`` hold one session's rounds. When a node
joins a session other than the one those folders belong to, they move to
``OUT/archive/<session id>/`` (with that session's model and predictions) so
nothing of one session is mistaken for another's; the ledger stays in place.
At the end the plan writes ``OUT/model.json`` and ``OUT/predictions.csv``
(for deltab: id, age, brain_age, delta of its own subjects) and the node deletes the session key
and any CAPE material, whose only use was a restart.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from node.egress.bundle import EgressBundle
from node.plans.interface import ModelPlan
from node.records.cape_state import CapeStore
from node.records.session_state import SessionStore

__all__ = ["CAPE_SUM_NOTE", "archive_previous", "json_object", "write_results"]

CAPE_SUM_NOTE = "cape-sum.json"  # OUT/egress/round-<r>/: the digest of a CAPE-sum share sent


def json_object(path: Path) -> dict[str, object] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def archive_previous(out: Path, session_id: str, say: Callable[[str], None]) -> None:
    """Move a previous session's egress and audit folders aside; the ledger stays."""
    out.mkdir(parents=True, exist_ok=True)
    previous = None
    for manifest in sorted((out / "egress").glob("round-*/manifest.json")):
        try:
            previous = EgressBundle.read(manifest.parent).session_id
        except ValueError:
            previous = "unknown"
        break
    if previous is None:
        # A CAPE session may have stopped after a secure-sum share, before any bundle.
        for note in sorted((out / "egress").glob(f"round-*/{CAPE_SUM_NOTE}")):
            found = json_object(note)
            previous = str(found.get("session_id", "unknown")) if found else "unknown"
            break
    if previous is None or previous == session_id:
        return
    archive = out / "archive" / previous
    archive.mkdir(parents=True, exist_ok=True)
    for name in ("egress", "audit", "model.json", "predictions.csv"):
        source = out / name
        if source.exists():
            shutil.move(str(source), str(archive / name))
    say(f"moved the records of session {previous} to {archive}")


def write_results(out: Path, plan: ModelPlan) -> tuple[Path, Path]:
    """Write the plan's model and predictions; forget the session key and CAPE material."""
    model_path, predictions = plan.write_outputs(out)
    # The session key has served its purpose; nothing may be derived from it any more.
    SessionStore(out).complete()
    # Nor from the CAPE material, whose only use was a restart (node/records/cape_state.py).
    CapeStore(out).discard()
    return model_path, predictions
