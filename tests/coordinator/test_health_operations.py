"""What operators' usual tools see: health, reflection and JSON log lines, with real clients.

The health and reflection clients are the standard generated stubs of
grpcio-health-checking and grpcio-reflection over the same mutual TLS as the
nodes; the JSON log is read from a real ``zerosum coordinator`` process and
parsed line by line.
"""

from __future__ import annotations

import argparse
import io
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from coordinator.logs import CoordinatorLog, Note
from proto.federation import config_hash, load_federation
from tests.coordinator.coordinator_process import (
    Coordinator,
    _no_leftover_processes,
    federation_dir,
    join,
    nodes_for,
)
from tests.coordinator.server_harness import Certificates, Harness, certificates, start_limited
from zerosum.commands import coordinator as coordinator_command

# Fixtures shared with the modules they come from.
__all__ = ["_no_leftover_processes", "certificates", "federation_dir", "nodes_for"]

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def channel_for(h: Harness, who: str | None) -> grpc.Channel:
    """A mutual-TLS channel with ``who``'s certificate (None: no client certificate)."""
    client = h.certificates.clients[who] if who is not None else None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=h.certificates.ca_pem,
        private_key=client.private_key_pem() if client else None,
        certificate_chain=client.certificate_pem() if client else None,
    )
    channel = grpc.secure_channel(f"127.0.0.1:{h.server.port}", credentials)
    h.channels.append(channel)
    return channel


@pytest.fixture
def served(tmp_path: Path, certificates: Certificates) -> Iterator[Harness]:
    h = start_limited(tmp_path, certificates, join_ms=1500, min_nodes=2)
    yield h
    h.close()


def test_health_is_serving_under_mutual_tls_for_members_and_operators(served: Harness) -> None:
    for who in ("a", "zed"):  # a node, and a certificate of the CA outside the federation
        health = health_pb2_grpc.HealthStub(channel_for(served, who))
        for service in ("", "zerosum.v1.Coordinator"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == SERVING, (who, service)
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    without = health_pb2_grpc.HealthStub(channel_for(served, None))
    with pytest.raises(grpc.RpcError) as refused:
        without.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails


def test_health_turns_not_serving_when_the_session_ends(served: Harness) -> None:
    health = health_pb2_grpc.HealthStub(channel_for(served, "a"))
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=20)
    assert next(watch).status == SERVING
    served.join("a")  # one of three joins; at least two are needed: the session fails
    assert next(watch).status == NOT_SERVING
    watch.cancel()
    assert served.session.state() == "failed"
    check = health.Check(
        health_pb2.HealthCheckRequest(service="zerosum.v1.Coordinator"), timeout=10
    )
    assert check.status == NOT_SERVING


def test_health_says_not_serving_as_the_server_stops(served: Harness) -> None:
    watch = health_pb2_grpc.HealthStub(channel_for(served, "b")).Watch(
        health_pb2.HealthCheckRequest(service="zerosum.v1.Coordinator"), timeout=20
    )
    assert next(watch).status == SERVING
    served.server.stop(grace=2.0)
    assert next(watch).status == NOT_SERVING
    assert not served.server.operations.serving


def reflect(h: Harness, *requests: reflection_pb2.ServerReflectionRequest) -> list[object]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel_for(h, "zed"))
    return list(stub.ServerReflectionInfo(iter(requests), timeout=10))


def test_reflection_lists_the_services_and_describes_the_protocol(served: Harness) -> None:
    listed, described = reflect(
        served,
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="zerosum.v1.Coordinator"),
    )
    names = {s.name for s in listed.list_services_response.service}  # type: ignore[attr-defined]
    assert names == {
        "zerosum.v1.Coordinator",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto  # type: ignore[attr-defined]
    ]
    service = next(s for f in files for s in f.service if s.name == "Coordinator")
    assert {m.name for m in service.method} >= {"Join", "UploadEgress", "GetResult", "Withdraw"}


# ---------------------------------------------------------------- JSON logs

FIELDS = {"time", "level", "event", "session", "node", "message"}


def test_a_log_line_in_json_is_one_object_with_every_field() -> None:
    out = io.StringIO()
    log = CoordinatorLog("json", stream=out)
    log.session = "abc"
    log(Note("node 'a' joined (1 of 3)\n\x1b[31m", event="node-joined", node="a"))
    log.event("call-limit", "refused", level="warning", node="c")
    log("a plain sentence")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    assert all(set(r) == FIELDS for r in records)
    assert records[0]["event"] == "node-joined" and records[0]["node"] == "a"
    assert records[0]["message"] == "node 'a' joined (1 of 3)\n\x1b[31m"
    assert records[1]["level"] == "warning" and records[2]["event"] == "message"
    assert all(r["session"] == "abc" and r["time"].endswith("Z") for r in records)
    text = io.StringIO()
    CoordinatorLog("text", stream=text).event("x", "careful", level="warning")
    assert text.getvalue().rstrip().endswith("zerosum coordinator: warning: careful")
    with pytest.raises(ValueError, match="log format 'xml'"):
        CoordinatorLog("xml")


def test_the_coordinator_logs_json_lines_and_answers_health_probes(
    federation_dir: Path, nodes_for: object
) -> None:
    coordinator = Coordinator(federation_dir / "federation.toml", "--log-format", "json")
    session_id = coordinator.wait_for(r'"session-started"').string
    session_id = json.loads(session_id)["session"]
    nodes = nodes_for(coordinator.port)  # type: ignore[operator]
    health = health_pb2_grpc.HealthStub(nodes["a"].channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == SERVING
    join(nodes["a"], session_id, config_hash(load_federation(federation_dir / "federation.toml")))
    coordinator.wait_for(r'"node-joined"')
    coordinator.process.send_signal(signal.SIGTERM)
    assert coordinator.finish() == 128 + signal.SIGTERM
    records = [json.loads(line) for line in coordinator.seen]
    assert records and all(set(r) == FIELDS for r in records)
    joined = next(r for r in records if r["event"] == "node-joined")
    assert joined["node"] == "a" and joined["session"] == session_id
    assert joined["level"] == "info" and "node 'a' joined" in joined["message"]
    assert records[-1]["event"] == "exit" and records[-1]["level"] == "warning"
    assert any(r["event"] == "listening" for r in records)


def test_the_limits_are_range_checked_at_start(
    federation_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    coordinator_command.add_arguments(parser)
    for flag, value in (
        ("--calls-per-node", "0"),
        ("--first-message-seconds", "1e308"),
        ("--message-gap-seconds", "1e-9"),
    ):
        args = parser.parse_args(
            ["--federation", str(federation_dir / "federation.toml"), flag, value]
        )
        started = time.monotonic()
        assert coordinator_command.run(args) == 2
        assert time.monotonic() - started < 10
        message = capsys.readouterr().err
        assert flag.lstrip("-").replace("-", "_") in message
