"""Text a hostile coordinator (or another node, through it) sends never reaches a terminal raw.

A stand-in coordinator on 127.0.0.1 with real mutual TLS answers GetStatus
with reasons full of terminal escapes and a refusal whose details carry
them; the node's gateway hands on only sanitised text (``proto.text``):
no ESC, no carriage return or newline, and at most the gateway's bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from node.errors import CoordinatorRefused
from node.protocol.client import GrpcGateway, RetryPolicy
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc
from zerosum import pki

pytestmark = pytest.mark.integration

HOSTILE = "\x1b[2J\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\r\nforged log line\u202e"


class HostileCoordinator(pb_grpc.CoordinatorServicer):
    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.SessionStatus:
        return pb.SessionStatus(
            session_id="s1",
            reason=HOSTILE * 100,
            rounds=[pb.RoundSummary(round_index=0, round_name="means", reason=HOSTILE)],
            dropped_nodes=[pb.DroppedNode(node_id="b", round_index=0, reason=HOSTILE)],
        )

    def Withdraw(
        self, request: pb.WithdrawRequest, context: grpc.ServicerContext
    ) -> pb.WithdrawReceipt:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, HOSTILE)
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def gateway() -> Iterator[GrpcGateway]:
    ca = pki.create_ca("testfed")
    server_credential = pki.issue_server_certificate(ca)
    client = pki.issue_client_certificate(ca, "a")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_CoordinatorServicer_to_server(HostileCoordinator(), server)
    port = server.add_secure_port(
        "127.0.0.1:0",
        grpc.ssl_server_credentials(
            [(server_credential.private_key_pem(), server_credential.certificate_pem())],
            root_certificates=ca.certificate_pem(),
            require_client_auth=True,
        ),
    )
    server.start()
    with GrpcGateway(
        f"127.0.0.1:{port}",
        node_id="a",
        root_certificate=ca.certificate_pem(),
        certificate_chain=client.certificate_pem(),
        private_key=client.private_key_pem(),
        retry=RetryPolicy(total_seconds=20.0),
    ) as gateway:
        yield gateway
    server.stop(0)


def _printable(text: str) -> None:
    assert "\x1b" not in text and "\r" not in text and "\n" not in text and "\x07" not in text
    assert "\u202e" not in text


def test_status_reasons_are_sanitised(gateway: GrpcGateway) -> None:
    status = gateway.status("s1")
    for text in (status.reason, status.rounds[0].reason, status.dropped[0].reason):
        _printable(text)
        assert "click" in text and "forged log line" in text
    assert len(status.reason) == 1000 and status.reason.endswith("…")
    assert status.dropped[0].reason.startswith("\\x1b[2J")


def test_refusal_details_are_sanitised(gateway: GrpcGateway) -> None:
    with pytest.raises(CoordinatorRefused) as caught:
        gateway.withdraw("s1", 0, "leaving")
    _printable(caught.value.details)
    _printable(str(caught.value))
    assert "forged log line" in caught.value.details
