"""The client's chunking and retry loop, without a server."""

from __future__ import annotations

import random

import blake3
import grpc
import numpy as np
import pytest

from node.errors import AlreadyJoined, CoordinatorRefused, CoordinatorUnreachable
from node.protocol.client import CHUNK_BYTES, Retrier, RetryPolicy, assemble_payload
from noise.layout import Layout
from proto.chunks import PayloadError, payload_chunks, payload_header


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def _client(policy: RetryPolicy, time: FakeTime, progress: list[str] | None = None) -> Retrier:
    return Retrier(
        policy,
        address="127.0.0.1:9",
        rng=random.Random(1),
        sleep=time.sleep,
        clock=time.clock,
        progress=None if progress is None else progress.append,
    )


def test_chunks_are_at_most_one_mebibyte_and_reassemble_exactly() -> None:
    payload = np.arange(300_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    chunks = list(payload_chunks(payload))
    assert [len(c.data) for c in chunks] == [CHUNK_BYTES, CHUNK_BYTES, 2_400_000 - 2 * CHUNK_BYTES]
    assert [c.offset for c in chunks] == [0, CHUNK_BYTES, 2 * CHUNK_BYTES]
    header = payload_header(payload, Layout.of({"w": (300_000,)}), 32)
    assert header.digest == blake3.blake3(payload.astype("<u8").tobytes()).digest()
    assert header.total_bytes == 2_400_000 and header.total_elements == 300_000
    assert np.array_equal(assemble_payload(header, chunks, what="test"), payload)


def test_reassembly_rejects_gaps_and_corruption() -> None:
    payload = np.arange(10, dtype=np.uint64)
    header = payload_header(payload, Layout.of({"w": (10,)}), 32)
    chunks = list(payload_chunks(payload))
    chunks[0].offset = 8
    with pytest.raises(PayloadError, match="aggregate: chunk at byte 8 arrived; expected byte 0"):
        assemble_payload(header, chunks, what="aggregate")
    corrupted = list(payload_chunks(payload + np.uint64(1)))
    with pytest.raises(PayloadError, match="aggregate: payload digest does not match the header"):
        assemble_payload(header, corrupted, what="aggregate")
    with pytest.raises(PayloadError, match="received 40 of the 80 bytes announced"):
        assemble_payload(header, list(payload_chunks(payload[:5])), what="aggregate")


def test_transient_failures_are_retried_with_capped_jittered_backoff() -> None:
    time = FakeTime()
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=0.4, total_seconds=60.0)
    client = _client(policy, time)
    failures = [grpc.StatusCode.UNAVAILABLE] * 4 + [grpc.StatusCode.DEADLINE_EXCEEDED]

    def attempt(timeout: float) -> str:
        assert timeout == policy.attempt_timeout
        if failures:
            raise FakeRpcError(failures.pop(0), "coordinator restarting")
        return "ok"

    assert client.run("GetStatus", attempt) == "ok"
    assert len(time.sleeps) == 5
    ceilings = [0.1, 0.2, 0.4, 0.4, 0.4]
    assert all(0.0 <= s <= c for s, c in zip(time.sleeps, ceilings, strict=True))


def test_retries_stop_after_the_total_time() -> None:
    time = FakeTime()
    client = _client(RetryPolicy(initial_backoff=1.0, max_backoff=1.0, total_seconds=5.0), time)

    def attempt(timeout: float) -> str:
        time.now += 0.5
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")

    with pytest.raises(CoordinatorUnreachable, match=r"did not answer after .* attempts") as caught:
        client.run("Join", attempt)
    assert caught.value.code == "UNAVAILABLE"
    assert time.now <= 5.0 + 0.5


def test_decisions_of_the_coordinator_are_not_retried() -> None:
    time = FakeTime()
    client = _client(RetryPolicy(), time)
    calls = []

    def attempt(timeout: float) -> str:
        calls.append(timeout)
        raise FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "node 'a' cannot speak for 'b'")

    with pytest.raises(
        CoordinatorRefused, match="PERMISSION_DENIED: node 'a' cannot speak for 'b'"
    ):
        client.run("Join", attempt)
    assert len(calls) == 1 and time.sleeps == []


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="total_seconds must be > 0"):
        RetryPolicy(total_seconds=0.0)


def test_a_second_key_at_join_is_its_own_error() -> None:
    def attempt(timeout: float) -> str:
        raise FakeRpcError(grpc.StatusCode.ALREADY_EXISTS, "node 'a' already joined")

    with pytest.raises(AlreadyJoined, match="already joined") as caught:
        _client(RetryPolicy(), FakeTime()).run("Join", attempt)
    assert caught.value.code == "ALREADY_EXISTS"


def test_a_node_that_keeps_retrying_says_so_and_then_that_it_got_no_answer() -> None:
    time = FakeTime()
    lines: list[str] = []
    retrier = _client(
        RetryPolicy(initial_backoff=1.0, max_backoff=1.0, total_seconds=40.0), time, lines
    )

    def attempt(timeout: float) -> str:
        time.now += 0.5
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")

    with pytest.raises(CoordinatorUnreachable, match="the coordinator did not answer"):
        retrier.run("GetStatus", attempt)
    assert len(lines) >= 3
    assert all("does not answer yet" in line and "127.0.0.1:9" in line for line in lines)
