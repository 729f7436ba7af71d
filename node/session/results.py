"""Awaiting a round's aggregate: poll, answer unmask requests on the way, check the statements.

:func:`await_result` returns the round's :class:`Outcome` — the aggregate and
the survivors it sums — once it is READY and its upload statements check out
(``node.protocol.statements.check_statements``): every contributor signed for the
roster this node verified, this node's own upload is the one counted, and the
nodes left out are exactly those whose pair terms it revealed. It returns
None when the coordinator superseded the round (a CAPE rerun follows), and
raises when the session failed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from node.egress.release import ReleaseNoise
from node.errors import SessionFailed, StatementError
from node.protocol.statements import check_statements
from node.session import unmask_answers
from node.session.aggregate_tags import check_aggregate
from node.session.context import SessionContext
from node.session.progress import RoundProgress
from noise.layout import Layout
from proto.messages import RoundResult, RoundState

__all__ = ["Outcome", "await_result"]

U64 = NDArray[np.uint64]


@dataclass(frozen=True)
class Outcome:
    """A round's verified aggregate and the survivors it is the sum over."""

    aggregate: U64
    survivors: tuple[str, ...]


def await_result(
    ctx: SessionContext,
    progress: RoundProgress,
    *,
    index: int,
    name: str,
    layout: Layout,
    participants: tuple[str, ...],
    noise: ReleaseNoise,
    contribution: U64 | None,
    own_digest: bytes | None = None,
) -> Outcome | None:
    """The round's aggregate, or None when the coordinator superseded the round.

    ``contribution``: what this node adds to the aggregate before any pair
    terms are revealed (its egress; in a CAPE-sum round its draw), for the
    aggregate check (``node.session.aggregate_tags``); None when it is not at
    hand (a round aggregated while this node was down, which needs no answer).
    ``own_digest``: the digest of this node's upload when this process did
    not make it (a round sent before a restart, from its bundle).

    The coordinator holds a poll that would show nothing new until something
    changes (a long poll, docs/design.md §4.4), so after an answer that did
    show something new this node asks again at once; it pauses for its poll
    interval only after an answer like the one before (a held poll that timed
    out, or a coordinator that does not hold polls).
    """
    seen: tuple[object, ...] | None = None
    while True:
        result = ctx.gateway.result(ctx.session_id, index)
        if result.state == RoundState.READY:
            assert result.aggregate is not None
            sent = ctx.gateway.uploaded_digest(ctx.session_id, index) or own_digest
            revealed = progress.revealed.get(index)
            try:
                check_statements(
                    result,
                    config_hash=ctx.config_hash,
                    session_id=ctx.session_id,
                    round_index=index,
                    roster_hash=ctx.roster.roster_hash,
                    identity_keys=ctx.config.identity_keys,
                    own_node_id=ctx.node_id,
                    own_digest=sent,
                    participants=participants,
                    round_name=name,
                    revealed=revealed.dropped if revealed is not None else (),
                )
            except StatementError as error:
                raise SessionFailed(str(error)) from None
            signed = unmask_answers.signed_set(ctx, progress, index)
            expanded = progress.challenge
            check_aggregate(
                ctx,
                result,
                index,
                layout,
                key=None if signed is None else signed.challenge_key,
                own=None if signed is None else signed.own_tags,
                survivor_hash=b"" if signed is None else signed.survivor_hash,
                rho=expanded[1] if expanded is not None and expanded[0] == index else None,
            )
            progress.challenge = None
            return Outcome(result.aggregate, result.survivors)
        if result.state.given_up:  # FAILED, or SUPERSEDED by a rerun
            status = ctx.gateway.status(ctx.session_id)
            if status.state.ended:
                raise SessionFailed(f"the session failed: {status.reason or result.reason}")
            if result.reason:
                # Why it is rerun, e.g. a survivor another one named (with its evidence).
                ctx.say(f"round {index} ({name!r}) is not completed: {result.reason}")
            return None
        if result.state == RoundState.AWAITING_UNMASK and result.unmask_request is not None:
            unmask_answers.answer(
                ctx,
                progress,
                result.unmask_request,
                index=index,
                name=name,
                layout=layout,
                participants=participants,
                noise=noise,
                contribution=contribution,
            )
        now = _progress_key(result)
        if now == seen:
            ctx.sleep()
        seen = now


def _progress_key(result: RoundResult) -> tuple[object, ...]:
    """What of an unfinished round's view a repeated poll could bring that is new."""
    ask = result.unmask_request
    if ask is None:
        return (result.state, result.reason)
    return (result.state, result.reason, ask.attempt, len(ask.attestations), len(ask.tags))
