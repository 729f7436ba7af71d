"""`zerosum coordinator` as a real process: exit codes, progress lines, signals, resume."""

from __future__ import annotations

import argparse
import hashlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from noise.keys import EphemeralKey, IdentityKey, sign_key_bundle
from noise.layout import Layout
from noise.self_mask import self_mask, self_mask_commitment
from noise.transcript import survivor_attestation_message, upload_statement_message
from proto.chunks import tensor_layouts
from proto.federation import config_hash, load_federation
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc
from tests.coordinator.support import node_seed, wire_contribution, wire_tags, zero_sum
from zerosum.commands import federation as federation_command

pytestmark = pytest.mark.integration

_RUN = (
    "import argparse, sys\n"
    "from zerosum.commands import coordinator as c\n"
    "p = argparse.ArgumentParser()\n"
    "c.add_arguments(p)\n"
    "sys.exit(c.run(p.parse_args(sys.argv[1:])))\n"
)


@pytest.fixture(scope="module")
def federation_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fed") / "fed"
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    args = parser.parse_args(
        [
            "init",
            "--nodes",
            "a,b,c",
            "--out",
            str(out),
            "--coordinator",
            "127.0.0.1:50999",
            "--nan-policy",
            "mean",  # two rounds: "means", then "sums"
            *("--feature-range=-10,10", "--feature-names", "x1,x2,x3,x4"),
            *("--n-components", "2"),
        ]
    )
    assert federation_command.run(args) == 0
    return out


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_leftover_processes() -> Iterator[None]:
    yield
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()


class Coordinator:
    """A coordinator process whose stderr lines are collected as they come."""

    def __init__(self, federation: Path, *extra: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _RUN,
                "--federation",
                str(federation),
                "--listen",
                "127.0.0.1:0",
                *extra,
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        _STARTED.append(self.process)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()
        self.port = int(self.wait_for(r"listening on 127\.0\.0\.1:(\d+)").group(1))

    def _pump(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        for line in self.seen:
            if found := re.search(pattern, line):
                return found
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r}; got {self.seen}") from None
            self.seen.append(line)
            if found := re.search(pattern, line):
                return found

    def finish(self, timeout: float = 30) -> int:
        code = self.process.wait(timeout=timeout)
        self._pump_thread.join(timeout=5)
        assert self.process.stderr is not None
        self.process.stderr.close()
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return code


@dataclass
class Node:
    node_id: str
    stub: pb_grpc.CoordinatorStub
    channel: grpc.Channel
    identity: IdentityKey


@pytest.fixture
def nodes_for(federation_dir: Path) -> Iterator[dict[str, Node]]:
    made: list[grpc.Channel] = []

    def connect(port: int) -> dict[str, Node]:
        ca = (federation_dir / "ca" / "ca.pem").read_bytes()
        out = {}
        for node in ("a", "b", "c"):
            folder = federation_dir / "nodes" / node
            credentials = grpc.ssl_channel_credentials(
                root_certificates=ca,
                private_key=(folder / "client.key").read_bytes(),
                certificate_chain=(folder / "client.pem").read_bytes(),
            )
            channel = grpc.secure_channel(f"127.0.0.1:{port}", credentials)
            made.append(channel)
            identity = IdentityKey.read_pem(folder / "identity.pem")
            out[node] = Node(node, pb_grpc.CoordinatorStub(channel), channel, identity)
        return out

    yield connect  # type: ignore[misc]
    for channel in made:
        channel.close()


def join(node: Node, session_id: str, fed_hash: bytes) -> None:
    bundle = sign_key_bundle(
        node.identity,
        config_hash=fed_hash,
        session_id=session_id,
        node_id=node.node_id,
        public_key=EphemeralKey.generate().public_bytes(),
    )
    node.stub.Join(
        pb.JoinRequest(
            bundle=pb.KeyBundle(
                config_hash=bundle.config_hash,
                session_id=session_id,
                node_id=node.node_id,
                public_key=bundle.public_key,
                signature=bundle.signature,
            )
        ),
        timeout=10,
    )


def upload(
    node: Node,
    session_id: str,
    fed_hash: bytes,
    round_index: int,
    name: str,
    *,
    payload: np.ndarray,
    layout: Layout,
) -> None:
    """Upload ``payload`` under the node's test self-mask, committing to its seed."""
    seed = node_seed(node.node_id, round_index)
    padded: np.ndarray = payload + self_mask(seed, layout, round_index=round_index)
    data = padded.astype("<u8").tobytes()
    words = len(data) // 8
    reply = node.stub.GetRoster(
        pb.GetRosterRequest(session_id=session_id, node_id=node.node_id), timeout=10
    )
    roster = reply.roster_hash
    others = [b.node_id for b in reply.bundles if b.node_id != node.node_id]
    sha256 = hashlib.sha256(data).digest()
    statement = upload_statement_message(
        fed_hash, session_id, round_index, name, roster_hash=roster, payload_sha256=sha256
    )

    def messages() -> Iterator[pb.UploadChunk]:
        yield pb.UploadChunk(
            header=pb.UploadHeader(
                session_id=session_id,
                round_index=round_index,
                round_name=name,
                node_id=node.node_id,
                payload=pb.PayloadHeader(
                    total_bytes=len(data),
                    total_elements=words,
                    sha256=sha256,
                    fixed_point_bits=32,
                    tensors=tensor_layouts(layout),
                ),
                roster_hash=roster,
                statement_signature=node.identity.sign(statement),
                self_mask_commitment=self_mask_commitment(seed),
                challenge=[
                    wire_contribution(
                        node.identity,
                        config_hash=fed_hash,
                        session_id=session_id,
                        round_index=round_index,
                        sender=node.node_id,
                        recipient=peer,
                    )
                    for peer in others
                ],
            )
        )
        yield pb.UploadChunk(data=pb.PayloadChunk(offset=0, data=data))

    node.stub.UploadEgress(messages(), timeout=10)


def reveal_seeds(nodes: list[Node], session_id: str, fed_hash: bytes, round_index: int) -> None:
    """The round's unmask step with nobody dropped: all attest, then each reveals its seed."""
    requests = {}
    for node in nodes:
        ask = pb.GetUnmaskRequestRequest(
            session_id=session_id, round_index=round_index, node_id=node.node_id
        )
        give_up = time.monotonic() + 10
        while not (request := node.stub.GetUnmaskRequest(ask, timeout=10)).pending:
            assert time.monotonic() < give_up, "no unmask request within 10 s"
            time.sleep(0.05)
        assert not request.dropped_node_ids
        requests[node.node_id] = request
    for node in nodes:
        digest = requests[node.node_id].survivor_hash
        message = survivor_attestation_message(fed_hash, session_id, round_index, digest)
        node.stub.AttestSurvivors(
            pb.SurvivorAttestation(
                session_id=session_id,
                round_index=round_index,
                node_id=node.node_id,
                survivor_hash=digest,
                signature=node.identity.sign(message),
                sealed_tags=wire_tags(
                    node.identity,
                    config_hash=fed_hash,
                    session_id=session_id,
                    round_index=round_index,
                    survivor_hash=digest,
                    sender=node.node_id,
                    recipients=requests[node.node_id].survivor_node_ids,
                ),
            ),
            timeout=10,
        )
    for node in nodes:
        request = requests[node.node_id]
        header = pb.UnmaskHeader(
            session_id=session_id,
            round_index=round_index,
            round_name=request.round_name,
            node_id=node.node_id,
            survivor_hash=request.survivor_hash,
            self_mask_seed=node_seed(node.node_id, round_index),
        )
        node.stub.SubmitUnmask(iter([pb.UnmaskChunk(header=header)]), timeout=10)


def result(node: Node, session_id: str, round_index: int) -> bytes:
    request = pb.GetResultRequest(
        session_id=session_id, round_index=round_index, node_id=node.node_id
    )
    chunks = list(node.stub.GetResult(request, timeout=10))
    assert chunks[0].header.status == pb.ROUND_STATUS_READY
    return b"".join(c.data.data for c in chunks[1:])


def test_a_completed_session_exits_0_after_every_node_has_the_result(
    federation_dir: Path, nodes_for: object, tmp_path: Path
) -> None:
    config = load_federation(federation_dir / "federation.toml")
    fed_hash = config_hash(config)
    coordinator = Coordinator(
        federation_dir / "federation.toml", "--state", str(tmp_path / "state.sqlite")
    )
    session_id = coordinator.wait_for(r"started session ([0-9a-f]{32})").group(1)
    nodes = nodes_for(coordinator.port)  # type: ignore[operator]
    for node in nodes.values():
        join(node, session_id, fed_hash)
    for round_index, name in enumerate(("means", "sums")):
        layout = config.plan.round(name).layout
        data = zero_sum(("a", "b", "c"), layout.size, seed=round_index)
        for node in nodes.values():
            payload = data.payloads[node.node_id]
            upload(node, session_id, fed_hash, round_index, name, payload=payload, layout=layout)
        reveal_seeds(list(nodes.values()), session_id, fed_hash, round_index)
        for node in nodes.values():
            total = np.frombuffer(result(node, session_id, round_index), dtype="<u8")
            np.testing.assert_array_equal(total, data.total(["a", "b", "c"]))
    assert coordinator.finish() == 0
    text = "\n".join(coordinator.seen)
    assert "roster final: a, b, c joined" in text
    assert "round 1 ('sums') ready" in text
    assert f"session {session_id} completed" in text


def test_sigterm_stops_cleanly_and_a_restart_resumes_the_same_session(
    federation_dir: Path, nodes_for: object, tmp_path: Path
) -> None:
    fed_hash = config_hash(load_federation(federation_dir / "federation.toml"))
    state = str(tmp_path / "state.sqlite")
    first = Coordinator(federation_dir / "federation.toml", "--state", state)
    session_id = first.wait_for(r"started session ([0-9a-f]{32})").group(1)
    nodes = nodes_for(first.port)  # type: ignore[operator]
    join(nodes["a"], session_id, fed_hash)
    first.wait_for("node 'a' joined")
    first.process.send_signal(signal.SIGTERM)
    assert first.finish() == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in first.seen[-1]
    second = Coordinator(federation_dir / "federation.toml", "--state", state)
    second.wait_for(f"resumed session {session_id}")
    second.process.send_signal(signal.SIGINT)
    assert second.finish() == 128 + signal.SIGINT


def test_a_failed_session_exits_1_with_the_reason(
    federation_dir: Path, nodes_for: object, tmp_path: Path
) -> None:
    text = (federation_dir / "federation.toml").read_text()
    quick = tmp_path / "federation.toml"
    quick.write_text(
        text.replace("join_deadline_seconds = 120.0", "join_deadline_seconds = 1.0").replace(
            'ca_certificate = "ca/ca.pem"', f'ca_certificate = "{federation_dir / "ca" / "ca.pem"}"'
        )
    )
    coordinator = Coordinator(
        quick, "--tls-dir", str(federation_dir / "coordinator"), "--linger", "0.5"
    )
    session_id = coordinator.wait_for(r"started session ([0-9a-f]{32})").group(1)
    nodes = nodes_for(coordinator.port)  # type: ignore[operator]
    join(nodes["a"], session_id, config_hash(load_federation(quick)))
    assert coordinator.finish() == 1
    assert coordinator.seen[-1].endswith(
        f"session {session_id} failed: only 1 of 3 nodes joined before the join deadline "
        "(b, c missing); the federation requires at least 3"
    )
    assert (tmp_path / "coordinator" / "state.sqlite").is_file()
