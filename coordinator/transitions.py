"""Every change of a session's state and of a round's status, in one table.

The steps of a session (coordinator/steps/) check a message, decide which
event happened (coordinator/events.py) and phrase why; this module says what
each event does. A row of the table names the state an event may arrive in,
the states it may leave behind and the handler that writes the change. An
event that has no row for the current state is refused
(:class:`~coordinator.errors.TransitionRefused`, a sentence naming the event,
the state and what that state allows) before anything is written, and a
handler that leaves a state its row does not name is a bug that rolls the
transaction back. Nothing else writes the session's state or a round's
status, reason, deadline or unmask attempt.

Every change happens inside one store transaction
(:meth:`~coordinator.context.CoordinatorContext.transition`), opened by the step
together with its own writes (the upload row, the dropped nodes), so a
``kill -9`` leaves either all of a change or none of it. A handler may cause
a second change in the same transaction: a round that is ready opens the
next round or completes the session; a round that fails fails the session.

A session starts in 'joining' (created by coordinator/steps/joining.py).
The table, as :func:`describe` prints it::

    session joining   every federation node joined -> running
    session joining   the join deadline passed with enough nodes joined -> running
    session joining   the join deadline passed with too few nodes joined -> failed
    session joining   the coordinator restarted during the join phase -> joining
    session running   a round ended and the plan goes on -> running
    session running   the final round is ready -> completed
    session running   the current round failed -> failed
    round   open      an upload completed the round -> unmask
    round   open      the round deadline passed with enough survivors -> unmask
    round   open      a withdrawal left nobody awaited -> unmask
    round   open      the round closed with too few survivors -> failed
    round   open      the round closed after nodes dropped from a CAPE model round -> superseded
    round   open      a participant withdrew -> open
    round   open      a withdrawal left too few participants -> failed
    round   open      the coordinator restarted during the round -> open
    round   unmask    every survivor attested the survivor set -> unmask
    round   unmask    a correction completed the unmask -> ready
    round   unmask    the unmask deadline passed with enough survivors -> superseded
    round   unmask    a survivor named another as the cause of its refusal -> superseded
    round   unmask    the unmask deadline passed with too few survivors -> failed
    round   unmask    a survivor refused to unmask -> failed
    round   unmask    the coordinator restarted during the round -> unmask

'completed' and 'failed' sessions, and 'ready', 'failed' and 'superseded'
rounds, change no more. Round events apply to the current round of a running
session only; a rerun is a new round under the next index
(:class:`~coordinator.events.NextRound`).

Adding a phase (say a round status 'reveal'): name it in
``RoundState`` (proto/messages.py) and ``ROUND_STATUSES``
(coordinator/store/rows.py), allow it in the schema's CHECK list under a new
schema version (coordinator/store/schema.py) and give it a wire status
(proto/zerosum/v1/session.proto, mapped in proto/convert.py); add its
events to coordinator/events.py; add rows and handlers here; and let a
step decide when each event has happened. The table test
(tests/coordinator/test_transitions.py) then walks the new pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from coordinator.context import CoordinatorContext, clock_text, node_list, short_digest
from coordinator.errors import TransitionRefused
from coordinator.events import (
    AttestationsComplete,
    CapeModelDropout,
    CorrectionsComplete,
    EveryoneJoined,
    FinalRoundReady,
    JoinDeadlinePassed,
    JoinResumed,
    MemberNamed,
    NextRound,
    NobodyAwaited,
    NodeWithdrew,
    RoundDeadlinePassed,
    RoundEvent,
    RoundFailed,
    RoundResumed,
    SessionEvent,
    TooFewAnswered,
    TooFewJoined,
    TooFewUploaded,
    UnmaskRefused,
    UnmaskStalled,
    UploadsComplete,
    WithdrawalLeftTooFew,
)
from coordinator.store import ResultRow, RoundRow, SessionRow, UnmaskRow
from noise.transcript import survivor_set_hash
from proto.messages import (
    RoundState,
    SessionState,
)

__all__ = [
    "ROUND_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "StatusChanges",
    "Transition",
    "describe",
    "round_transition",
    "session_transition",
]

Row = TypeVar("Row", SessionRow, RoundRow)
Event = TypeVar("Event", bound=SessionEvent | RoundEvent)


@dataclass(frozen=True)
class Transition(Generic[Row, Event]):
    """One row of the table: ``event`` arriving in ``source`` runs ``handler``.

    ``handler(changes, row, event, now)`` writes the change; afterwards the
    state must be one of ``targets``.
    """

    source: str
    event: type[Event]
    targets: tuple[str, ...]
    handler: Callable[[StatusChanges, Row, Event, int], None]


class StatusChanges:
    """Applies events to the session and its current round through the table."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx

    def apply_to_session(self, event: SessionEvent, *, now: int) -> None:
        """Inside a transition: change the session as the table says, or refuse."""
        self._require_transaction(event)
        row = self.ctx.session()
        transition = session_transition(row.state, type(event))
        if transition is None:
            what = f"session {row.session_id!r}"
            raise TransitionRefused(_refusal(what, row.state, event, _SESSION_INDEX))
        transition.handler(self, row, event, now)
        after = self.ctx.session().state
        if after not in transition.targets:  # pragma: no cover - a handler bug
            raise RuntimeError(f"{event.sentence!r} left the session {after}.")

    def apply_to_round(self, round_index: int, event: RoundEvent, *, now: int) -> None:
        """Inside a transition: change round ``round_index`` as the table says, or refuse."""
        self._require_transaction(event)
        session = self.ctx.session()
        round_row = self.ctx.store.round(round_index)
        if round_row is None:
            raise TransitionRefused(
                f"round {round_index} has not opened, so {event.sentence} cannot change it."
            )
        transition = round_transition(round_row.status, type(event))
        if transition is None:
            what = f"round {round_index} ({round_row.name!r})"
            raise TransitionRefused(_refusal(what, round_row.status, event, _ROUND_INDEX))
        # Today an open or unmask round is always the current round of a running
        # session; these two refusals keep a new phase from breaking that silently.
        if session.state != SessionState.RUNNING:  # pragma: no cover
            raise TransitionRefused(
                f"session {session.session_id!r} is {session.state}; {event.sentence} changes "
                "a round of a running session only."
            )
        if session.current_round != round_index:  # pragma: no cover
            raise TransitionRefused(
                f"round {round_index} is not the current round (round {session.current_round} "
                f"is); {event.sentence} changes the current round only."
            )
        transition.handler(self, round_row, event, now)
        after = self.ctx.round_row(round_index).status
        if after not in transition.targets:  # pragma: no cover - a handler bug
            raise RuntimeError(f"{event.sentence!r} left round {round_index} {after}.")

    def _require_transaction(self, event: SessionEvent | RoundEvent) -> None:
        if not self.ctx.store.in_transaction:
            raise RuntimeError(
                f"{event.sentence!r} must be applied inside CoordinatorContext.transition(), "
                "together with the writes that caused it."
            )


def _refusal(
    what: str,
    state: str,
    event: SessionEvent | RoundEvent,
    index: dict[tuple[str, type[Any]], Transition[Any, Any]],
) -> str:
    allowed = [t.event.sentence for (source, _), t in index.items() if source == state]
    if not allowed:
        return f"{what} is {state}, which is final: {event.sentence} cannot change it."
    return (
        f"{what} is {state}, where {event.sentence} is not a change it can make; while "
        f"{state} it changes only when {'; or '.join(allowed)}."
    )


# ---------------------------------------------------------------- session handlers


def _open_round(
    changes: StatusChanges, round_index: int, name: str, participants: list[str], now: int
) -> None:
    """Open round ``round_index`` with its public layout (the plan's) and make it current."""
    ctx = changes.ctx
    deadline = now + ctx.config.round_timeout_ms
    ctx.store.open_round(
        round_index,
        name,
        participants,
        now,
        deadline,
        layout=ctx.config.layout(name),
        fixed_point_bits=ctx.config.fixed_point_bits,
    )
    ctx.store.set_current_round(round_index)
    ctx.note(
        f"round {round_index} ({name!r}) open for {node_list(participants)} until "
        f"{clock_text(deadline)}",
        event="round-opened",
    )


def _start_running(
    changes: StatusChanges,
    row: SessionRow,
    event: EveryoneJoined | JoinDeadlinePassed,
    now: int,
) -> None:
    """The roster becomes final and round 0 opens with every joined node."""
    ctx = changes.ctx
    joined = [m.node_id for m in ctx.store.members()]
    missing = sorted(set(ctx.config.node_ids) - set(joined))
    ctx.store.finalise_roster()
    ctx.store.set_session_state(SessionState.RUNNING)
    excluded = f"; excluded: {node_list(missing)}" if missing else ""
    ctx.note(f"roster final: {node_list(joined)} joined{excluded}", event="roster-final")
    first = ctx.config.next_round_name(None)
    assert first is not None
    _open_round(changes, 0, first, joined, now)


def _fail_to_gather(changes: StatusChanges, row: SessionRow, event: TooFewJoined, now: int) -> None:
    """The roster becomes final and the session fails: too few joined."""
    changes.ctx.store.finalise_roster()
    changes.ctx.store.set_session_state(SessionState.ABORTED, reason=event.reason, ended_ms=now)
    changes.ctx.note(f"session failed: {event.reason}", event="session-failed")


def _extend_join_deadline(
    changes: StatusChanges, row: SessionRow, event: JoinResumed, now: int
) -> None:
    """The join deadline moves to at least ``now`` plus the whole join period."""
    ctx = changes.ctx
    ctx.store.set_join_deadline(max(row.join_deadline_ms, now + ctx.config.join_timeout_ms))


def _open_next_round(changes: StatusChanges, row: SessionRow, event: NextRound, now: int) -> None:
    _open_round(changes, event.round_index, event.name, list(event.participants), now)


def _complete(changes: StatusChanges, row: SessionRow, event: FinalRoundReady, now: int) -> None:
    changes.ctx.store.set_session_state(SessionState.COMPLETED, ended_ms=now)
    changes.ctx.note(
        f"session completed after {event.round_index + 1} rounds", event="session-completed"
    )


def _fail_session(changes: StatusChanges, row: SessionRow, event: RoundFailed, now: int) -> None:
    changes.ctx.store.set_session_state(SessionState.ABORTED, reason=event.reason, ended_ms=now)
    changes.ctx.note(f"session failed: {event.reason}", event="session-failed")


# ---------------------------------------------------------------- round handlers


def _publish(
    changes: StatusChanges,
    round_row: RoundRow,
    event: CorrectionsComplete,
    now: int,
) -> None:
    """Record the round's aggregate, mark it ready, then open the next round or complete."""
    ctx = changes.ctx
    index, name = round_row.round_index, round_row.name
    size = ctx.store.payload_path(event.result.name).stat().st_size
    ctx.store.add_result(
        ResultRow(
            round_index=index,
            survivors=tuple(sorted(event.survivors)),
            dropped=tuple(sorted(event.dropped)),
            digest=event.result.digest,
            size=size,
            path=event.result.name,
            computed_ms=now,
        )
    )
    ctx.store.set_round_status(index, RoundState.READY, "")
    ctx.note(
        f"round {index} ({name!r}) ready: the sum over {node_list(event.survivors)} "
        f"(digest {short_digest(event.result.digest)})",
        event="round-ready",
    )
    following = ctx.config.next_round_name(name)
    if following is None:
        changes.apply_to_session(FinalRoundReady(index), now=now)
    else:
        survivors = tuple(sorted(event.survivors))
        changes.apply_to_session(NextRound(index + 1, following, survivors), now=now)


def _request_unmask(
    changes: StatusChanges,
    round_row: RoundRow,
    event: UploadsComplete | RoundDeadlinePassed | NobodyAwaited,
    now: int,
) -> None:
    """Issue the round's one unmask request for survivors S and dropped D, bound by their hash.

    D is empty when everyone uploaded: S then reveal their self-mask seeds only.
    """
    ctx = changes.ctx
    index, attempt = round_row.round_index, round_row.unmask_attempt + 1
    assert attempt == 1, "one unmask request per round index"
    row = ctx.session()
    digest = survivor_set_hash(
        row.config_hash, row.session_id, index, event.survivors, event.dropped
    )
    ctx.store.add_unmask_request(
        UnmaskRow(
            round_index=index,
            attempt=attempt,
            survivors=event.survivors,
            dropped=event.dropped,
            survivor_hash=digest,
            opened_ms=now,
            deadline_ms=now + ctx.config.unmask_timeout,
        )
    )
    dropped = f" ({node_list(event.dropped)} dropped)" if event.dropped else ""
    ctx.store.set_round_status(
        index,
        RoundState.AWAITING_UNMASK,
        f"waiting for the unmask answers of {node_list(event.survivors)}{dropped}",
    )
    ctx.store.set_unmask_attempt(index, attempt)
    asked = "self-mask seeds and pair terms with them" if event.dropped else "self-mask seeds"
    ctx.note(
        f"round {index} ({round_row.name!r}): {node_list(event.dropped) or 'nobody'} dropped; "
        f"asking {node_list(event.survivors)} for their {asked}",
        event="unmask-requested",
    )


def _fail_round(
    changes: StatusChanges,
    round_row: RoundRow,
    event: TooFewUploaded | WithdrawalLeftTooFew | TooFewAnswered | UnmaskRefused,
    now: int,
) -> None:
    """The round fails with the event's reason, and the session with it."""
    changes.ctx.store.set_round_status(round_row.round_index, RoundState.FAILED, event.reason)
    changes.apply_to_session(RoundFailed(event.reason), now=now)


def _supersede(
    changes: StatusChanges,
    round_row: RoundRow,
    event: CapeModelDropout | UnmaskStalled | MemberNamed,
    now: int,
) -> None:
    """The round is superseded; ``event.rerun`` opens under the next index among the survivors."""
    index = round_row.round_index
    changes.ctx.store.set_round_status(index, RoundState.SUPERSEDED, event.reason)
    changes.ctx.note(f"round {index} ({round_row.name!r}): {event.reason}", event="round-rerun")
    changes.apply_to_session(NextRound(index + 1, event.rerun, event.survivors), now=now)


def _record_withdrawals(
    changes: StatusChanges, round_row: RoundRow, event: NodeWithdrew, now: int
) -> None:
    """The round stays open; its reason names every withdrawal so far."""
    changes.ctx.store.set_round_reason(round_row.round_index, event.notes)


def _corrections_may_follow(
    changes: StatusChanges, round_row: RoundRow, event: AttestationsComplete, now: int
) -> None:
    """Nothing is written: the attestations are the record, and corrections are now accepted."""


def _extend_upload_deadline(
    changes: StatusChanges, round_row: RoundRow, event: RoundResumed, now: int
) -> None:
    """The upload deadline moves to at least ``now`` plus the whole round period."""
    deadline = max(round_row.deadline_ms, now + changes.ctx.config.round_timeout_ms)
    changes.ctx.store.set_round_deadline(round_row.round_index, deadline)


def _extend_unmask_deadline(
    changes: StatusChanges, round_row: RoundRow, event: RoundResumed, now: int
) -> None:
    """The unmask deadline moves to at least ``now`` plus the whole unmask period."""
    request = changes.ctx.unmask_row(round_row)
    deadline = max(request.deadline_ms, now + changes.ctx.config.unmask_timeout)
    changes.ctx.store.set_unmask_deadline(round_row.round_index, request.attempt, deadline)


# ---------------------------------------------------------------- the table

JOINING, RUNNING = SessionState.JOINING, SessionState.RUNNING
COMPLETED, FAILED = SessionState.COMPLETED, SessionState.ABORTED
OPEN, UNMASK, READY = RoundState.OPEN, RoundState.AWAITING_UNMASK, RoundState.READY
ROUND_FAILED, SUPERSEDED = RoundState.FAILED, RoundState.SUPERSEDED

SESSION_TRANSITIONS: tuple[Transition[SessionRow, Any], ...] = (
    Transition(JOINING, EveryoneJoined, (RUNNING,), _start_running),
    Transition(JOINING, JoinDeadlinePassed, (RUNNING,), _start_running),
    Transition(JOINING, TooFewJoined, (FAILED,), _fail_to_gather),
    Transition(JOINING, JoinResumed, (JOINING,), _extend_join_deadline),
    Transition(RUNNING, NextRound, (RUNNING,), _open_next_round),
    Transition(RUNNING, FinalRoundReady, (COMPLETED,), _complete),
    Transition(RUNNING, RoundFailed, (FAILED,), _fail_session),
)

ROUND_TRANSITIONS: tuple[Transition[RoundRow, Any], ...] = (
    Transition(OPEN, UploadsComplete, (UNMASK,), _request_unmask),
    Transition(OPEN, RoundDeadlinePassed, (UNMASK,), _request_unmask),
    Transition(OPEN, NobodyAwaited, (UNMASK,), _request_unmask),
    Transition(OPEN, TooFewUploaded, (ROUND_FAILED,), _fail_round),
    Transition(OPEN, CapeModelDropout, (SUPERSEDED,), _supersede),
    Transition(OPEN, NodeWithdrew, (OPEN,), _record_withdrawals),
    Transition(OPEN, WithdrawalLeftTooFew, (ROUND_FAILED,), _fail_round),
    Transition(OPEN, RoundResumed, (OPEN,), _extend_upload_deadline),
    Transition(UNMASK, AttestationsComplete, (UNMASK,), _corrections_may_follow),
    Transition(UNMASK, CorrectionsComplete, (READY,), _publish),
    Transition(UNMASK, UnmaskStalled, (SUPERSEDED,), _supersede),
    Transition(UNMASK, MemberNamed, (SUPERSEDED,), _supersede),
    Transition(UNMASK, TooFewAnswered, (ROUND_FAILED,), _fail_round),
    Transition(UNMASK, UnmaskRefused, (ROUND_FAILED,), _fail_round),
    Transition(UNMASK, RoundResumed, (UNMASK,), _extend_unmask_deadline),
)


def _index(
    table: tuple[Transition[Any, Any], ...],
) -> dict[tuple[str, type[Any]], Transition[Any, Any]]:
    index: dict[tuple[str, type[Any]], Transition[Any, Any]] = {}
    for transition in table:
        key = (transition.source, transition.event)
        if key in index:  # pragma: no cover - caught when the module is imported
            raise RuntimeError(f"two rows for {transition.event.sentence!r} in {key[0]}.")
        index[key] = transition
    return index


_SESSION_INDEX = _index(SESSION_TRANSITIONS)
_ROUND_INDEX = _index(ROUND_TRANSITIONS)


def session_transition(state: str, event: type[SessionEvent]) -> Transition[SessionRow, Any] | None:
    """The row for ``event`` arriving in session state ``state``, or None (refused)."""
    return _SESSION_INDEX.get((state, event))


def round_transition(status: str, event: type[RoundEvent]) -> Transition[RoundRow, Any] | None:
    """The row for ``event`` arriving in round status ``status``, or None (refused)."""
    return _ROUND_INDEX.get((status, event))


def describe() -> str:
    """The table as text, one row a line: scope, state, event -> possible states."""
    lines = []
    for scope, table in (("session", SESSION_TRANSITIONS), ("round", ROUND_TRANSITIONS)):
        for t in table:
            lines.append(f"{scope:<7} {t.source:<9} {t.event.sentence} -> {', '.join(t.targets)}")
    return "\n".join(lines)
