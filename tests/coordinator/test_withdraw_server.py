"""Withdraw over a real gRPC server with mutual TLS on 127.0.0.1.

The caller is the node named in its client certificate; the status codes are
those of coordinator/errors.py, each with a sentence, and a refused call
leaves the state file unchanged. The server's deadline ticker takes the
round down the deadline's path as soon as the last live node has uploaded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from proto.zerosum.v1 import session_pb2 as pb
from tests.coordinator.server_harness import (
    Certificates,
    Harness,
    answer,
    as_bytes,
    attest,
    fetch_result,
    joined,
    rejected,
    send,
    sent,
    start,
    upload_messages,
)
from tests.coordinator.support import N_WORDS, zero_sum
from zerosum import pki

pytestmark = pytest.mark.integration

REASON = "the TRE's output checker rejected this node's egress"


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    ca = pki.create_ca("testfed")
    clients = {n: pki.issue_client_certificate(ca, n) for n in ("a", "b", "c", "zed")}
    return Certificates(ca, pki.issue_server_certificate(ca), clients)


@pytest.fixture
def harness(tmp_path: Path, certificates: Certificates) -> Iterator[Harness]:
    h = start(tmp_path, certificates)
    yield h
    for channel in h.channels:
        channel.close()
    h.server.stop(0)
    h.session.store.close()


def withdraw(h: Harness, caller: str, node: str, **changes: object) -> pb.WithdrawReceipt:
    fields: dict[str, object] = {
        "session_id": h.session_id,
        "node_id": node,
        "round_index": 0,
        "reason": REASON,
    }
    fields.update(changes)
    request = pb.WithdrawRequest(**fields)  # type: ignore[arg-type]
    receipt: pb.WithdrawReceipt = h.stub(caller).Withdraw(request, timeout=10)
    return receipt


def test_a_withdrawn_node_is_dropped_and_the_survivors_are_asked_to_unmask_at_once(
    harness: Harness,
) -> None:
    h = harness
    joined(h)
    receipt = withdraw(h, "c", "c")
    assert receipt == pb.WithdrawReceipt(
        session_id=h.session_id,
        round_index=0,
        node_id="c",
        dropped_node_ids=["c"],
        state=pb.SESSION_STATE_RUNNING,
    )
    assert withdraw(h, "c", "c") == receipt
    status = h.stub("a").GetStatus(pb.GetStatusRequest(session_id=h.session_id), timeout=10)
    assert [(d.node_id, d.round_index, d.reason) for d in status.dropped_nodes] == [
        ("c", 0, f"withdrew from round 0 ('moments'): {REASON}")
    ]
    assert status.rounds[0].reason == f"node 'c' withdrew from round 0 ('moments'): {REASON}"
    data = zero_sum(h.fed.node_ids, N_WORDS, seed=61)
    for node in ("a", "b"):
        send(h, node, upload_messages(h, node, 0, sent(h, node, 0, data.payloads[node])))
    # The round deadline is a minute away; the ticker moves on without waiting for it.
    request = pb.GetUnmaskRequestRequest(session_id=h.session_id, round_index=0, node_id="a")
    deadline = time.monotonic() + 10
    while not (asked := h.stub("a").GetUnmaskRequest(request, timeout=10)).pending:
        assert time.monotonic() < deadline, "no unmask request within 10 s"
        time.sleep(0.05)
    assert list(asked.dropped_node_ids) == ["c"]
    assert list(asked.survivor_node_ids) == ["a", "b"]
    for node in ("a", "b"):
        attest(h, node, asked)
    for node in ("a", "b"):
        answer(h, node, asked, as_bytes(data.correction(node, ["c"])))
    header, payload = fetch_result(h, "b", 0)
    assert header.status == pb.ROUND_STATUS_READY and list(header.dropped_node_ids) == ["c"]
    np.testing.assert_array_equal(np.frombuffer(payload, dtype="<u8"), data.total(["a", "b"]))


def test_withdraw_for_another_node_is_permission_denied(harness: Harness) -> None:
    joined(harness)
    rejected(
        harness,
        grpc.StatusCode.PERMISSION_DENIED,
        lambda: withdraw(harness, "b", "c"),
        words="a node may only speak for itself",
    )


def test_withdraw_with_an_overlong_reason_is_invalid_argument(harness: Harness) -> None:
    joined(harness)
    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: withdraw(harness, "c", "c", reason="x" * 1001),
        words="the reason is 1001 characters long",
    )


def test_withdraw_after_the_upload_is_failed_precondition(harness: Harness) -> None:
    h = harness
    joined(h)
    data = zero_sum(h.fed.node_ids, N_WORDS, seed=62)
    send(h, "c", upload_messages(h, "c", 0, as_bytes(data.payloads["c"])))
    rejected(
        h,
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: withdraw(h, "c", "c"),
        words="withdrawing now would let its pair terms be revealed next to its payload",
    )
