"""The one converter: both ends' plain messages survive a trip through the stubs."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import Message

from noise.layout import Layout, TensorSlot
from proto.chunks import payload_chunks, payload_header, payload_spec
from proto.convert import (
    attestation_from_pb,
    attestation_to_pb,
    join_request_to_pb,
    join_response_from_pb,
    join_response_to_pb,
    key_bundle_from_pb,
    payload_spec_from_pb,
    payload_spec_to_pb,
    result_header_from_pb,
    result_header_to_pb,
    result_request_from_pb,
    result_request_to_pb,
    roster_from_pb,
    roster_request_from_pb,
    roster_request_to_pb,
    roster_to_pb,
    round_result_from_pb,
    round_state_from_pb,
    session_state_from_pb,
    status_from_pb,
    status_request_from_pb,
    status_request_to_pb,
    status_to_pb,
    unmask_chunks_to_pb,
    unmask_header_from_pb,
    unmask_header_to_pb,
    unmask_refusal_chunks_to_pb,
    unmask_refusal_from_pb,
    unmask_refusal_to_pb,
    unmask_request_from_pb,
    unmask_request_to_pb,
    upload_chunks_to_pb,
    upload_header_from_pb,
    upload_header_to_pb,
    upload_receipt_from_pb,
    upload_receipt_to_pb,
    withdraw_receipt_from_pb,
    withdraw_receipt_to_pb,
    withdraw_request_from_pb,
    withdraw_request_to_pb,
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
        digest=b"\x02" * 32,
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


# ---------------------------------------- requests the node sends, and the result header
#
# Each message is written with every field set, read into its plain type and
# written again: the two messages, and their bytes on the wire, are equal.

LAYOUT = Layout.of({"w": (2, 3), "b": (1,)})
WORDS = np.arange(LAYOUT.size, dtype=np.uint64)
PAYLOAD = payload_header(WORDS, LAYOUT, 20)
CONTRIBUTION = pb.SealedContribution(
    sender_node_id="b", recipient_node_id="a", sealed=b"x" * 48, signature=b"s" * 64
)
TAGS = pb.SealedTags(
    sender_node_id="b", recipient_node_id="a", sealed=b"y" * 80, signature=b"t" * 64
)


def _same(before: Message, after: Message) -> None:
    assert after == before
    assert after.SerializeToString(deterministic=True) == before.SerializeToString(
        deterministic=True
    )


def test_a_payload_header_round_trips_and_matches_the_one_proto_chunks_writes() -> None:
    _same(PAYLOAD, payload_spec_to_pb(payload_spec_from_pb(PAYLOAD)))
    _same(PAYLOAD, payload_spec_to_pb(payload_spec(WORDS, LAYOUT, 20)))
    known = payload_spec(None, LAYOUT, 20, digest=bytes(PAYLOAD.digest))
    assert known == payload_spec(WORDS, LAYOUT, 20)


def test_a_join_request_round_trips() -> None:
    request = pb.JoinRequest(
        bundle=pb.KeyBundle(
            config_hash=b"\x01" * 32,
            session_id="s",
            node_id="a",
            public_key=b"\x02" * 32,
            signature=b"\x03" * 64,
        )
    )
    _same(request, join_request_to_pb(key_bundle_from_pb(request)))


def test_the_requests_that_ask_round_trip() -> None:
    status = pb.GetStatusRequest(session_id="s")
    _same(status, status_request_to_pb(status_request_from_pb(status)))
    _same(
        pb.GetStatusRequest(), status_request_to_pb(status_request_from_pb(pb.GetStatusRequest()))
    )
    roster = pb.GetRosterRequest(session_id="s", node_id="a")
    _same(roster, roster_request_to_pb(roster_request_from_pb(roster)))
    result = pb.GetResultRequest(session_id="s", round_index=3, node_id="a")
    _same(result, result_request_to_pb(result_request_from_pb(result)))
    withdraw = pb.WithdrawRequest(session_id="s", round_index=2, node_id="a", reason="no data")
    _same(withdraw, withdraw_request_to_pb(withdraw_request_from_pb(withdraw)))


def test_an_upload_header_round_trips_and_its_stream_is_header_then_chunks() -> None:
    header = pb.UploadHeader(
        session_id="s",
        round_index=1,
        round_name="scatter",
        node_id="a",
        payload=PAYLOAD,
        roster_hash=b"\x04" * 32,
        statement_signature=b"\x05" * 64,
        self_mask_commitment=b"\x06" * 32,
        challenge=[CONTRIBUTION],
    )
    plain = upload_header_from_pb(header)
    _same(header, upload_header_to_pb(plain))
    stream = list(upload_chunks_to_pb(plain, WORDS))
    # Data chunks leave encoded: the very bytes protobuf would send.
    assert stream == [
        pb.UploadChunk(header=header),
        *(pb.UploadChunk(data=c).SerializeToString() for c in payload_chunks(WORDS)),
    ]


def test_an_attestation_round_trips_with_its_tags() -> None:
    attestation = pb.SurvivorAttestation(
        session_id="s",
        round_index=1,
        node_id="a",
        survivor_hash=b"\x07" * 32,
        signature=b"\x08" * 64,
        sealed_tags=[TAGS],
    )
    _same(attestation, attestation_to_pb(attestation_from_pb(attestation)))


def test_an_unmask_answer_round_trips_with_and_without_corrections() -> None:
    header = pb.UnmaskHeader(
        session_id="s",
        round_index=1,
        round_name="scatter",
        node_id="a",
        dropped_node_ids=["c", "d"],
        survivor_hash=b"\x09" * 32,
        payload=PAYLOAD,
        self_mask_seed=b"\x0a" * 32,
    )
    plain = unmask_header_from_pb(header)
    _same(header, unmask_header_to_pb(plain))
    assert list(unmask_chunks_to_pb(plain, WORDS)) == [
        pb.UnmaskChunk(header=header),
        *(pb.UnmaskChunk(data=c).SerializeToString() for c in payload_chunks(WORDS)),
    ]
    seed_only = pb.UnmaskHeader(
        session_id="s", round_index=1, round_name="scatter", node_id="a", self_mask_seed=b"\x0b"
    )
    plain = unmask_header_from_pb(seed_only)
    assert plain.payload is None
    _same(seed_only, unmask_header_to_pb(plain))
    assert not unmask_header_to_pb(plain).HasField("payload")
    assert list(unmask_chunks_to_pb(plain, None)) == [pb.UnmaskChunk(header=seed_only)]


def test_an_unmask_refusal_round_trips_as_the_one_message_of_its_stream() -> None:
    refusal = pb.UnmaskRefusal(
        session_id="s",
        round_index=1,
        node_id="a",
        dropped_node_ids=["c"],
        survivor_hash=b"\x0c" * 32,
        reason="the tags of b do not open",
        accused_node_id="b",
    )
    plain = unmask_refusal_from_pb(refusal)
    _same(refusal, unmask_refusal_to_pb(plain))
    assert list(unmask_refusal_chunks_to_pb(plain)) == [pb.UnmaskChunk(refusal=refusal)]


def test_a_result_header_round_trips_ready_and_awaiting() -> None:
    ready = pb.ResultHeader(
        session_id="s",
        round_index=1,
        round_name="scatter",
        status=pb.ROUND_STATUS_READY,
        reason="",
        deadline_unix_ms=99,
        survivor_node_ids=["a", "b"],
        dropped_node_ids=["c"],
        survivor_hash=b"\x0d" * 32,
        payload=PAYLOAD,
        statements=[
            pb.UploadStatement(
                node_id="a",
                round_name="scatter",
                roster_hash=b"\x0e" * 32,
                payload_digest=b"\x0f" * 32,
                signature=b"\x10" * 64,
            )
        ],
        sealed_tags=[TAGS],
    )
    _same(ready, result_header_to_pb(result_header_from_pb(ready)))
    request = UnmaskRequest(
        session_id="s",
        round_index=1,
        round_name="scatter",
        dropped=("c",),
        survivors=("a", "b"),
        survivor_hash=b"\x0d" * 32,
        tensors=LAYOUT.slots,
        fixed_point_bits=20,
        deadline_ms=5,
        min_survivors=2,
    )
    awaiting = pb.ResultHeader(
        session_id="s",
        round_index=1,
        round_name="scatter",
        status=pb.ROUND_STATUS_AWAITING_UNMASK,
        reason="c dropped",
        survivor_node_ids=["a", "b"],
        dropped_node_ids=["c"],
        unmask_request=unmask_request_to_pb(request),
    )
    plain = result_header_from_pb(awaiting)
    assert plain.payload is None and plain.unmask_request == request
    _same(awaiting, result_header_to_pb(plain))
    assert not result_header_to_pb(plain).HasField("payload")


def test_a_node_reads_a_result_header_as_its_round_result() -> None:
    header = pb.ResultHeader(
        round_index=2,
        round_name="moments",
        status=pb.ROUND_STATUS_READY,
        survivor_node_ids=["a", "b"],
        dropped_node_ids=["c"],
        payload=PAYLOAD,
        sealed_tags=[TAGS],
    )
    result = round_result_from_pb(header, aggregate=WORDS, layout=LAYOUT)
    assert result.state is RoundState.READY and result.aggregate is WORDS
    assert (result.survivors, result.dropped, result.layout) == (("a", "b"), ("c",), LAYOUT)
    assert result.tags == (Sealed("b", "a", b"y" * 80, b"t" * 64),)
