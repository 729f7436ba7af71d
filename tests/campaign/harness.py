"""A real coordinator over mutual TLS on 127.0.0.1, driven to a chosen stage of a session.

The coordinator is the production one (coordinator/server.py over
coordinator/session.py and its SQLite store), running in this process on a
fake clock so no deadline passes unless the test moves it. The federation
has four nodes: ``a``, ``b`` and ``c`` join; ``d`` never does (it is a
federation node outside the final roster), and ``zed`` holds a certificate of
the federation CA but is no federation node at all.

A stage is the session at one moment (:data:`STAGES`); :func:`build_stage`
drives a fresh coordinator there over gRPC, with messages signed by the
nodes' real Ed25519 identity keys, and copies its state folder aside so a
fuzzing run can go back to exactly that state (:meth:`Coordinator.restore`)
after a message the coordinator accepted.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import grpc

from coordinator.server import RunningServer, ServerTLS, start_server
from coordinator.session import Session
from coordinator.store import Store
from noise.keys import IdentityKey
from noise.self_mask import self_mask_commitment
from noise.transcript import roster_hash, upload_statement_message
from proto.convert import sealed_contributions_to_pb, sealed_tags_to_pb
from proto.zerosum.v1 import session_pb2 as pb
from tests.coordinator.support import (
    CONFIG_HASH,
    LAYOUT,
    N_WORDS,
    FakeClock,
    Federation,
    make_federation,
    masked,
    node_seed,
    sealed_challenge,
    zero_sum,
)
from zerosum import pki

__all__ = [
    "MEMBERS",
    "NODES",
    "OUTSIDER",
    "STAGES",
    "Certificates",
    "Coordinator",
    "build_stage",
    "make_certificates",
]

NODES = ("a", "b", "c", "d")
MEMBERS = ("a", "b", "c")  # joined; d never joins
OUTSIDER = "zed"  # a CA-signed certificate for a name outside the federation
SERVICE = "/zerosum.v1.Coordinator/"
JOIN_MS = 60_000
# Stages in session order; each adds one step to the one before.
STAGES = ("joining", "uploading", "attesting", "answering", "ready")


@dataclass(frozen=True)
class Certificates:
    ca: pki.IssuedCertificate
    server: pki.IssuedCertificate
    clients: dict[str, pki.IssuedCertificate]


def make_certificates() -> Certificates:
    ca = pki.create_ca("testfed")
    clients = {n: pki.issue_client_certificate(ca, n) for n in (*NODES, OUTSIDER)}
    return Certificates(ca, pki.issue_server_certificate(ca), clients)


@dataclass
class Coordinator:
    """The coordinator of one state folder, served on 127.0.0.1 with channels per caller."""

    folder: Path
    fed: Federation
    certificates: Certificates
    clock: FakeClock
    snapshot: Path | None = None
    session: Session = field(init=False)
    server: RunningServer = field(init=False)
    _channels: dict[str, grpc.Channel] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._open()

    @property
    def state_path(self) -> Path:
        return self.folder / "state.sqlite"

    def _open(self) -> None:
        self.session = Session(Store(self.state_path), self.fed.config, clock=self.clock)
        tls = ServerTLS(
            certificate=self.certificates.server.certificate_pem(),
            private_key=self.certificates.server.private_key_pem(),
            ca_certificate=self.certificates.ca.certificate_pem(),
        )
        self.server = start_server(self.session, tls, listen="127.0.0.1:0", tick_seconds=0.05)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self.server.stop(0)
        self.session.store.close()

    def save(self, snapshot: Path) -> None:
        """Copy the state folder to ``snapshot`` (with the coordinator stopped for the copy)."""
        self.close()
        shutil.copytree(self.folder, snapshot)
        self.snapshot = snapshot
        self._open()

    def restore(self) -> None:
        """Back to the saved snapshot: a fresh coordinator on a fresh copy of it."""
        assert self.snapshot is not None, "nothing saved to restore"
        self.close()
        shutil.rmtree(self.folder)
        shutil.copytree(self.snapshot, self.folder)
        self._open()

    def channel(self, caller: str) -> grpc.Channel:
        if caller not in self._channels:
            client = self.certificates.clients[caller]
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self.certificates.ca.certificate_pem(),
                private_key=client.private_key_pem(),
                certificate_chain=client.certificate_pem(),
            )
            self._channels[caller] = grpc.secure_channel(
                f"127.0.0.1:{self.server.port}",
                credentials,
                options=[
                    ("grpc.max_send_message_length", 8 << 20),
                    ("grpc.max_receive_message_length", 8 << 20),
                ],
            )
        return self._channels[caller]

    def unary(self, caller: str, rpc: str, request: bytes, timeout: float) -> bytes:
        call = self.channel(caller).unary_unary(SERVICE + rpc)
        answer: bytes = call(request, timeout=timeout)
        return answer

    def client_stream(self, caller: str, rpc: str, requests: list[bytes], timeout: float) -> bytes:
        call = self.channel(caller).stream_unary(SERVICE + rpc)
        answer: bytes = call(iter(requests), timeout=timeout)
        return answer

    def server_stream(self, caller: str, rpc: str, request: bytes, timeout: float) -> list[bytes]:
        call = self.channel(caller).unary_stream(SERVICE + rpc)
        return list(call(request, timeout=timeout))

    def alive(self) -> bool:
        """The server answers a status probe within 10 s and its deadline ticker runs."""
        try:
            self.unary("a", "GetStatus", pb.GetStatusRequest().SerializeToString(), 10.0)
        except grpc.RpcError:
            return False
        return self.server._ticker.is_alive()

    # ------------------------------------------------------------ valid messages

    @property
    def session_id(self) -> str:
        return self.session.session_id

    def join_request(self, node: str) -> pb.JoinRequest:
        bundle = self.fed.bundle(node, self.session_id)
        return pb.JoinRequest(
            bundle=pb.KeyBundle(
                config_hash=bundle.config_hash,
                session_id=bundle.session_id,
                node_id=bundle.node_id,
                public_key=bundle.public_key,
                signature=bundle.signature,
            )
        )

    def upload_messages(self, node: str, round_index: int = 0) -> list[pb.UploadChunk]:
        """``node``'s upload of the round: its signed header, then its masked payload."""
        values = zero_sum(MEMBERS, N_WORDS, seed=50).payloads[node if node in MEMBERS else "c"]
        data = masked(self.session, node, round_index, values)
        digest = blake3.blake3(data).digest()
        roster = roster_hash(CONFIG_HASH, self.session_id, self.session.store.members())
        name = ("moments", "scatter")[round_index]
        statement = upload_statement_message(
            CONFIG_HASH,
            self.session_id,
            round_index,
            name,
            roster_hash=roster,
            payload_digest=digest,
        )
        header = pb.UploadHeader(
            session_id=self.session_id,
            round_index=round_index,
            round_name=name,
            node_id=node,
            payload=pb.PayloadHeader(
                total_bytes=len(data),
                total_elements=len(data) // 8,
                digest=digest,
                fixed_point_bits=32,
                tensors=[
                    pb.TensorLayout(name=s.name, shape=list(s.shape), offset=s.offset, size=s.size)
                    for s in LAYOUT
                ],
            ),
            roster_hash=roster,
            statement_signature=self.fed.identities[node].sign(statement),
            self_mask_commitment=self_mask_commitment(node_seed(node, round_index)),
            challenge=sealed_contributions_to_pb(sealed_challenge(self.session, node, round_index)),
        )
        return [
            pb.UploadChunk(header=header),
            pb.UploadChunk(data=pb.PayloadChunk(offset=0, data=data)),
        ]

    def unmask_request(self, node: str, round_index: int = 0) -> pb.UnmaskRequest:
        ask = pb.GetUnmaskRequestRequest(
            session_id=self.session_id, round_index=round_index, node_id=node
        )
        give_up = time.monotonic() + 10
        while True:
            answer = pb.UnmaskRequest.FromString(
                self.unary(node, "GetUnmaskRequest", ask.SerializeToString(), 10)
            )
            if answer.pending:
                return answer
            assert time.monotonic() < give_up, "no unmask request within 10 s"
            time.sleep(0.02)

    def attestation(self, node: str, round_index: int = 0) -> pb.SurvivorAttestation:
        """``node``'s signature over the survivor set (a non-member signs the set ``c`` saw)."""
        request = self.unmask_request(node if node in MEMBERS else "c", round_index)
        signed = self.fed.attestation(
            node,
            self.session_id,
            round_index,
            request.survivor_hash,
            survivors=request.survivor_node_ids,
        )
        return pb.SurvivorAttestation(
            session_id=self.session_id,
            round_index=round_index,
            node_id=node,
            survivor_hash=signed.survivor_hash,
            signature=signed.signature,
            sealed_tags=sealed_tags_to_pb(signed.tags),
        )

    def answer_messages(self, node: str, round_index: int = 0) -> list[pb.UnmaskChunk]:
        """``node``'s unmask answer (nobody dropped: its self-mask seed and tags)."""
        request = self.unmask_request(node if node in MEMBERS else "c", round_index)
        header = pb.UnmaskHeader(
            session_id=self.session_id,
            round_index=round_index,
            round_name=request.round_name,
            node_id=node,
            dropped_node_ids=list(request.dropped_node_ids),
            survivor_hash=request.survivor_hash,
            self_mask_seed=node_seed(node, round_index),
        )
        return [pb.UnmaskChunk(header=header)]

    def withdraw_request(self, node: str, round_index: int = 0) -> pb.WithdrawRequest:
        return pb.WithdrawRequest(
            session_id=self.session_id,
            node_id=node,
            round_index=round_index,
            reason="the TRE's output checker rejected this node's egress of round 0",
        )

    def result_request(self, node: str, round_index: int = 0) -> pb.GetResultRequest:
        return pb.GetResultRequest(
            session_id=self.session_id, round_index=round_index, node_id=node
        )

    # ------------------------------------------------------------ steps of a session

    def send_upload(self, node: str) -> None:
        raw = [m.SerializeToString() for m in self.upload_messages(node)]
        self.client_stream(node, "UploadEgress", raw, 30)

    def send_attestation(self, node: str) -> None:
        self.unary(node, "AttestSurvivors", self.attestation(node).SerializeToString(), 10)

    def send_answer(self, node: str) -> None:
        raw = [m.SerializeToString() for m in self.answer_messages(node)]
        self.client_stream(node, "SubmitUnmask", raw, 30)

    def wait_for(self, what: str, condition: Callable[[], object], timeout: float = 10.0) -> None:
        give_up = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < give_up, f"timed out waiting for {what}"
            time.sleep(0.02)


def _federation() -> Federation:
    fed = make_federation(NODES, min_nodes=2, join_ms=JOIN_MS, round_ms=600_000)
    # An identity key for the outsider, pinned nowhere: what it signs verifies against nothing.
    fed.identities[OUTSIDER] = IdentityKey.generate()
    return fed


def build_stage(
    stage: str, folder: Path, certificates: Certificates, fed: Federation | None = None
) -> Coordinator:
    """A coordinator on ``folder / 'live'`` at ``stage``, its snapshot saved beside it."""
    assert stage in STAGES, stage
    target = Coordinator(folder / "live", fed or _federation(), certificates, FakeClock())
    steps = STAGES.index(stage)
    for node in ("a", "b"):
        target.unary(node, "Join", target.join_request(node).SerializeToString(), 10)
    if steps >= 1:
        target.unary("c", "Join", target.join_request("c").SerializeToString(), 10)
        # d never joins: the join deadline closes the roster without it.
        target.clock.advance(JOIN_MS + 1)
        target.wait_for("the final roster", lambda: target.session.store.round(0) is not None)
        for node in ("a", "b"):
            target.send_upload(node)
    if steps >= 2:
        target.send_upload("c")
        for node in ("a", "b"):
            target.send_attestation(node)
    if steps >= 3:
        target.send_attestation("c")
        for node in ("a", "b"):
            target.send_answer(node)
    if steps >= 4:
        target.send_answer("c")
        target.wait_for(
            "round 0's result", lambda: (r := target.session.store.round(0)) and r.status == "ready"
        )
    target.save(folder / "snapshot")
    return target
