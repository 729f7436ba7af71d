"""Withdrawals in the coordinator's state machine, without a network.

A node that stops on purpose before uploading is dropped at once, exactly as
the round deadline would drop it: the survivors unmask its pair terms (the
aggregate is the exact sum over them), a CAPE model round is rerun, or the
session fails when fewer than ``min_nodes`` remain. No test here moves the
clock to a deadline unless it says so: everything happens while the round is
still open. Every refused withdrawal is checked to leave the state file
exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from coordinator.errors import (
    CoordinatorError,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
)
from coordinator.session import Session, Ticket
from coordinator.steps.withdraw import MAX_WITHDRAW_REASON_CHARS
from coordinator.store import Store
from proto.messages import (
    DroppedNode,
    RoundState,
    SessionState,
    WithdrawReceipt,
    WithdrawRequest,
)
from tests.coordinator.support import (
    N_WORDS,
    REJECTED,
    FakeClock,
    Federation,
    join_all,
    make_federation,
    read_result,
    refused,
    reveal_all,
    run_round,
    signed_header,
    spec_for,
    submit_correction,
    unmask_round,
    upload,
    withdraw,
    withdrawal,
    zero_sum,
)


def answer_unmask(
    fed: Federation, session: Session, round_index: int, survivors: list[str], data: object
) -> tuple[str, ...]:
    """Every survivor attests, then sends its pair terms with the dropped nodes."""
    dropped = unmask_round(fed, session, round_index, survivors)
    for node in survivors:
        submit_correction(session, node, round_index, data.correction(node, dropped))  # type: ignore[attr-defined]
    return dropped


# ---------------------------------------------------------------- the survivors go on at once


def test_a_withdrawal_before_the_others_upload_lets_them_finish_without_the_deadline(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=41)
    receipt = withdraw(session, "c")
    assert receipt == WithdrawReceipt(
        session_id=session.session_id,
        round_index=0,
        node_id="c",
        dropped=("c",),
        state=SessionState.RUNNING,
    )
    status = session.status(session.session_id)
    why = f"withdrew from round 0 ('moments'): {REJECTED}"
    assert status.dropped == (DroppedNode("c", 0, why),)
    assert status.rounds[0].state == RoundState.OPEN
    assert status.rounds[0].reason == f"node 'c' {why}"
    assert status.rounds[0].dropped == ("c",)
    upload(session, "a", 0, data.payloads["a"])
    assert session.store.round(0).status == RoundState.OPEN  # type: ignore[union-attr]
    upload(session, "b", 0, data.payloads["b"])
    # The last live upload is in: the next tick takes the deadline's path, no time passed.
    session.tick()
    view = session.result(session.session_id, 0, caller="a")
    assert view.status == RoundState.AWAITING_UNMASK
    assert (view.survivors, view.dropped) == (("a", "b"), ("c",))
    assert answer_unmask(fed, session, 0, ["a", "b"], data) == ("c",)
    np.testing.assert_array_equal(read_result(session, 0), data.total(["a", "b"]))
    assert session.store.round(1).participants == ("a", "b")  # type: ignore[union-attr]
    # The reason stays in the status after the round completed.
    assert session.status().dropped == (DroppedNode("c", 0, why),)


def test_a_withdrawal_after_the_others_uploaded_starts_the_unmask_at_once(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=42)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    receipt = withdraw(session, "c", reason="releasing round 0 would exceed my ε budget")
    assert receipt.dropped == ("c",) and receipt.state == SessionState.RUNNING
    assert session.store.round(0).status == RoundState.AWAITING_UNMASK  # type: ignore[union-attr]
    assert answer_unmask(fed, session, 0, ["a", "b"], data) == ("c",)
    np.testing.assert_array_equal(read_result(session, 0), data.total(["a", "b"]))


def test_a_withdrawal_in_a_later_round_keeps_the_earlier_aggregate(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    first = zero_sum(fed.node_ids, N_WORDS, seed=43)
    run_round(fed, session, 0, first.payloads)
    second = zero_sum(fed.node_ids, N_WORDS, seed=44)
    upload(session, "a", 1, second.payloads["a"])
    upload(session, "c", 1, second.payloads["c"])
    withdraw(session, "b", 1)
    assert answer_unmask(fed, session, 1, ["a", "c"], second) == ("b",)
    np.testing.assert_array_equal(read_result(session, 0), first.total(fed.node_ids))
    np.testing.assert_array_equal(read_result(session, 1), second.total(["a", "c"]))
    assert session.state() == SessionState.COMPLETED


def test_the_same_withdrawal_again_gets_the_same_receipt_and_changes_nothing(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    first = withdraw(session, "c")
    before = session.store.dump()
    again = withdraw(session, "c", reason=f"  {REJECTED}\n")  # the same sentence, re-spaced
    assert again == first
    assert session.store.dump() == before


def test_the_same_withdrawal_is_acknowledged_after_the_round_moved_on(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=45)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    first = withdraw(session, "c")
    answer_unmask(fed, session, 0, ["a", "b"], data)
    assert session.store.round(0).status == RoundState.READY  # type: ignore[union-attr]
    assert withdraw(session, "c") == first


def test_a_withdrawal_streaming_an_upload_takes_it_out_of_the_sum(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=46)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    header = signed_header(session, "c", 0, "moments", spec_for(data.payloads["c"]))
    ticket = session.begin_upload(header, caller="c")
    assert isinstance(ticket, Ticket)
    raw = data.payloads["c"].astype("<u8").tobytes()
    session.receive(ticket, 0, raw[:99])
    withdraw(session, "c")
    with pytest.raises(FailedPrecondition, match="dropped while the stream was in progress"):
        session.receive(ticket, 99, raw[99:])
    session.abandon(ticket)
    answer_unmask(fed, session, 0, ["a", "b"], data)
    np.testing.assert_array_equal(read_result(session, 0), data.total(["a", "b"]))


def test_a_withdrawal_settles_after_a_restart_between_it_and_the_last_upload(
    fed: Federation, state_path: Path, clock: FakeClock
) -> None:
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=47)
    withdraw(session, "c")
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    session.store.close()  # the process dies before its ticker ran
    restarted = Session(Store(state_path), fed.config, clock=clock)
    restarted.tick()
    assert restarted.store.round(0).status == RoundState.AWAITING_UNMASK  # type: ignore[union-attr]
    answer_unmask(fed, restarted, 0, ["a", "b"], data)
    np.testing.assert_array_equal(read_result(restarted, 0), data.total(["a", "b"]))
    restarted.store.close()


def test_a_cape_model_round_withdrawal_reruns_the_cape_sum_at_once(
    clock: FakeClock, state_path: Path
) -> None:
    fed = make_federation(("a", "b", "c"), construction="cape")
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    blind = zero_sum(fed.node_ids, N_WORDS, seed=48)
    run_round(fed, session, 0, blind.payloads)
    model = zero_sum(fed.node_ids, N_WORDS, seed=49)
    upload(session, "a", 1, model.payloads["a"])
    upload(session, "b", 1, model.payloads["b"])
    withdraw(session, "c", 1)
    status = session.status()
    assert [(r.name, r.state) for r in status.rounds] == [
        ("cape-sum/moments", RoundState.READY),
        ("moments", RoundState.SUPERSEDED),
        ("cape-sum/moments", RoundState.OPEN),
    ]
    assert session.store.round(2).participants == ("a", "b")  # type: ignore[union-attr]
    session.store.close()


# ---------------------------------------------------------------- too few remain


def test_withdrawals_leaving_fewer_than_min_nodes_fail_the_session_at_once(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    withdraw(session, "b", reason="my noise floor cannot be kept")
    assert session.state() == SessionState.RUNNING
    receipt = withdraw(session, "c")
    assert receipt.dropped == ("b", "c") and receipt.state == SessionState.ABORTED
    assert session.reason() == (
        "only 1 of 3 nodes remain in round 'moments' (a); the federation requires at least 2; "
        "node 'b' withdrew from round 0 ('moments'): my noise floor cannot be kept; "
        f"node 'c' withdrew from round 0 ('moments'): {REJECTED}"
    )
    view = session.result(session.session_id, 0, caller="a")
    assert view.status == RoundState.FAILED and view.reason == session.reason()
    # a was not dropped: it did nothing wrong, and learns the reason from the status.
    assert {m.node_id: m.status for m in session.store.members()}["a"] == "live"


def test_a_withdrawal_then_a_missed_deadline_keeps_both_reasons(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    upload(session, "a", 0, zero_sum(fed.node_ids, N_WORDS, seed=50).payloads["a"])
    withdraw(session, "c")
    session.tick(clock.advance(59_999))
    assert session.store.round(0).status == RoundState.OPEN  # type: ignore[union-attr]
    session.tick(clock.advance(1))  # b never uploads
    assert session.state() == SessionState.ABORTED
    assert session.reason() == (
        "only 1 of 3 nodes submitted round 'moments' (b, c dropped); the federation requires "
        f"at least 2; node 'c' withdrew from round 0 ('moments'): {REJECTED}"
    )
    assert session.status().dropped == (
        DroppedNode("b", 0, "missed the deadline of round 0 ('moments')"),
        DroppedNode("c", 0, f"withdrew from round 0 ('moments'): {REJECTED}"),
    )


# ---------------------------------------------------------------- refused withdrawals


def test_a_withdrawal_after_the_upload_is_refused_and_the_upload_stays(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=51)
    upload(session, "c", 0, data.payloads["c"])
    message = refused(session, FailedPrecondition, lambda: withdraw(session, "c"))
    assert message == (
        "withdrawal of node 'c' from round 0: node 'c' has already uploaded round 0 "
        "('moments'); its upload stays in the round, because withdrawing now would let its "
        "pair terms be revealed next to its payload."
    )
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    # Everyone uploaded, so the survivors reveal their seeds only.
    reveal_all(fed, session, 0)
    np.testing.assert_array_equal(read_result(session, 0), data.total(fed.node_ids))


def test_a_withdrawal_during_the_unmask_phase_is_refused(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=52)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    session.tick(clock.advance(60_000))
    message = refused(session, FailedPrecondition, lambda: withdraw(session, "a"))
    assert "awaiting unmask corrections" in message and "refusal" in message
    # c, dropped at the deadline, cannot withdraw afterwards either.
    message = refused(session, FailedPrecondition, lambda: withdraw(session, "c"))
    assert "was dropped from this session in round 0: missed the deadline" in message


@pytest.mark.parametrize(
    ("error", "make", "words"),
    [
        (
            InvalidArgument,
            lambda s: withdrawal(s, "c", session_id="f" * 32),
            "is not this coordinator's session",
        ),
        (FailedPrecondition, lambda s: withdrawal(s, "c", 1), "round_index 1 has not opened"),
        (InvalidArgument, lambda s: withdrawal(s, "c", reason=" \n "), "gives no reason"),
        (
            InvalidArgument,
            lambda s: withdrawal(s, "c", reason="x" * (MAX_WITHDRAW_REASON_CHARS + 1)),
            f"1001 characters long; at most {MAX_WITHDRAW_REASON_CHARS}",
        ),
    ],
    ids=["wrong-session", "round-not-open", "no-reason", "reason-too-long"],
)
def test_malformed_withdrawals_are_refused_and_change_nothing(
    fed: Federation,
    session: Session,
    error: type[CoordinatorError],
    make: Callable[[Session], WithdrawRequest],
    words: str,
) -> None:
    join_all(fed, session)
    message = refused(session, error, lambda: session.withdraw(make(session), caller="c"))
    assert words in message


def test_a_withdrawal_for_another_node_or_from_outside_is_permission_denied(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    request = withdrawal(session, "c")
    message = refused(session, PermissionDenied, lambda: session.withdraw(request, caller="a"))
    assert "belongs to node 'a'" in message
    outsider = withdrawal(session, "zed")
    message = refused(session, PermissionDenied, lambda: session.withdraw(outsider, caller="zed"))
    assert "not a member of federation" in message


def test_a_second_withdrawal_with_another_reason_is_refused(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    withdraw(session, "c")
    message = refused(
        session, FailedPrecondition, lambda: withdraw(session, "c", reason="something else")
    )
    assert (
        f"was dropped from this session in round 0: withdrew from round 0 ('moments'): {REJECTED}"
        in message
    )


def test_a_withdrawal_from_a_finished_round_or_an_ended_session_is_refused(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=53)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    # Every upload is in: the round unmasks, and a survivor that will not go on refuses.
    message = refused(session, FailedPrecondition, lambda: withdraw(session, "c", 0))
    assert "is awaiting unmask corrections" in message and "refusal" in message
    reveal_all(fed, session, 0)
    message = refused(session, FailedPrecondition, lambda: withdraw(session, "c", 0))
    assert "round 0 ('moments') is ready; only the open current round" in message
    withdraw(session, "a", 1)
    withdraw(session, "b", 1)
    assert session.state() == SessionState.ABORTED
    message = refused(session, FailedPrecondition, lambda: withdraw(session, "c", 1))
    assert "has ended (failed: only 1 of 3 nodes remain" in message


def test_a_node_that_never_joined_cannot_withdraw(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session, ["a", "b"])
    session.tick(clock.advance(60_000))
    message = refused(session, PermissionDenied, lambda: withdraw(session, "c"))
    assert "before its join deadline" in message and "not on the session's roster" in message


def test_a_withdrawal_during_the_join_phase_is_refused(fed: Federation, session: Session) -> None:
    join_all(fed, session, ["a", "b"])
    message = refused(session, FailedPrecondition, lambda: withdraw(session, "a"))
    assert "no round has opened yet" in message


def test_a_withdrawal_reason_with_terminal_escapes_is_stored_escaped(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    withdraw(session, "c", reason="stopping \x1b[2J\x1b[31mnow\x1b[0m\x07")
    (dropped,) = session.status().dropped
    assert "\x1b" not in dropped.reason and "\x07" not in dropped.reason
    assert "stopping" in dropped.reason and "now" in dropped.reason
