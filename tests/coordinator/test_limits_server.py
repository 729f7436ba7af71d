"""One member misbehaves against a real mutual-TLS server on 127.0.0.1; the others finish exactly.

Each test starts the coordinator's gRPC server over a real SQLite state file
with certificates made in the test, lets node 'c' misbehave in one way
(streams that never speak, a stream that stops after its header, an upload
announcing far more than the round's public layout, calls from outside the
federation or the roster), and checks that

* 'c' alone is refused, with the status and a sentence naming the limit;
* 'a' and 'b' are served all along and finish the round exactly: the
  aggregate is the exact sum of their values, 'c' dropped at the deadline;
* no call anywhere was answered UNKNOWN, and every call slot is free again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from coordinator.limits import ServerLimits
from coordinator.logs import CoordinatorLog
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc
from tests.coordinator.server_harness import (
    Certificates,
    Harness,
    answer,
    answer_messages,
    as_bytes,
    attest,
    certificates,
    code_of,
    fetch_result,
    joined,
    layout_messages,
    send,
    sent,
    start_limited,
    unmask_request,
    upload_messages,
)
from tests.coordinator.support import N_WORDS, ZeroSum, zero_sum

__all__ = ["certificates"]  # the module-scoped fixture, shared with test_server

pytestmark = pytest.mark.integration


@pytest.fixture
def limited(tmp_path: Path, certificates: Certificates) -> Iterator[Harness]:
    h = start_limited(tmp_path, certificates, round_ms=4000)
    yield h
    h.close()


def honest_finish(h: Harness, data: ZeroSum) -> None:
    """'a' and 'b' upload; 'c' is dropped at the deadline; the aggregate is exact over a, b."""
    for node in ("a", "b"):
        receipt = send(h, node, upload_messages(h, node, 0, sent(h, node, 0, data.payloads[node])))
        assert receipt.node_id == node and not receipt.duplicate
    request = unmask_request(h, "a", 0)
    assert list(request.dropped_node_ids) == ["c"]
    for node in ("a", "b"):
        attest(h, node, request)
    for node in ("a", "b"):
        answer = h.stub(node).SubmitUnmask(
            _answer(h, node, request, as_bytes(data.correction(node, ["c"]))), timeout=30
        )
        assert answer.accepted
    for node in ("a", "b"):
        header, payload = fetch_result(h, node, 0)
        assert header.status == pb.ROUND_STATUS_READY
        np.testing.assert_array_equal(np.frombuffer(payload, dtype="<u8"), data.total(["a", "b"]))
    for node in ("a", "b", "c"):
        assert slots_held_after_return(h, node) == 0


def _answer(
    h: Harness, node: str, request: pb.UnmaskRequest, correction: bytes
) -> Iterator[pb.UnmaskChunk]:
    return answer_messages(h, node, request, correction)


def status_probes(h: Harness, node: str, seconds: float) -> tuple[int, int]:
    """GetStatus calls of ``node`` with a 1 s deadline for ``seconds``: (answered, made)."""
    answered = made = 0
    stub = h.stub(node)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        made += 1
        code, _ = code_of(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=1.0))
        answered += code == grpc.StatusCode.OK
    return answered, made


def slots_held_after_return(h: Harness, node: str) -> int:
    """The calls ``node`` holds once its handlers have returned (waiting at most 5 s).

    A handler gives its slot back as it returns, which can follow the status
    the client already holds by a moment.
    """
    until = time.monotonic() + 5.0
    while h.server.guard.slots.held(node) and time.monotonic() < until:
        time.sleep(0.01)
    return h.server.guard.slots.held(node)


def connected_stub(h: Harness, node: str) -> pb_grpc.CoordinatorStub:
    """A stub whose channel has finished its TLS handshake (a call then reaches the server)."""
    stub = h.stub(node)
    grpc.channel_ready_future(h.channels[-1]).result(timeout=10)
    return stub


def silent_stream(release: threading.Event) -> Iterator[pb.UploadChunk]:
    """An upload stream that sends nothing until ``release`` is set, then ends."""
    release.wait(30)
    yield from ()


# ---------------------------------------------------------------- the tests


def test_forty_silent_streams_of_one_member_leave_the_others_served(limited: Harness) -> None:
    h = limited
    h.join("c")
    release = threading.Event()
    stub = connected_stub(h, "c")
    calls = [stub.UploadEgress.future(silent_stream(release), timeout=20) for _ in range(40)]
    try:
        # While c's streams are open, a and b join and every status probe is answered.
        h.join("a")
        h.join("b")
        answered, made = status_probes(h, "b", 0.5)
        assert answered == made > 0
        outcomes = [code_of(call.result) for call in calls]
    finally:
        release.set()
    codes = [code for code, _ in outcomes]
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 36
    assert codes.count(grpc.StatusCode.DEADLINE_EXCEEDED) == 4
    exhausted = next(d for c, d in outcomes if c == grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert "node 'c' already has 4 calls in progress" in exhausted
    silent = next(d for c, d in outcomes if c == grpc.StatusCode.DEADLINE_EXCEEDED)
    assert "UploadEgress of node 'c': no first message within 1 s" in silent
    assert slots_held_after_return(h, "c") == 0
    # c's slots are free again: its next call is served.
    assert code_of(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=5))[0] == (
        grpc.StatusCode.OK
    )
    honest_finish(h, zero_sum(("a", "b", "c"), N_WORDS, seed=81))


def test_a_stream_that_stops_after_its_header_is_ended_and_the_round_finishes(
    limited: Harness,
) -> None:
    h = limited
    joined(h)
    data = zero_sum(("a", "b", "c"), N_WORDS, seed=82)
    release = threading.Event()

    def header_then_silence() -> Iterator[pb.UploadChunk]:
        yield next(upload_messages(h, "c", 0, sent(h, "c", 0, data.payloads["c"]), chunk=64))
        release.wait(30)

    started = time.monotonic()
    code, details = code_of(lambda: h.stub("c").UploadEgress(header_then_silence(), timeout=20))
    release.set()
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "message 2 did not arrive within 1 s" in details
    assert time.monotonic() - started < 10
    # Nothing of c's partial upload was kept.
    assert h.session.store.upload(0, "c") is None
    honest_finish(h, data)


def test_an_upload_announcing_more_than_the_layout_is_refused_before_a_byte(
    limited: Harness, tmp_path: Path
) -> None:
    h = limited
    joined(h)
    data = zero_sum(("a", "b", "c"), N_WORDS, seed=83)
    announced = 8 << 30
    chunk = b"\x01" * (1 << 20)
    chunks_pulled = 0

    def oversized() -> Iterator[pb.UploadChunk]:
        nonlocal chunks_pulled
        header = next(upload_messages(h, "c", 0, sent(h, "c", 0, data.payloads["c"])))
        header.header.payload.total_bytes = announced
        header.header.payload.total_elements = announced // 8
        big = layout_messages()
        big[-1].size = announced // 8 - 16
        del big[-1].shape[:]
        big[-1].shape.append(announced // 8 - 16)
        del header.header.payload.tensors[:]
        header.header.payload.tensors.extend(big)
        yield header
        for index in range(256):  # up to 256 MiB, as a hostile node would send
            chunks_pulled += 1
            yield pb.UploadChunk(data=pb.PayloadChunk(offset=index << 20, data=chunk))

    before = h.session.store.dump()
    code, details = code_of(lambda: h.stub("c").UploadEgress(oversized(), timeout=20))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"announces {announced} bytes" in details and "has 288 bytes (36 words)" in details
    assert h.session.store.dump() == before
    files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith("state")]
    assert files == []
    # gRPC stops pulling from the sender once the call has ended.
    assert chunks_pulled < 256
    honest_finish(h, data)


RPCS: dict[str, Callable[[Harness, str], object]] = {
    "Join": lambda h, n: h.stub(n).Join(
        pb.JoinRequest(bundle=pb.KeyBundle(session_id=h.session_id, node_id=n)), timeout=5
    ),
    "GetRoster": lambda h, n: h.stub(n).GetRoster(
        pb.GetRosterRequest(session_id=h.session_id, node_id=n), timeout=5
    ),
    "UploadEgress": lambda h, n: h.stub(n).UploadEgress(
        iter([pb.UploadChunk(header=pb.UploadHeader(session_id=h.session_id, node_id=n))]),
        timeout=5,
    ),
    "GetResult": lambda h, n: list(
        h.stub(n).GetResult(
            pb.GetResultRequest(session_id=h.session_id, round_index=0, node_id=n), timeout=5
        )
    ),
    "GetUnmaskRequest": lambda h, n: h.stub(n).GetUnmaskRequest(
        pb.GetUnmaskRequestRequest(session_id=h.session_id, round_index=0, node_id=n), timeout=5
    ),
    "AttestSurvivors": lambda h, n: h.stub(n).AttestSurvivors(
        pb.SurvivorAttestation(session_id=h.session_id, round_index=0, node_id=n), timeout=5
    ),
    "SubmitUnmask": lambda h, n: h.stub(n).SubmitUnmask(
        iter([pb.UnmaskChunk(header=pb.UnmaskHeader(session_id=h.session_id, node_id=n))]),
        timeout=5,
    ),
    "GetStatus": lambda h, n: h.stub(n).GetStatus(
        pb.GetStatusRequest(session_id=h.session_id), timeout=5
    ),
    "Withdraw": lambda h, n: h.stub(n).Withdraw(
        pb.WithdrawRequest(session_id=h.session_id, round_index=0, node_id=n, reason="stop"),
        timeout=5,
    ),
}


def every_rpc_denied(h: Harness, node: str, words: str) -> None:
    """Each of the protocol's nine calls from ``node``: PERMISSION_DENIED, nothing written.

    The calls carry empty messages: the caller is refused before its message is read.
    """
    before = h.session.store.dump()
    for name, call in RPCS.items():
        code, details = code_of(lambda call=call: call(h, node))  # type: ignore[misc]
        assert code == grpc.StatusCode.PERMISSION_DENIED, (name, code, details)
        assert words in details, (name, details)
    assert h.session.store.dump() == before


def test_a_caller_outside_the_federation_is_denied_every_call(limited: Harness) -> None:
    h = limited
    joined(h)
    every_rpc_denied(h, "zed", "'zed' is not a member of federation 'testfed'")
    honest_finish(h, zero_sum(("a", "b", "c"), N_WORDS, seed=84))


def test_a_member_that_never_joined_is_denied_every_call_even_the_aggregate(
    tmp_path: Path, certificates: Certificates
) -> None:
    h = start_limited(tmp_path, certificates, join_ms=1000, round_ms=4000)
    try:
        h.join("a")
        h.join("b")
        give_up = time.monotonic() + 10
        while not h.session.store.session().roster_final:  # type: ignore[union-attr]
            assert time.monotonic() < give_up, "the join deadline was not applied"
            time.sleep(0.05)
        data = zero_sum(("a", "b"), N_WORDS, seed=85)
        for node in ("a", "b"):
            send(h, node, upload_messages(h, node, 0, sent(h, node, 0, data.payloads[node])))
        request = unmask_request(h, "a", 0)
        assert list(request.dropped_node_ids) == []
        for node in ("a", "b"):
            attest(h, node, request)
        for node in ("a", "b"):
            answer(h, node, request, None)
        header, payload = fetch_result(h, "a", 0)
        assert header.status == pb.ROUND_STATUS_READY
        np.testing.assert_array_equal(np.frombuffer(payload, dtype="<u8"), data.total(["a", "b"]))
        # c's certificate is the federation's, but c is not on the roster.
        every_rpc_denied(h, "c", "node 'c'")
        every_rpc_denied(h, "zed", "'zed' is not a member of federation 'testfed'")
    finally:
        h.close()


def test_an_unexpected_failure_is_internal_with_a_sentence_and_logged(
    tmp_path: Path, certificates: Certificates
) -> None:
    lines: list[str] = []
    h = start_limited(tmp_path, certificates, log=lines.append, round_ms=4000)
    try:
        joined(h)
        data = zero_sum(("a", "b", "c"), N_WORDS, seed=86)
        honest_finish(h, data)
        # The round's aggregate file disappears under the coordinator (a disk fault).
        stored = h.session.store.result(0)
        assert stored is not None
        h.session.store.payload_path(stored.path).unlink()
        code, details = code_of(lambda: fetch_result(h, "a", 0))
        assert code == grpc.StatusCode.INTERNAL
        assert details.startswith("the coordinator failed unexpectedly while handling GetResult")
        assert "(FileNotFoundError)" in details and details.endswith(".")
        assert any("error: GetResult failed unexpectedly" in line for line in lines)
        assert slots_held_after_return(h, "a") == 0
    finally:
        h.close()


def test_the_total_limit_is_the_servers_own(tmp_path: Path, certificates: Certificates) -> None:
    """With room for 2 calls in all, a third concurrent call is RESOURCE_EXHAUSTED at once."""
    limits = ServerLimits(calls_per_node=4, max_concurrent_rpcs=2, first_message_seconds=2.0)
    h = start_limited(tmp_path, certificates, limits=limits)
    release = threading.Event()
    try:
        h.join("b")
        h.join("c")
        held = [
            connected_stub(h, node).UploadEgress.future(silent_stream(release), timeout=20)
            for node in ("c", "b")
        ]
        give_up = time.monotonic() + 10
        while h.server.guard.slots.held("b") + h.server.guard.slots.held("c") < 2:
            assert time.monotonic() < give_up, "the silent streams never reached the server"
            time.sleep(0.02)
        code, _ = code_of(lambda: h.stub("a").GetStatus(pb.GetStatusRequest(), timeout=5))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert [code_of(c.result)[0] for c in held] == [grpc.StatusCode.DEADLINE_EXCEEDED] * 2
        assert code_of(lambda: h.stub("a").GetStatus(pb.GetStatusRequest(), timeout=5))[0] == (
            grpc.StatusCode.OK
        )
    finally:
        release.set()
        h.close()


def test_the_limits_refuse_values_outside_their_range() -> None:
    from coordinator.limits import LimitsError

    for bad in (
        {"calls_per_node": 0},
        {"calls_per_node": True},
        {"max_concurrent_rpcs": 0},
        {"first_message_seconds": float("inf")},
        {"first_message_seconds": 1e-9},
        {"message_gap_seconds": 1e308},
    ):
        with pytest.raises(LimitsError, match=next(iter(bad))):
            ServerLimits(**bad)  # type: ignore[arg-type]
    assert ServerLimits().total_calls(3) == 4 * 4 + 8
    assert ServerLimits(max_concurrent_rpcs=50).total_calls(3) == 50
    assert CoordinatorLog("json").log_format == "json"


def test_storage_failures_are_told_apart_from_bugs() -> None:
    import errno
    import sqlite3

    from coordinator.guard import storage_failure, storage_sentence

    for error in (
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EFBIG, "File too large"),
        sqlite3.OperationalError("disk I/O error"),
        sqlite3.OperationalError("database or disk is full"),
    ):
        assert storage_failure(error), error
    for error in (
        OSError(errno.ENOENT, "gone"),
        ValueError("x"),
        sqlite3.OperationalError("no such table"),
    ):
        assert not storage_failure(error), error
    assert "retry later" in storage_sentence("UploadEgress", OSError(errno.ENOSPC, "full"))
