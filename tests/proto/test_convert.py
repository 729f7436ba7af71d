"""The one converter: both ends' plain messages survive a trip through the stubs."""

from __future__ import annotations

import pytest

from noise.layout import TensorSlot
from proto.convert import (
    join_response_from_pb,
    join_response_to_pb,
    key_bundle_from_pb,
    result_header_from_pb,
    roster_from_pb,
    roster_to_pb,
    round_state_from_pb,
    session_state_from_pb,
    status_from_pb,
    status_to_pb,
    unmask_request_from_pb,
    unmask_request_to_pb,
    upload_receipt_from_pb,
    upload_receipt_to_pb,
    withdraw_receipt_from_pb,
    withdraw_receipt_to_pb,
)
from proto.errors import MalformedMessage
from proto.messages import (
    Attestation,
    DroppedNode,
    JoinReceipt,
    RosterView,
    RoundDeadline,
    RoundState,
    RoundSummary,
    Sealed,
    SessionState,
    SessionStatus,
    UnmaskRequest,
    UploadReceipt,
    WithdrawReceipt,
)
from proto.zerosum.v1 import session_pb2 as pb


def test_every_round_state_crosses_the_wire_both_ways() -> None:
    for state in RoundState:
        if state is RoundState.UNKNOWN:
            continue
        summary = RoundSummary(3, "cape-sum/moments", state, ("a",), ("b",), "why", 7)
        status = SessionStatus(
            session_id="s",
            state=SessionState.RUNNING,
            config_hash=b"h",
            reason="",
            rounds=(summary,),
        )
        assert status_from_pb(status_to_pb(status)).rounds == (summary,)


def test_superseded_is_its_own_status_on_the_wire() -> None:
    summary = RoundSummary(1, "m", RoundState.SUPERSEDED, (), ("c",), "rerun as round 2")
    status = SessionStatus(
        session_id="s", state=SessionState.RUNNING, config_hash=b"", reason="", rounds=(summary,)
    )
    assert status_to_pb(status).rounds[0].status == pb.ROUND_STATUS_SUPERSEDED
    assert round_state_from_pb(pb.ROUND_STATUS_SUPERSEDED).given_up
    assert round_state_from_pb(pb.ROUND_STATUS_FAILED).given_up
    assert not round_state_from_pb(pb.ROUND_STATUS_READY).given_up


def test_a_status_this_version_does_not_know_reads_as_unknown() -> None:
    assert round_state_from_pb(99) is RoundState.UNKNOWN
    assert session_state_from_pb(99) is SessionState.UNKNOWN
    assert session_state_from_pb(pb.SESSION_STATE_ABORTED) is SessionState.ABORTED


def test_the_stored_values_of_the_states_are_kept() -> None:
    # The coordinator's SQLite file holds these strings; they must read back as members.
    assert SessionState("failed") is SessionState.ABORTED and SessionState.ABORTED.ended
    assert RoundState("unmask") is RoundState.AWAITING_UNMASK
    assert RoundState("superseded") is RoundState.SUPERSEDED


def test_a_session_status_round_trips_with_every_field() -> None:
    status = SessionStatus(
        session_id="s",
        state=SessionState.ABORTED,
        config_hash=b"\x01" * 32,
        reason="deadline passed",
        rounds=(RoundSummary(0, "moments", RoundState.FAILED, ("a", "b"), ("c",), "c left", 5),),
        joined=("a", "b", "c"),
        dropped=(DroppedNode("c", 0, "silent"),),
        federation_id="f",
        current_round_index=0,
        current_round_name="moments",
        submitted=("a", "b"),
        excluded=("d",),
        join_deadline_ms=11,
        min_nodes=2,
    )
    assert status_from_pb(status_to_pb(status)) == status


def test_answers_round_trip() -> None:
    join = JoinReceipt(
        rejoined=True,
        joined_count=2,
        federation_size=3,
        session_id="s",
        node_id="a",
        join_deadline_ms=9,
    )
    assert join_response_from_pb(join_response_to_pb(join)) == join
    upload = UploadReceipt(
        duplicate=False,
        submitted_count=1,
        expected_count=3,
        sha256=b"\x02" * 32,
        received_bytes=64,
        session_id="s",
        round_index=1,
        node_id="a",
        received_ms=12,
    )
    assert upload_receipt_from_pb(upload_receipt_to_pb(upload)) == upload
    withdraw = WithdrawReceipt(
        dropped=("c",), session_id="s", round_index=0, node_id="c", state=SessionState.RUNNING
    )
    assert withdraw_receipt_from_pb(withdraw_receipt_to_pb(withdraw)) == withdraw
    roster = RosterView(
        session_id="s",
        config_hash=b"\x03" * 32,
        bundles=(),
        roster_hash=b"\x04" * 32,
        final=True,
        excluded=("d",),
        version=4,
        join_deadline_ms=8,
        round_deadline_seconds=30.0,
        round_deadlines=(RoundDeadline(0, "moments", 99),),
    )
    assert roster_from_pb(roster_to_pb(roster)) == roster


def test_an_unmask_request_round_trips_and_none_is_pending_only() -> None:
    request = UnmaskRequest(
        session_id="s",
        round_index=2,
        round_name="scatter",
        dropped=("c",),
        survivors=("a", "b"),
        survivor_hash=b"\x05" * 32,
        attestations=(Attestation("a", b"\x05" * 32, b"sig", session_id="s", round_index=2),),
        tensors=(TensorSlot(name="w", shape=(2, 3), offset=0, size=6),),
        fixed_point_bits=20,
        deadline_ms=77,
        min_survivors=2,
        challenge=(Sealed("b", "a", b"x" * 48, b"sig"),),
        tags=(Sealed("b", "a", b"y" * 80, b"sig"),),
    )
    assert unmask_request_from_pb(unmask_request_to_pb(request)) == request
    idle = UnmaskRequest(session_id="s", round_index=2, round_name="scatter", pending=False)
    assert unmask_request_from_pb(unmask_request_to_pb(idle)) is None


def test_text_from_a_peer_is_made_safe_on_the_way_in() -> None:
    header = pb.ResultHeader(round_index=1, status=pb.ROUND_STATUS_FAILED, reason="bad\x1b[2J")
    result = result_header_from_pb(header)
    assert result.state is RoundState.FAILED and "\x1b" not in result.reason


def test_a_join_without_a_bundle_or_with_a_bad_one_is_refused_by_name() -> None:
    with pytest.raises(MalformedMessage, match="no key bundle"):
        key_bundle_from_pb(pb.JoinRequest())
    bad = pb.JoinRequest(bundle=pb.KeyBundle(node_id="a", session_id="s", public_key=b"short"))
    with pytest.raises(MalformedMessage, match="malformed"):
        key_bundle_from_pb(bad)
