"""`zerosum coordinator` run as a real process, and nodes that speak to it over gRPC."""

from __future__ import annotations

import argparse
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import grpc
import numpy as np
import pytest

from noise.keys import EphemeralKey, IdentityKey, sign_key_bundle
from noise.layout import Layout
from noise.self_mask import self_mask, self_mask_commitment
from noise.transcript import survivor_attestation_message, upload_statement_message
from proto.chunks import tensor_layouts
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc
from tests.coordinator.support import node_seed, wire_contributions, wire_tags
from zerosum.commands import federation as federation_command

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
    digest = blake3.blake3(data).digest()
    statement = upload_statement_message(
        fed_hash, session_id, round_index, name, roster_hash=roster, payload_digest=digest
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
                    digest=digest,
                    fixed_point_bits=32,
                    tensors=tensor_layouts(layout),
                ),
                roster_hash=roster,
                statement_signature=node.identity.sign(statement),
                self_mask_commitment=self_mask_commitment(seed),
                challenge=wire_contributions(
                    node.identity,
                    config_hash=fed_hash,
                    session_id=session_id,
                    round_index=round_index,
                    sender=node.node_id,
                    recipients=others,
                ),
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
