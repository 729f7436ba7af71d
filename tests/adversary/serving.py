"""The lying coordinator on the wire: the Coordinator service over mutual TLS.

As coordinator/server.py: the server requires a client certificate of the
federation CA, takes the caller's node id from it (proto/tls.py) and turns a
refused message into a gRPC status with a sentence. The decisions are the
:class:`~tests.adversary.lying_server.LyingCoordinator`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import grpc

from proto.chunks import payload_chunks
from proto.federation import FederationConfig
from proto.tls import CertificateError, node_id_from_auth_context
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc
from tests.adversary.lying_server import UNMASK, LyingCoordinator, Refused
from tests.adversary.records import Script

__all__ = ["Serving", "serve"]

T = TypeVar("T")
RESULT_CHUNK_BYTES = 256 << 10


class _Servicer(pb_grpc.CoordinatorServicer):
    """gRPC edge of :class:`LyingCoordinator`: caller from the certificate, errors as statuses."""

    def __init__(self, server: LyingCoordinator) -> None:
        self.server = server

    def _run(
        self, context: grpc.ServicerContext, action: Callable[[str], T], *, locked: bool = True
    ) -> T:
        """``action(caller)``, under the state lock unless ``locked`` is False."""
        try:
            caller = node_id_from_auth_context(context.auth_context())
        except CertificateError as error:
            _abort(context, Refused(grpc.StatusCode.UNAUTHENTICATED, str(error)))
        try:
            if not locked:
                return action(caller)
            with self.server.lock:
                return action(caller)
        except Refused as refused:
            _abort(context, refused)

    def Join(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinResponse:
        return self._run(context, lambda caller: self.server.join(caller, request))

    def GetRoster(self, request: pb.GetRosterRequest, context: grpc.ServicerContext) -> pb.Roster:
        return self._run(context, lambda caller: self.server.roster(caller, request))

    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.SessionStatus:
        return self._run(context, self.server.status)

    def UploadEgress(
        self, request_iterator: Iterator[pb.UploadChunk], context: grpc.ServicerContext
    ) -> pb.UploadReceipt:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "header":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an upload starts with its header.")
        assert first is not None
        header = first.header
        # Payload chunks are read outside the state lock; the upload takes it to store.
        return self._run(
            context,
            lambda caller: self.server.upload(caller, header, request_iterator),
            locked=False,
        )

    def SubmitUnmask(
        self, request_iterator: Iterator[pb.UnmaskChunk], context: grpc.ServicerContext
    ) -> pb.UnmaskReceipt:
        first = next(request_iterator, None)
        kind = None if first is None else first.WhichOneof("part")
        if first is None or kind not in ("header", "refusal"):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "an unmask answer starts with a header."
            )
        assert first is not None
        if kind == "refusal":
            return self._run(context, lambda caller: self.server.refuse(caller, first.refusal))
        return self._run(
            context, lambda caller: self.server.answer(caller, first.header, request_iterator)
        )

    def GetResult(
        self, request: pb.GetResultRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ResultChunk]:
        header, aggregate = self._run(context, lambda caller: self.server.result(caller, request))
        yield pb.ResultChunk(header=header)
        if aggregate is not None:
            for chunk in payload_chunks(aggregate, RESULT_CHUNK_BYTES):
                yield pb.ResultChunk(data=chunk)

    def GetUnmaskRequest(
        self, request: pb.GetUnmaskRequestRequest, context: grpc.ServicerContext
    ) -> pb.UnmaskRequest:
        def fetch(caller: str) -> pb.UnmaskRequest:
            record = self.server._record(request.session_id, request.round_index)
            if record.status != UNMASK:
                return pb.UnmaskRequest(session_id=request.session_id, pending=False)
            return self.server.unmask_request(record, caller)

        return self._run(context, fetch)

    def AttestSurvivors(
        self, request: pb.SurvivorAttestation, context: grpc.ServicerContext
    ) -> pb.AttestationReceipt:
        return self._run(context, lambda caller: self.server.attest(caller, request))

    def Withdraw(
        self, request: pb.WithdrawRequest, context: grpc.ServicerContext
    ) -> pb.WithdrawReceipt:
        def refuse(caller: str) -> pb.WithdrawReceipt:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION, "this coordinator takes no withdrawals."
            )

        return self._run(context, refuse)


def _abort(context: grpc.ServicerContext, refused: Refused) -> NoReturn:
    context.abort(refused.code, refused.sentence)
    raise AssertionError("context.abort returned")


@dataclass
class Serving:
    """A started lying coordinator: its state, its port, and how to stop it."""

    coordinator: LyingCoordinator
    server: grpc.Server
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(grace=None).wait()


def serve(federation: FederationConfig, root: Path, script: Script | None = None) -> Serving:
    """Serve a :class:`LyingCoordinator` on 127.0.0.1 (any free port) with the coordinator's key.

    ``root`` is the federation folder (``coordinator/server.pem`` and
    ``coordinator/server.key`` as written by ``zerosum federation init``).
    """
    coordinator = LyingCoordinator(federation, script)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_CoordinatorServicer_to_server(_Servicer(coordinator), server)
    credentials = grpc.ssl_server_credentials(
        [
            (
                (root / "coordinator" / "server.key").read_bytes(),
                (root / "coordinator" / "server.pem").read_bytes(),
            )
        ],
        root_certificates=federation.ca_certificate_path.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return Serving(coordinator, server, port)
