"""After a restart: take in every round the coordinator aggregated while this node was away.

A restarted node rejoins with the session key it saved (``node.session.joining``).
Every round aggregated meanwhile feeds the plan from its published result, as
if it had been awaited — no egress is written and nothing enters the ledger,
since this node's releases of those rounds are recorded already; the
aggregate must still count the very payload its bundle holds. A CAPE-sum round
aggregated sets S and its participants in the CAPE material saved before the
restart, as the live path does. The current round is left to the main loop,
which resubmits a bundle written before the restart, or sends a CAPE-sum share
again from the saved draws. A node that refused an unmask request in this
session stopped there, and so does its restart.
"""

from __future__ import annotations

import numpy as np

from node.egress.bundle import MANIFEST, egress_folder
from node.egress.release import plan_release
from node.errors import NodeRefused, SessionFailed
from node.records.cape_state import CapeStore
from node.records.ledger import Refusal
from node.session import egress_steps
from node.session.cape_material import cape_state
from node.session.cape_round import noted_share, take_cape_sum
from node.session.context import SessionContext
from node.session.outputs import CAPE_SUM_NOTE
from node.session.progress import RoundProgress
from node.session.results import await_result
from noise.layout import payload_digest
from proto.messages import RoundState, SessionStatus
from proto.rounds import RoundRef

__all__ = ["catch_up", "take_aggregated"]


def catch_up(ctx: SessionContext, progress: RoundProgress) -> None:
    """Take in what was aggregated while away and say where the session stands."""
    for entry in ctx.ledger.entries:
        if isinstance(entry, Refusal) and entry.session_id == ctx.session_id:
            # The node stopped at that refusal; the coordinator may never have
            # heard of it, and a restart must not cooperate further either.
            raise NodeRefused(
                f"this node refused to unmask round {entry.round_index} "
                f"({entry.round_name!r}) of session {ctx.session_id} before it restarted "
                f"({entry.reason or 'no reason recorded'}); it does not go on "
                "in that session"
            )
    status = ctx.gateway.status(ctx.session_id)
    aggregated = take_aggregated(ctx, progress, status)
    done = (
        f"round{'s' if len(aggregated) > 1 else ''} {', '.join(aggregated)} aggregated"
        if aggregated
        else "no round aggregated yet"
    )
    current = status.current
    if current is None or current.index in progress.done:
        where = "nothing left to send"
    else:
        index, name = current.index, current.name
        if RoundRef.parse(name).is_cape_sum and noted_share(ctx, index) is not None:
            where = f"round {index} ({name!r}) CAPE sum share noted, sending it again"
        elif (egress_folder(ctx.out, index) / MANIFEST).exists():
            where = f"round {index} ({name!r}) bundle found, resubmitting"
        else:
            where = f"round {index} ({name!r}) not written yet here"
    ctx.say(f"resuming session {ctx.session_id}: {done}, {where}")


def take_aggregated(
    ctx: SessionContext, progress: RoundProgress, status: SessionStatus
) -> list[str]:
    """Take in every round of ``status`` not handled yet that is aggregated or superseded.

    Returns the indices of the rounds taken in. A round counts as handled
    (``progress.done``) from then on; a round still open is left to the main loop.
    """
    waiting = [s for s in status.rounds if s.index not in progress.done]
    # A share counts as sent once the coordinator holds it or the node noted
    # it (the note is written just before the upload): its draws must be reused.
    for summary in waiting:
        ref = RoundRef.parse(summary.name)
        if ref.is_cape_sum and (
            ctx.node_id in summary.submitted or noted_share(ctx, summary.index) is not None
        ):
            progress.cape_sent.add(ref.model_round)
    finished = {
        s.name
        for s in status.rounds
        if s.state == RoundState.READY and s.name in ctx.plan.round_names
    }
    current = status.current
    aggregated: list[str] = []
    for summary in waiting:
        index, name = summary.index, summary.name
        if ctx.node_id in summary.dropped:
            raise SessionFailed(
                f"the coordinator dropped this node from round {index} ({name!r}) while it "
                "was away (a deadline passed); it cannot rejoin this session"
            )
        if summary.state.given_up and (current is None or index != current.index):
            progress.done.add(index)  # superseded by a rerun
            continue
        if summary.state != RoundState.READY:
            continue
        participants = status.participants(index, ctx.roster.node_ids)
        ref = RoundRef.parse(name)
        if ref.is_cape_sum:
            model_round = ref.model_round
            _take_published_cape_sum(
                ctx,
                progress,
                index=index,
                name=name,
                participants=participants,
                needed=model_round not in finished,
            )
        elif name in ctx.plan.round_names:
            _take_published(ctx, progress, index=index, name=name, participants=participants)
        else:
            raise SessionFailed(
                f"the coordinator aggregated round {index} named {name!r}, which is not part "
                f"of this node's plan {list(ctx.plan.round_names)}"
            )
        progress.done.add(index)
        aggregated.append(str(index))
    return aggregated


def _take_published_cape_sum(
    ctx: SessionContext,
    progress: RoundProgress,
    *,
    index: int,
    name: str,
    participants: tuple[str, ...],
    needed: bool,
) -> None:
    """Take in a CAPE-sum round aggregated while this node was not running.

    Its result must count the share this node noted, and, while its model
    round is still to come (``needed``), becomes S of the saved CAPE state
    exactly as in the live round.
    """
    model_round = RoundRef.parse(name).model_round
    if model_round not in ctx.plan.round_names:
        raise SessionFailed(f"the coordinator aggregated {name!r} for an unknown model round")
    _, layout = ctx.round_tensors(model_round)
    state = None
    if needed:
        # Aggregated with this node's share, so its draws are needed again.
        progress.cape_sent.add(model_round)
        state = cape_state(ctx, progress, model_round, layout)
        if state is not None and state.drawn_for not in (None, index):
            # The saved material belongs to a later attempt (a rerun drew afresh);
            # this round's sum is of draws no longer kept and no longer needed.
            state = None
    noted = noted_share(ctx, index)
    own = None
    if noted is not None:
        try:
            own = bytes.fromhex(str(noted.get("sent_digest")))
        except ValueError:
            raise SessionFailed(
                f"{egress_folder(ctx.out, index) / CAPE_SUM_NOTE} notes no valid digest of "
                "the CAPE sum share this node sent; restore it"
            ) from None
    noise = (
        state.noise
        if state is not None
        else plan_release(
            ctx.config, participants, ctx.node_id, ctx.plan.sensitivities(model_round), model_round
        )
    )
    outcome = await_result(
        ctx,
        progress,
        index=index,
        name=name,
        layout=layout,
        participants=participants,
        noise=noise,
        contribution=None if state is None else state.draws,
        own_digest=own,
    )
    if outcome is None:
        raise SessionFailed(f"round {index} ({name!r}) was aggregated but is now superseded")
    if state is None:
        return
    if state.sum_index == index and (
        state.total is None or not np.array_equal(state.total, outcome.aggregate)
    ):
        raise SessionFailed(
            f"the CAPE sum of round {index} ({name!r}) saved in "
            f"{CapeStore(ctx.out).folder(model_round)} differs from the one the coordinator "
            "publishes now; refusing to go on with either"
        )
    take_cape_sum(
        ctx,
        model_round,
        state,
        index=index,
        total=outcome.aggregate,
        survivors=outcome.survivors,
        layout=layout,
    )


def _take_published(
    ctx: SessionContext,
    progress: RoundProgress,
    *,
    index: int,
    name: str,
    participants: tuple[str, ...],
) -> None:
    """Feed the plan a round's published aggregate (the round is READY)."""
    # The local tensors give the aggregate's layout (and the plan's state for
    # the round); nothing of them is sent again.
    _, layout = ctx.round_tensors(name)
    noise = plan_release(ctx.config, participants, ctx.node_id, ctx.plan.sensitivities(name), name)
    # The aggregate must count the very payload this node's bundle holds.
    bundle = egress_steps.bundle_before_restart(ctx, index, name)
    own = (
        None if bundle is None else payload_digest(ctx.sent_payload(index, bundle.payload, layout))
    )
    outcome = await_result(
        ctx,
        progress,
        index=index,
        name=name,
        layout=layout,
        participants=participants,
        noise=noise,
        contribution=None if bundle is None else bundle.payload,
        own_digest=own,
    )
    if outcome is None:
        raise SessionFailed(f"round {index} ({name!r}) was aggregated but is now superseded")
    ctx.plan.receive(name, layout.decode(outcome.aggregate, ctx.codec))
