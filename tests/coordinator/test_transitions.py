"""The table of status changes: every (state, event) pair has a row or is refused, unchanged.

Each refusal is checked on a real session brought into that state by real
messages: the event is applied inside a transition after a write of the
step's own, and the state file (every row and every payload file) must be
exactly as before.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import coordinator
from coordinator import transitions
from coordinator.errors import FailedPrecondition, TransitionRefused
from coordinator.events import (
    ROUND_EVENTS,
    SESSION_EVENTS,
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
    ResultFile,
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
from coordinator.session import Session
from coordinator.store import ROUND_STATUSES, SESSION_STATES, Store
from coordinator.transitions import (
    ROUND_TRANSITIONS,
    SESSION_TRANSITIONS,
    Transition,
    describe,
    round_transition,
    session_transition,
)
from proto.messages import (
    RoundState,
    SessionState,
)
from tests.coordinator.support import (
    N_WORDS,
    FakeClock,
    Federation,
    join_all,
    make_federation,
    reveal_all,
    upload,
    zero_sum,
)

RESULT = ResultFile("r0000-result-0000000000000000.u64", bytes(32))
# One instance of every event; a refused event is never looked at further.
EXAMPLES: dict[type[SessionEvent | RoundEvent], SessionEvent | RoundEvent] = {
    EveryoneJoined: EveryoneJoined(),
    JoinDeadlinePassed: JoinDeadlinePassed(),
    TooFewJoined: TooFewJoined("only 1 of 3 nodes joined"),
    JoinResumed: JoinResumed(),
    NextRound: NextRound(1, "scatter", ("a", "b", "c")),
    FinalRoundReady: FinalRoundReady(1),
    RoundFailed: RoundFailed("the round failed"),
    UploadsComplete: UploadsComplete(("a", "b", "c")),
    RoundDeadlinePassed: RoundDeadlinePassed(("a", "b"), ("c",)),
    NobodyAwaited: NobodyAwaited(("a", "b"), ("c",)),
    TooFewUploaded: TooFewUploaded("only 1 of 3 nodes submitted"),
    CapeModelDropout: CapeModelDropout(("a", "b"), "cape-sum/moments", "c dropped"),
    NodeWithdrew: NodeWithdrew("node 'c' withdrew"),
    WithdrawalLeftTooFew: WithdrawalLeftTooFew("only 1 node remains"),
    AttestationsComplete: AttestationsComplete(),
    CorrectionsComplete: CorrectionsComplete(("a", "b"), ("c",), RESULT),
    UnmaskStalled: UnmaskStalled(("a", "b"), "moments", "c was silent"),
    MemberNamed: MemberNamed(("a", "b"), "moments", "c was named by a"),
    TooFewAnswered: TooFewAnswered("only 1 of 2 survivors answered"),
    UnmaskRefused: UnmaskRefused("node 'a' refused"),
    RoundResumed: RoundResumed(),
}

ROUND_MS = 60_000


def _session(tmp_path: Path, clock: FakeClock, *, cape: bool) -> tuple[Session, Federation]:
    fed = make_federation(
        ("a", "b", "c"),
        min_nodes=2,
        construction="cape" if cape else "pairwise",
        rounds=("moments",) if cape else ("moments", "scatter"),
        round_ms=ROUND_MS,
    )
    return Session(Store(tmp_path / "state.sqlite"), fed.config, clock=clock), fed


def _uploads(
    session: Session,
    round_index: int,
    nodes: tuple[str, ...],
    seed: int,
    reveal: Federation | None = None,
) -> None:
    """``nodes`` upload round ``round_index``; with ``reveal``, the unmask step follows."""
    data = zero_sum(("a", "b", "c"), N_WORDS, seed=seed)
    for node in nodes:
        upload(session, node, round_index, data.payloads[node])
    if reveal is not None:
        reveal_all(reveal, session, round_index, data)


def _in_state(scope: str, state: str, tmp_path: Path) -> tuple[Session, int]:  # noqa: PLR0911 - one return per state: how real messages reach it
    """A session brought by real messages into ``state``, and the round that is in it."""
    clock = FakeClock()
    cape = scope == "round" and state == RoundState.SUPERSEDED
    session, fed = _session(tmp_path, clock, cape=cape)
    if state == SessionState.JOINING:
        return session, 0
    if state == SessionState.ABORTED and scope == "session":
        session.join(fed.bundle("a", session.session_id), caller="a")
        session.tick(clock.advance(fed.config.join_timeout_ms))
        assert session.state() == SessionState.ABORTED
        return session, 0
    join_all(fed, session)
    if state in (SessionState.RUNNING, RoundState.OPEN):
        return session, 0
    if state in (SessionState.COMPLETED, RoundState.READY):
        _uploads(session, 0, ("a", "b", "c"), seed=1, reveal=fed)
        _uploads(session, 1, ("a", "b", "c"), seed=2, reveal=fed)
        assert session.state() == SessionState.COMPLETED
        return session, 1
    if state == RoundState.AWAITING_UNMASK:
        _uploads(session, 0, ("a", "b"), seed=3)
        session.tick(clock.advance(ROUND_MS))
        return session, 0
    if state == RoundState.FAILED:
        _uploads(session, 0, ("a",), seed=4)
        session.tick(clock.advance(ROUND_MS))
        assert session.state() == SessionState.ABORTED
        return session, 0
    assert state == RoundState.SUPERSEDED
    _uploads(session, 0, ("a", "b", "c"), seed=5, reveal=fed)
    _uploads(session, 1, ("a", "b"), seed=6)
    session.tick(clock.advance(ROUND_MS))
    return session, 1


def _pairs() -> Iterator[tuple[str, str, type[SessionEvent | RoundEvent]]]:
    for state in SESSION_STATES:
        for session_event in SESSION_EVENTS:
            yield "session", state, session_event
    for status in ROUND_STATUSES:
        for round_event in ROUND_EVENTS:
            yield "round", status, round_event


PAIRS = list(_pairs())


def test_every_event_has_an_example_and_a_sentence() -> None:
    assert set(EXAMPLES) == set(SESSION_EVENTS) | set(ROUND_EVENTS)
    sentences = [event.sentence for event in EXAMPLES]
    assert all(sentences) and len(set(sentences)) == len(sentences)


def test_the_table_names_only_known_states_and_events() -> None:
    for t in SESSION_TRANSITIONS:
        assert t.source in SESSION_STATES and set(t.targets) <= set(SESSION_STATES)
        assert t.event in SESSION_EVENTS
    for r in ROUND_TRANSITIONS:
        assert r.source in ROUND_STATUSES and set(r.targets) <= set(ROUND_STATUSES)
        assert r.event in ROUND_EVENTS


def test_the_module_docstring_prints_the_table_as_it_is() -> None:
    shown = "\n".join(f"    {line}" for line in describe().splitlines())
    assert shown in (transitions.__doc__ or "")
    assert len(describe().splitlines()) == len(SESSION_TRANSITIONS) + len(ROUND_TRANSITIONS)


@pytest.mark.parametrize(
    ("scope", "state", "event_type"),
    PAIRS,
    ids=[f"{scope}-{state}-{event.__name__}" for scope, state, event in PAIRS],
)
def test_every_pair_has_a_handler_or_is_refused_leaving_the_store_unchanged(
    scope: str, state: str, event_type: type[SessionEvent | RoundEvent], tmp_path: Path
) -> None:
    row: Transition[Any, Any] | None
    if scope == "session":
        assert issubclass(event_type, SessionEvent)
        row = session_transition(state, event_type)
    else:
        assert issubclass(event_type, RoundEvent)
        row = round_transition(state, event_type)
    if row is not None:
        assert callable(row.handler) and row.targets
        return
    session, round_index = _in_state(scope, state, tmp_path)
    if scope == "session":
        assert session.state() == state
    else:
        assert session.context.round_row(round_index).status == state
    event = EXAMPLES[event_type]
    before = session.store.dump()
    with pytest.raises(TransitionRefused) as refused, session.context.transition():
        # A step's own write first: the refusal must take it back too.
        session.store.drop_member("a", round_index, "a write the refusal takes back")
        if isinstance(event, SessionEvent):
            session.changes.apply_to_session(event, now=1)
        else:
            session.changes.apply_to_round(round_index, event, now=1)
    assert session.store.dump() == before
    sentence = str(refused.value)
    assert event.sentence in sentence and state in sentence
    assert isinstance(refused.value, FailedPrecondition)
    session.store.close()


def test_a_refusal_names_what_the_state_allows(tmp_path: Path) -> None:
    session, _ = _in_state("round", RoundState.OPEN, tmp_path)
    with pytest.raises(TransitionRefused) as refused, session.context.transition():
        session.changes.apply_to_round(0, UnmaskRefused("node 'a' refused"), now=1)
    assert str(refused.value) == (
        "round 0 ('moments') is open, where a survivor refused to unmask is not a change it "
        "can make; while open it changes only when an upload completed the round; or the "
        "round deadline passed with enough survivors; or a withdrawal left nobody awaited; "
        "or the round closed with too few survivors; or the round closed after nodes "
        "dropped from a CAPE model round; or a participant withdrew; or a withdrawal left "
        "too few participants; or the coordinator restarted during the round."
    )
    session.store.close()


def test_round_events_change_only_the_current_round_of_a_running_session(
    tmp_path: Path,
) -> None:
    session, _ = _in_state("round", RoundState.OPEN, tmp_path)
    before = session.store.dump()
    with (
        pytest.raises(TransitionRefused, match="round 5 has not opened"),
        session.context.transition(),
    ):
        session.changes.apply_to_round(5, RoundResumed(), now=1)
    assert session.store.dump() == before
    session.store.close()


def test_a_superseded_round_is_no_longer_current(tmp_path: Path) -> None:
    session, superseded = _in_state("round", RoundState.SUPERSEDED, tmp_path)
    rerun = session.store.round(superseded + 1)
    assert rerun is not None and rerun.status == RoundState.OPEN
    assert rerun.name == "cape-sum/moments"
    session.store.close()


def test_a_change_outside_a_transition_is_refused_as_a_bug(tmp_path: Path) -> None:
    session, _ = _in_state("session", SessionState.RUNNING, tmp_path)
    before = session.store.dump()
    with pytest.raises(RuntimeError, match=r"inside CoordinatorContext\.transition"):
        session.changes.apply_to_round(0, RoundResumed(), now=1)
    assert session.store.dump() == before
    session.store.close()


def test_an_allowed_event_changes_the_state_as_its_row_says(tmp_path: Path) -> None:
    session, _ = _in_state("round", RoundState.AWAITING_UNMASK, tmp_path)
    clock_now = 2_000_000_000_000
    request = session.store.unmask_request(0, 1)
    assert request is not None
    with session.context.transition():
        session.changes.apply_to_round(0, RoundResumed(), now=clock_now)
    moved = session.store.unmask_request(0, 1)
    assert moved is not None and moved.deadline_ms == clock_now + ROUND_MS
    assert session.context.round_row(0).status == RoundState.AWAITING_UNMASK
    session.store.close()


# Store methods that write the session's state or a round's status (or the rows
# that make a status: an opened round, an unmask attempt, a result).
_STATUS_WRITERS = {
    "set_session_state",
    "finalise_roster",
    "set_current_round",
    "set_join_deadline",
    "open_round",
    "set_round_status",
    "set_round_reason",
    "set_unmask_attempt",
    "set_round_deadline",
    "set_unmask_deadline",
    "add_unmask_request",
    "add_result",
}


def test_only_the_table_writes_status() -> None:
    package = Path(inspect.getfile(coordinator)).parent
    writers: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.parent.name == "store":
            continue  # the store defines them
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _STATUS_WRITERS
            ):
                writers.setdefault(node.func.attr, set()).add(path.name)
    assert writers and all(files == {"transitions.py"} for files in writers.values()), writers


def test_a_restart_in_the_join_phase_moves_the_join_deadline_past_the_downtime(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    session, fed = _session(tmp_path, clock, cape=False)
    first = session.status().join_deadline_ms
    session.store.close()
    clock.advance(fed.config.join_timeout_ms * 3)  # the coordinator was down meanwhile
    restarted = Session(Store(tmp_path / "state.sqlite"), fed.config, clock=clock)
    assert restarted.resumed and restarted.state() == SessionState.JOINING
    assert restarted.status().join_deadline_ms == clock.now + fed.config.join_timeout_ms > first
    restarted.join(fed.bundle("a", restarted.session_id), caller="a")
    restarted.store.close()
