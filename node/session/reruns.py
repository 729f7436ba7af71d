"""How many attempts a plan round has taken in this session, and the cap on them.

A round whose survivors go silent in its unmask step is superseded and rerun
under the next index (docs/design.md §4.6); every attempt this node uploads
is another counted release of the same data with fresh noise, so a
coordinator that supersedes every attempt could average the noise away
until the ε budget stops it. ``session.max_reruns`` R caps that: at most R
superseded attempts per plan round, R + 1 releases in all, and the budget
pre-check (``node.session.egress_steps.check_session_budget``) charges all
of them before the session starts.

The count is this node's own: the release entries its ledger holds for the
plan round in this session (under CAPE, the model round's; a CAPE-sum round
releases no data), which no coordinator can hide and which survive a
restart. Who was silent is the coordinator's word (the nodes it dropped
from each superseded attempt, and its reason), named as such.
"""

from __future__ import annotations

from node.errors import NodeRefused
from node.session.context import SessionContext
from proto.messages import SessionStatus
from proto.rounds import RoundRef

__all__ = ["attempts_note", "check_rerun_cap", "earlier_attempts", "plan_round"]


def plan_round(name: str) -> str:
    """The plan round a round name belongs to (a CAPE-sum round to its model round)."""
    return RoundRef.parse(name).model_round


def earlier_attempts(ctx: SessionContext, index: int, name: str) -> list[int]:
    """Round indices below ``index`` at which this node released ``name``'s plan round."""
    base = plan_round(name)
    return sorted(
        {
            e.round_index
            for e in ctx.ledger.entries
            if e.kind == "release"
            and e.session_id == ctx.session_id
            and e.round_name == base
            and e.round_index < index
        }
    )


def _silent(status: SessionStatus, indices: list[int]) -> str:
    """Per superseded attempt, the nodes the coordinator dropped from it and why."""
    rounds = {r.index: r for r in status.rounds}
    dropped: dict[int, list[str]] = {}
    for node in status.dropped:
        dropped.setdefault(node.round_index, []).append(node.node_id)
    parts = []
    for index in indices:
        found = rounds.get(index)
        names = sorted({*dropped.get(index, ()), *(found.dropped if found else ())})
        who = "{" + ", ".join(names) + "}" if names else "nobody"
        why = f" ({found.reason})" if found is not None and found.reason else ""
        parts.append(f"round {index}: {who}{why}")
    return "; ".join(parts)


def check_rerun_cap(ctx: SessionContext, status: SessionStatus, index: int, name: str) -> None:
    """Refuse (NodeRefused) round ``index`` if its plan round has used up its reruns.

    Raised before anything of the attempt is computed or sent; the runner
    withdraws from the round with the sentence.
    """
    reruns = ctx.config.session.max_reruns
    earlier = earlier_attempts(ctx, index, name)
    if len(earlier) <= reruns:
        return
    base = plan_round(name)
    rounds = ", ".join(str(i) for i in earlier)
    raise NodeRefused(
        f"round {index} ({name!r}) would be attempt {len(earlier) + 1} of plan round "
        f"{base!r}: this node released its {len(earlier)} earlier attempts (rounds {rounds}) "
        f"and each was superseded, while session.max_reruns = {reruns} allows at most "
        f"{reruns} rerun{'s' if reruns != 1 else ''} of a plan round, every attempt being "
        f"another counted release of the same data. Silent, as the coordinator reported: "
        f"{_silent(status, earlier)}; nothing was sent"
    )


def attempts_note(ctx: SessionContext, status: SessionStatus, index: int, name: str) -> str:
    """ "plan round 'x' took 3 attempts (superseded: …)", or '' for a first attempt."""
    earlier = earlier_attempts(ctx, index, name)
    if not earlier:
        return ""
    return (
        f"plan round {plan_round(name)!r} took {len(earlier) + 1} attempts (of at most "
        f"{ctx.config.session.max_reruns + 1}); superseded: {_silent(status, earlier)}"
    )
