"""A coordinator on a real gRPC server with mutual TLS on 127.0.0.1, and the calls nodes make."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import grpc
import numpy as np
import pytest

from coordinator.limits import ServerLimits
from coordinator.server import (
    RESULT_HOLD_SECONDS,
    RunningServer,
    ServerTLS,
    start_server,
)
from coordinator.session import Session
from coordinator.store import Store
from noise.layout import Layout
from noise.self_mask import self_mask_commitment
from noise.transcript import roster_hash, upload_statement_message
from proto.convert import key_bundle_to_pb, sealed_contributions_to_pb, sealed_tags_to_pb
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc
from tests.coordinator.support import (
    CONFIG_HASH,
    LAYOUT,
    Federation,
    make_federation,
    masked,
    node_seed,
    sealed_challenge,
)
from zerosum import pki

CHUNK = 1 << 20


@dataclass
class Certificates:
    ca: pki.IssuedCertificate
    server: pki.IssuedCertificate
    clients: dict[str, pki.IssuedCertificate]

    @property
    def ca_pem(self) -> bytes:
        return self.ca.certificate_pem()


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    ca = pki.create_ca("testfed")
    clients = {n: pki.issue_client_certificate(ca, n) for n in ("a", "b", "c", "zed")}
    return Certificates(ca, pki.issue_server_certificate(ca), clients)


@dataclass
class Harness:
    fed: Federation
    session: Session
    server: RunningServer
    certificates: Certificates
    channels: list[grpc.Channel]

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        self.server.stop(0)
        self.session.store.close()

    def stub(self, node: str | None) -> pb_grpc.CoordinatorStub:
        client = self.certificates.clients[node] if node is not None else None
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.certificates.ca_pem,
            private_key=client.private_key_pem() if client else None,
            certificate_chain=client.certificate_pem() if client else None,
        )
        channel = grpc.secure_channel(
            f"127.0.0.1:{self.server.port}",
            credentials,
            options=[
                ("grpc.max_send_message_length", 8 << 20),
                ("grpc.max_receive_message_length", 8 << 20),
            ],
        )
        self.channels.append(channel)
        return pb_grpc.CoordinatorStub(channel)

    @property
    def session_id(self) -> str:
        return self.session.session_id

    def join(self, node: str) -> pb.JoinResponse:
        bundle = self.fed.bundle(node, self.session_id)
        message = key_bundle_to_pb(bundle)
        response: pb.JoinResponse = self.stub(node).Join(pb.JoinRequest(bundle=message), timeout=10)
        return response


def start(
    tmp_path: Path,
    certificates: Certificates,
    layout: Layout | None = None,
    *,
    hold: float = RESULT_HOLD_SECONDS,
    **options: int,
) -> Harness:
    fed = make_federation(("a", "b", "c"), layout=layout, **options)  # type: ignore[arg-type]
    session = Session(Store(tmp_path / "state.sqlite"), fed.config)
    tls = ServerTLS(
        certificate=certificates.server.certificate_pem(),
        private_key=certificates.server.private_key_pem(),
        ca_certificate=certificates.ca_pem,
    )
    server = start_server(
        session, tls, listen="127.0.0.1:0", tick_seconds=0.05, result_hold_seconds=hold
    )
    return Harness(fed, session, server, certificates, [])


@pytest.fixture
def harness(tmp_path: Path, certificates: Certificates) -> Iterator[Harness]:
    h = start(tmp_path, certificates)
    yield h
    h.close()


def layout_messages() -> list[pb.TensorLayout]:
    return [
        pb.TensorLayout(name=s.name, shape=list(s.shape), offset=s.offset, size=s.size)
        for s in LAYOUT
    ]


def upload_messages(
    h: Harness,
    node: str,
    round_index: int,
    data: bytes,
    *,
    layout: list[pb.TensorLayout] | None = None,
    chunk: int = CHUNK,
    **header_changes: object,
) -> Iterator[pb.UploadChunk]:
    payload = pb.PayloadHeader(
        total_bytes=len(data),
        total_elements=len(data) // 8,
        digest=blake3.blake3(data).digest(),
        fixed_point_bits=32,
        tensors=layout if layout is not None else layout_messages(),
    )
    fields: dict[str, object] = {
        "session_id": h.session_id,
        "round_index": round_index,
        "round_name": ["moments", "scatter"][round_index],
        "node_id": node,
        "payload": payload,
        "roster_hash": roster_hash(CONFIG_HASH, h.session_id, h.session.store.members()),
        "self_mask_commitment": self_mask_commitment(node_seed(node, round_index)),
        "challenge": sealed_contributions_to_pb(sealed_challenge(h.session, node, round_index)),
    }
    fields.update(header_changes)
    if "statement_signature" not in fields:
        # The node's statement over the header as sent, whatever was changed.
        fields["statement_signature"] = h.fed.identities[node].sign(
            upload_statement_message(
                CONFIG_HASH,
                str(fields["session_id"]),
                int(fields["round_index"]),  # type: ignore[call-overload]
                str(fields["round_name"]),
                roster_hash=bytes(fields["roster_hash"]),  # type: ignore[call-overload]
                payload_digest=payload.digest,
            )
        )
    yield pb.UploadChunk(header=pb.UploadHeader(**fields))  # type: ignore[arg-type]
    for offset in range(0, len(data), chunk):
        yield pb.UploadChunk(
            data=pb.PayloadChunk(offset=offset, data=data[offset : offset + chunk])
        )


def send(h: Harness, node: str, messages: Iterator[pb.UploadChunk]) -> pb.UploadReceipt:
    receipt: pb.UploadReceipt = h.stub(node).UploadEgress(messages, timeout=30)
    return receipt


def sent(h: Harness, node: str, round_index: int, payload: np.ndarray) -> bytes:
    """``payload`` under the node's test self-mask, as its upload carries it."""
    return masked(h.session, node, round_index, payload)


def unmask_request(h: Harness, node: str, round_index: int) -> pb.UnmaskRequest:
    """The node's unmask request, once the server has issued it (within 10 s)."""
    ask = pb.GetUnmaskRequestRequest(session_id=h.session_id, round_index=round_index, node_id=node)
    give_up = time.monotonic() + 10
    while not (request := h.stub(node).GetUnmaskRequest(ask, timeout=10)).pending:
        assert time.monotonic() < give_up, "no unmask request within 10 s"
        time.sleep(0.05)
    return request


def attest(h: Harness, node: str, request: pb.UnmaskRequest) -> pb.AttestationReceipt:
    signed = h.fed.attestation(
        node,
        h.session_id,
        request.round_index,
        request.survivor_hash,
        survivors=request.survivor_node_ids,
    )
    receipt: pb.AttestationReceipt = h.stub(node).AttestSurvivors(
        pb.SurvivorAttestation(
            session_id=h.session_id,
            round_index=request.round_index,
            node_id=node,
            survivor_hash=signed.survivor_hash,
            signature=signed.signature,
            sealed_tags=sealed_tags_to_pb(signed.tags),
        ),
        timeout=10,
    )
    return receipt


def answer_messages(
    h: Harness,
    node: str,
    request: pb.UnmaskRequest,
    correction: bytes | None,
    *,
    seed: bytes | None = None,
) -> Iterator[pb.UnmaskChunk]:
    """The node's unmask answer: its seed, and its pair terms when nodes dropped."""
    header = pb.UnmaskHeader(
        session_id=h.session_id,
        round_index=request.round_index,
        round_name=request.round_name,
        node_id=node,
        dropped_node_ids=list(request.dropped_node_ids),
        survivor_hash=request.survivor_hash,
        self_mask_seed=node_seed(node, request.round_index) if seed is None else seed,
    )
    if correction is not None:
        header.payload.CopyFrom(
            pb.PayloadHeader(
                total_bytes=len(correction),
                total_elements=len(correction) // 8,
                digest=blake3.blake3(correction).digest(),
                fixed_point_bits=32,
                tensors=list(request.tensors),
            )
        )
    yield pb.UnmaskChunk(header=header)
    if correction is not None:
        yield pb.UnmaskChunk(data=pb.PayloadChunk(offset=0, data=correction))


def answer(h: Harness, node: str, request: pb.UnmaskRequest, correction: bytes | None) -> None:
    receipt = h.stub(node).SubmitUnmask(answer_messages(h, node, request, correction), timeout=30)
    assert receipt.accepted and not receipt.duplicate


def fetch_result(h: Harness, node: str, round_index: int) -> tuple[pb.ResultHeader, bytes]:
    request = pb.GetResultRequest(session_id=h.session_id, round_index=round_index, node_id=node)
    chunks = list(h.stub(node).GetResult(request, timeout=30))
    header = chunks[0].header
    data = b"".join(c.data.data for c in chunks[1:])
    return header, data


def rejected(h: Harness, code: grpc.StatusCode, call: Callable[[], object], *, words: str) -> str:
    """The call fails with ``code`` and a sentence containing ``words``; nothing changed."""
    before = h.session.store.dump()
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error = caught.value
    assert error.code() == code, error.details()
    details = error.details() or ""
    assert words in details
    assert details[0].isalpha() and details.rstrip().endswith((".", ")"))
    assert h.session.store.dump() == before
    return details


def joined(h: Harness) -> None:
    for node in ("a", "b", "c"):
        h.join(node)


def as_bytes(vector: np.ndarray) -> bytes:
    return vector.astype("<u8").tobytes()


# ---------------------------------------------------------------- happy path


LIMITS = ServerLimits(calls_per_node=4, first_message_seconds=1.0, message_gap_seconds=1.0)


def start_limited(
    tmp_path: Path,
    certs: Certificates,
    *,
    limits: ServerLimits = LIMITS,
    log: Callable[[str], None] | None = None,
    **options: int,
) -> Harness:
    fed = make_federation(("a", "b", "c"), **options)  # type: ignore[arg-type]
    session = Session(Store(tmp_path / "state.sqlite"), fed.config)
    tls = ServerTLS(
        certificate=certs.server.certificate_pem(),
        private_key=certs.server.private_key_pem(),
        ca_certificate=certs.ca_pem,
    )
    server = start_server(
        session, tls, listen="127.0.0.1:0", tick_seconds=0.05, limits=limits, log=log
    )
    return Harness(fed, session, server, certs, [])


def code_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""
