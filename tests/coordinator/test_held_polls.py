"""Held result polls are woken by a change to what their nodes act on, and by nothing else.

A poll that would show nothing new waits (a long poll). Every commit is
followed by one comparison of the progress of each round a poll waits on;
only a change wakes the polls, so K held polls cost nothing per commit that
changes nothing for them (another node's upload, one more attestation).
"""

from __future__ import annotations

import threading
import time

from coordinator.session import Session
from proto.messages import RoundState
from tests.coordinator.support import (
    N_WORDS,
    Federation,
    attest_all,
    join_all,
    upload,
    zero_sum,
)

HOLD = 30.0  # far longer than any test here: only a change ends a held poll


def _hold(session: Session, node: str, round_index: int, out: list[RoundState]) -> threading.Thread:
    """A held poll of ``node`` in a thread; its view's status goes to ``out``."""

    def poll() -> None:
        view = session.result(session.session_id, round_index, caller=node, hold_seconds=HOLD)
        out.append(view.status)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


def _held_until(thread: threading.Thread, seconds: float = 0.3) -> bool:
    """Whether ``thread`` is still waiting after ``seconds``."""
    thread.join(timeout=seconds)
    return thread.is_alive()


def test_commits_that_change_nothing_wake_no_held_poll(fed: Federation, session: Session) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=31)
    held = session._views._held
    for node in fed.node_ids:  # each node's first poll is answered at once
        assert session.result(session.session_id, 0, caller=node).status == RoundState.OPEN
    statuses: list[RoundState] = []
    threads = [_hold(session, node, 0, statuses) for node in ("b", "c")]
    assert all(_held_until(t) for t in threads)
    changes = held.changes
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    # Two commits, each seen once by the comparison, neither a change to the round's status.
    assert held.changes == changes
    assert all(_held_until(t) for t in threads)
    assert statuses == []
    upload(session, "c", 0, data.payloads["c"])  # the last upload: the unmask step starts
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive(), "a held poll did not hear that the round moved on"
    assert held.changes == changes + 1
    assert statuses == [RoundState.AWAITING_UNMASK] * 2


def test_a_held_poll_hears_that_every_survivor_attested(fed: Federation, session: Session) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=32)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    assert session.result(session.session_id, 0, caller="a").status == RoundState.AWAITING_UNMASK
    statuses: list[RoundState] = []
    thread = _hold(session, "a", 0, statuses)
    assert _held_until(thread)
    attest_all(fed, session, 0)
    thread.join(timeout=10)
    assert not thread.is_alive(), "the held poll did not hear that every survivor signed"
    assert statuses == [RoundState.AWAITING_UNMASK]


def test_a_poll_answered_at_once_leaves_nothing_registered(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    held = session._views._held
    for _ in range(3):
        session.result(session.session_id, 0, caller="a")
    assert held._waiting == {} and held._last == {}
    started = time.monotonic()
    # Held for its whole time when nothing changes, then answered with the same view.
    view = session.result(session.session_id, 0, caller="a", hold_seconds=0.3)
    assert time.monotonic() - started >= 0.3 and view.status == RoundState.OPEN
    assert held._waiting == {} and held._last == {}
