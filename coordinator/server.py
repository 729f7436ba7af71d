"""The coordinator's gRPC server: mutual TLS, message translation, status codes, deadlines.

The servicer only translates protobuf messages to the plain dataclasses of
proto/messages.py and back (proto/convert.py); every decision is
the session's (coordinator/session.py). A refused message raises a
:class:`~coordinator.errors.CoordinatorError`, which becomes a gRPC status
with the error's sentence as details (``context.abort``).

Authentication: the server requires a client certificate signed by the
federation CA (TLS handshake failure otherwise), and every RPC takes the
caller's node id from that certificate (zerosum/pki.py); the session refuses
a message naming any other node with PERMISSION_DENIED.

Size limits: payload chunks are at most 1 MiB, so no legitimate message
exceeds about 1 MiB plus a few hundred bytes of header; the server refuses
any single incoming message above :data:`MAX_MESSAGE_BYTES` (2 MiB) before it
reaches the servicer, with gRPC's own status RESOURCE_EXHAUSTED.

Result polls are long polls: a GetResult that would show its caller the
same round, still under way, as its previous one, with no transition
committed since, waits up to :data:`RESULT_HOLD_SECONDS` for one (without
the session lock) and answers as soon as it commits. Nodes poll in a loop;
so they hear of each change at once, and K idle pollers cost the
coordinator nothing.

Memory does not grow with the number of nodes K: each round keeps one running
sum (coordinator/aggregate.py); at most ``payload_slots`` payload streams are
read at a time while the others wait with a 64 KiB flow-control window; and
every node is sent the same encoded result chunks.

Data chunks skip protobuf objects (``proto.chunk_wire``; the bytes on the
wire are protobuf's): an upload's or correction's chunks reach the session
as views of the received messages, and a round's aggregate is read and
encoded once, then the same encoded chunks go to every node
(:class:`ResultChunks`, one aggregate held). The Coordinator service is
registered here (:func:`add_coordinator_service`), with the generated method
names and messages, so those three methods can take and give such bytes.

A background ticker calls :meth:`Session.tick` every ``tick_seconds`` so
deadlines (join, round, unmask) are applied even when no message arrives.

Every call, of every service, passes through :class:`~coordinator.guard.CallGuard`:
calls at once per caller and in total are bounded, a silent stream is ended
at its first-message or message-gap deadline (coordinator/limits.py), and an
unexpected exception is answered INTERNAL, never UNKNOWN. The server also
serves the standard health and reflection services (coordinator/operations.py).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc

from coordinator.errors import (
    CoordinatorError,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
)
from coordinator.guard import CallGuard
from coordinator.limits import ServerLimits, Watchdog
from coordinator.logs import EventLog, as_event_log
from coordinator.operations import Operations
from coordinator.session import Session, Ticket
from coordinator.steps.streams import RESULT_CHUNK_BYTES, EncodedResult
from coordinator.store.payloads import prepare_staging
from proto.chunk_wire import (
    DataChunk,
    as_data_chunk,
    data_chunk_decoder,
    encoded_file_chunks,
    message_part,
    passthrough_serializer,
)
from proto.convert import (
    attestation_from_pb,
    attestation_receipt_to_pb,
    join_response_to_pb,
    key_bundle_from_pb,
    result_header_to_pb,
    result_request_from_pb,
    roster_request_from_pb,
    roster_to_pb,
    status_request_from_pb,
    status_to_pb,
    unmask_header_from_pb,
    unmask_receipt_to_pb,
    unmask_refusal_from_pb,
    unmask_request_to_pb,
    upload_header_from_pb,
    upload_receipt_to_pb,
    withdraw_receipt_to_pb,
    withdraw_request_from_pb,
)
from proto.errors import MalformedMessage
from proto.tls import (
    CertificateError,
    PeerVerifier,
    RevokedCertificateError,
    node_id_from_auth_context,
)
from proto.zerosum.v1 import session_pb2 as pb

__all__ = [
    "MAX_MESSAGE_BYTES",
    "RESULT_HOLD_SECONDS",
    "CoordinatorServicer",
    "ResultChunks",
    "RunningServer",
    "ServerLimits",
    "ServerTLS",
    "add_coordinator_service",
    "start_server",
]

MAX_MESSAGE_BYTES = 2 << 20
# Payload streams read at once (uploads and corrections together): a bound, so the
# memory of streams in flight does not grow with K. Ten, and the 1 MiB result chunks
# (RESULT_CHUNK_BYTES: half the message limit), were measured against four and
# 256 KiB in docs/how-it-works.md.
DEFAULT_PAYLOAD_SLOTS = 10
# How long a GetResult poll that would show the caller nothing new waits for a change.
RESULT_HOLD_SECONDS = 1.0
_SERVICE = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name


def _abort(context: grpc.ServicerContext, error: CoordinatorError) -> NoReturn:
    context.abort(grpc.StatusCode[error.status], error.sentence)
    raise AssertionError("context.abort returned")  # pragma: no cover


class ResultChunks:
    """The latest round's aggregate as encoded data chunk messages, shared by every caller.

    The file is read and encoded once per result; each GetResult then sends
    the same bytes objects (``proto.chunk_wire``). One aggregate is held: a
    result of a later round (or another file of the same round) replaces it,
    and a caller asking for an earlier round's result is served from its
    file chunk by chunk, without replacing it. So the memory held is one
    aggregate, whatever the number of nodes. Every call looks at the file
    first (``os.stat``): a file that is gone fails the call as reading it
    would, and one replaced since is read again.
    """

    def __init__(self, chunk_bytes: int = RESULT_CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._lock = threading.Lock()
        self._key: tuple[int, Path, bytes, tuple[int, ...]] | None = None
        self._chunks: tuple[bytes, ...] = ()

    @property
    def held(self) -> tuple[int, Path, bytes] | None:
        """(round index, file, payload digest) of the aggregate held, if any."""
        return None if self._key is None else self._key[:3]

    def chunks(
        self,
        round_index: int,
        path: Path,
        digest: bytes,
        encoded: EncodedResult | None = None,
    ) -> Sequence[bytes] | Iterator[bytes]:
        """The encoded data chunks of round ``round_index``'s aggregate stored at ``path``.

        ``encoded``: the same aggregate already encoded when it was written
        (``Session.encoded_result``), taken instead of reading the file when
        its chunks are of this size.
        """
        found = os.stat(path)
        key = (
            round_index,
            path,
            digest,
            (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns),
        )
        with self._lock:
            if self._key == key:
                return self._chunks
            if self._key is not None and round_index < self._key[0]:
                return encoded_file_chunks(path, self.chunk_bytes)
            self._key, self._chunks = None, ()  # the old list goes before the new is read
            if encoded is not None and encoded.chunk_bytes == self.chunk_bytes:
                chunks = encoded.chunks
            else:
                chunks = tuple(encoded_file_chunks(path, self.chunk_bytes))
            self._key, self._chunks = key, chunks
            return chunks


class CoordinatorServicer:
    """Translates the Coordinator service's messages for a :class:`Session`."""

    def __init__(
        self,
        session: Session,
        *,
        payload_slots: int = DEFAULT_PAYLOAD_SLOTS,
        verifier: PeerVerifier | None = None,
        result_hold_seconds: float = RESULT_HOLD_SECONDS,
    ) -> None:
        self.session = session
        self._result_hold = result_hold_seconds
        self.results = ResultChunks()
        self._slots = threading.BoundedSemaphore(payload_slots)
        prepare_staging(payload_slots)
        # Pathlen and revocation, which the TLS layer does not check (proto.tls).
        self._verifier = verifier

    def _caller(self, context: grpc.ServicerContext) -> str:
        try:
            if self._verifier is None:
                return node_id_from_auth_context(context.auth_context())
            return self._verifier.node_id(context.auth_context())
        except RevokedCertificateError as error:
            _abort(context, PermissionDenied(str(error)))
        except CertificateError as error:
            _abort(context, Unauthenticated(f"the client certificate names no node: {error}"))

    def _call(
        self,
        context: grpc.ServicerContext,
        action: Callable[[str], Any],
        *,
        access: str = "roster",
    ) -> Any:
        """Run ``action`` for the caller once it may make this call at all.

        ``access`` says who may: "roster" (the session's roster), "joining"
        (also a federation node that may still join: the roster and status
        it needs to), "join" (a node that may join, or has). Checked before
        the message is even converted, so a caller outside sees nothing else.
        Whatever the outcome, the state is flushed to disk first
        (:meth:`Session.sync`): a node never hears of a change that power loss
        could undo.
        """
        caller = self._caller(context)
        try:
            if access == "join":
                self.session.check_may_join(caller)
            else:
                self.session.check_in_roster(caller, while_joining=access == "joining")
            answer = action(caller)
        except CoordinatorError as error:
            self.session.sync()
            _abort(context, error)
        # Group commit: no answer, and no refusal, leaves before every state
        # change made so far is on disk (one flush shared by concurrent calls).
        self.session.sync()
        return answer

    # ------------------------------------------------------------ join and roster

    def Join(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinResponse:
        def join(caller: str) -> pb.JoinResponse:
            try:
                bundle = key_bundle_from_pb(request)
            except MalformedMessage as error:
                raise InvalidArgument(str(error)) from None
            receipt = self.session.join(bundle, caller=caller)
            return join_response_to_pb(receipt)

        result: pb.JoinResponse = self._call(context, join, access="join")
        return result

    def GetRoster(self, request: pb.GetRosterRequest, context: grpc.ServicerContext) -> pb.Roster:
        def roster(caller: str) -> pb.Roster:
            asked = roster_request_from_pb(request)
            self.session.check_caller(caller, asked.node_id or caller)
            return roster_to_pb(self.session.roster(asked.session_id, caller=caller))

        result: pb.Roster = self._call(context, roster, access="joining")
        return result

    # ------------------------------------------------------------ streams in

    def _stream_in(
        self,
        ticket: Ticket,
        messages: Iterator[DataChunk | pb.UploadChunk] | Iterator[DataChunk | pb.UnmaskChunk],
        context: grpc.ServicerContext,
    ) -> Any:
        """Feed a stream's data chunks to the session, then store the payload.

        Only ``payload_slots`` streams are read at a time. A stream waiting
        for a slot has not asked for its next message, so gRPC's flow control
        holds its sender to one small window: the memory taken by streams in
        flight does not grow with the number of nodes.
        """
        try:
            while not self._slots.acquire(timeout=0.5):
                if not context.is_active():
                    raise FailedPrecondition(f"{ticket.what}: the node cancelled the stream.")
        except BaseException:
            self.session.abandon(ticket)
            raise
        try:
            try:
                for message in messages:
                    chunk = as_data_chunk(message)
                    if chunk is None:
                        raise InvalidArgument(
                            f"{ticket.what}: only data chunks may follow the header; "
                            f"got a {message_part(message) or 'empty'} message."
                        )
                    self.session.receive(ticket, chunk.offset, chunk.data)
            finally:
                # Checking, fsyncing and recording need no slot: the bytes are in.
                self._slots.release()
            return self.session.finish(ticket)
        finally:
            self.session.abandon(ticket)

    def UploadEgress(
        self,
        request_iterator: Iterator[DataChunk | pb.UploadChunk],
        context: grpc.ServicerContext,
    ) -> pb.UploadReceipt:
        """An upload stream; its data chunks arrive as :class:`DataChunk` (no copy)."""

        def upload(caller: str) -> pb.UploadReceipt:
            first = next(request_iterator, None)
            if (
                first is None
                or isinstance(first, DataChunk)
                or first.WhichOneof("part") != "header"
            ):
                raise InvalidArgument("the first message of an upload must be its header.")
            header = upload_header_from_pb(first.header)
            outcome = self.session.begin_upload(header, caller=caller)
            receipt = (
                self._stream_in(outcome, request_iterator, context)
                if isinstance(outcome, Ticket)
                else outcome
            )
            return upload_receipt_to_pb(receipt)

        result: pb.UploadReceipt = self._call(context, upload)
        return result

    def SubmitUnmask(
        self,
        request_iterator: Iterator[DataChunk | pb.UnmaskChunk],
        context: grpc.ServicerContext,
    ) -> pb.UnmaskReceipt:
        """An unmask stream; its data chunks arrive as :class:`DataChunk` (no copy)."""

        def submit(caller: str) -> pb.UnmaskReceipt:
            first = next(request_iterator, None)
            if first is None or isinstance(first, DataChunk):
                first, kind = None, None
            else:
                kind = first.WhichOneof("part")
            if first is None or kind not in ("header", "refusal"):
                raise InvalidArgument(
                    "the first message of an unmask answer must be its header or a refusal."
                )
            if kind == "refusal":
                refusal = unmask_refusal_from_pb(first.refusal)
                receipt = self.session.refuse_unmask(refusal, caller=caller)
            else:
                header = unmask_header_from_pb(first.header)
                outcome = self.session.begin_unmask(header, caller=caller)
                receipt = (
                    self._stream_in(outcome, request_iterator, context)
                    if isinstance(outcome, Ticket)
                    else outcome
                )
            return unmask_receipt_to_pb(receipt)

        result: pb.UnmaskReceipt = self._call(context, submit)
        return result

    # ------------------------------------------------------------ results out

    def GetResult(
        self, request: pb.GetResultRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ResultChunk | bytes]:
        """The header, then the aggregate's data chunks, encoded once (:class:`ResultChunks`)."""

        def check(caller: str) -> tuple[str, Any]:
            asked = result_request_from_pb(request)
            self.session.check_caller(caller, asked.node_id or caller)
            return caller, self.session.result(
                asked.session_id,
                asked.round_index,
                caller=caller,
                hold_seconds=self._result_hold,
            )

        caller, view = self._call(context, check)
        yield pb.ResultChunk(header=result_header_to_pb(view.header()))
        if view.path is None:
            return
        digest = b"" if view.payload is None else view.payload.digest
        encoded = self.session.encoded_result(view.round_index, view.path, digest)
        yield from self.results.chunks(view.round_index, view.path, digest, encoded)
        self.session.record_delivery(view.round_index, caller)

    # ------------------------------------------------------------ unmask and status

    def GetUnmaskRequest(
        self, request: pb.GetUnmaskRequestRequest, context: grpc.ServicerContext
    ) -> pb.UnmaskRequest:
        def fetch(caller: str) -> pb.UnmaskRequest:
            self.session.check_caller(caller, request.node_id or caller)
            view = self.session.unmask_request(
                request.session_id, request.round_index, caller=caller
            )
            return unmask_request_to_pb(view)

        result: pb.UnmaskRequest = self._call(context, fetch)
        return result

    def AttestSurvivors(
        self, request: pb.SurvivorAttestation, context: grpc.ServicerContext
    ) -> pb.AttestationReceipt:
        def attest(caller: str) -> pb.AttestationReceipt:
            receipt = self.session.attest(attestation_from_pb(request), caller=caller)
            return attestation_receipt_to_pb(receipt)

        result: pb.AttestationReceipt = self._call(context, attest)
        return result

    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.SessionStatus:
        def status(caller: str) -> pb.SessionStatus:
            asked = status_request_from_pb(request)
            return status_to_pb(self.session.status(asked.session_id, caller=caller))

        result: pb.SessionStatus = self._call(context, status, access="joining")
        return result

    def Withdraw(
        self, request: pb.WithdrawRequest, context: grpc.ServicerContext
    ) -> pb.WithdrawReceipt:
        def withdraw(caller: str) -> pb.WithdrawReceipt:
            receipt = self.session.withdraw(withdraw_request_from_pb(request), caller=caller)
            return withdraw_receipt_to_pb(receipt)

        result: pb.WithdrawReceipt = self._call(context, withdraw)
        return result


# ---------------------------------------------------------------- registering the service


def add_coordinator_service(servicer: CoordinatorServicer, server: grpc.Server) -> None:
    """Register the Coordinator service's methods, as the generated code would but for three.

    The method names and the request and response messages on the wire are
    the generated ones. UploadEgress and SubmitUnmask read their data chunks
    with ``proto.chunk_wire`` (a :class:`DataChunk` viewing the received
    bytes; every other message parsed, or refused, by protobuf as before);
    GetResult sends the encoded data chunks it yields as they are.
    """
    handlers = {
        "Join": grpc.unary_unary_rpc_method_handler(
            servicer.Join,
            request_deserializer=pb.JoinRequest.FromString,
            response_serializer=pb.JoinResponse.SerializeToString,
        ),
        "GetRoster": grpc.unary_unary_rpc_method_handler(
            servicer.GetRoster,
            request_deserializer=pb.GetRosterRequest.FromString,
            response_serializer=pb.Roster.SerializeToString,
        ),
        "UploadEgress": grpc.stream_unary_rpc_method_handler(
            servicer.UploadEgress,
            request_deserializer=data_chunk_decoder(pb.UploadChunk.FromString),
            response_serializer=pb.UploadReceipt.SerializeToString,
        ),
        "GetResult": grpc.unary_stream_rpc_method_handler(
            servicer.GetResult,
            request_deserializer=pb.GetResultRequest.FromString,
            response_serializer=passthrough_serializer,
        ),
        "GetUnmaskRequest": grpc.unary_unary_rpc_method_handler(
            servicer.GetUnmaskRequest,
            request_deserializer=pb.GetUnmaskRequestRequest.FromString,
            response_serializer=pb.UnmaskRequest.SerializeToString,
        ),
        "AttestSurvivors": grpc.unary_unary_rpc_method_handler(
            servicer.AttestSurvivors,
            request_deserializer=pb.SurvivorAttestation.FromString,
            response_serializer=pb.AttestationReceipt.SerializeToString,
        ),
        "SubmitUnmask": grpc.stream_unary_rpc_method_handler(
            servicer.SubmitUnmask,
            request_deserializer=data_chunk_decoder(pb.UnmaskChunk.FromString),
            response_serializer=pb.UnmaskReceipt.SerializeToString,
        ),
        "GetStatus": grpc.unary_unary_rpc_method_handler(
            servicer.GetStatus,
            request_deserializer=pb.GetStatusRequest.FromString,
            response_serializer=pb.SessionStatus.SerializeToString,
        ),
        "Withdraw": grpc.unary_unary_rpc_method_handler(
            servicer.Withdraw,
            request_deserializer=pb.WithdrawRequest.FromString,
            response_serializer=pb.WithdrawReceipt.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))


# ---------------------------------------------------------------- running a server


@dataclass(frozen=True)
class ServerTLS:
    """PEM bytes: the coordinator's certificate and key, and the federation CA for clients.

    ``revoked`` holds the SHA-256 fingerprints of client certificates to refuse.
    """

    certificate: bytes
    private_key: bytes
    ca_certificate: bytes
    revoked: tuple[str, ...] = ()


class _Ticker(threading.Thread):
    """Calls ``session.tick()`` every ``interval`` seconds until stopped.

    Once the session has ended, health says NOT_SERVING.
    """

    def __init__(
        self, session: Session, interval: float, log: EventLog | None, operations: Operations
    ) -> None:
        super().__init__(name="zerosum-deadline-ticker", daemon=True)
        self._session = session
        self._interval = interval
        self._log = log
        self._operations = operations
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            try:
                self._session.tick()
                if self._operations.serving and self._session.ended():
                    self._operations.set_serving(False)
            except Exception as error:  # a failed tick is retried at the next one
                if self._log is not None:
                    self._log.event(
                        "tick-failed",
                        f"deadline check failed, will retry: {error!r}",
                        level="warning",
                    )

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


class RunningServer:
    """A started coordinator server; ``port`` is the port actually bound.

    ``guard`` holds the call limits in force, ``operations`` the health it reports.
    """

    def __init__(
        self,
        server: grpc.Server,
        port: int,
        session: Session,
        ticker: _Ticker,
        *,
        guard: CallGuard,
        operations: Operations,
        watchdog: Watchdog,
    ) -> None:
        self.server = server
        self.port = port
        self.session = session
        self.guard = guard
        self.operations = operations
        self._ticker = ticker
        self._watchdog = watchdog

    def stop(self, grace: float | None = 1.0) -> None:
        """Say NOT_SERVING, stop the deadline ticker, then the server (``grace`` seconds)."""
        self.operations.shut_down()
        self._ticker.stop()
        self.server.stop(grace).wait()
        self._watchdog.stop()


def start_server(
    session: Session,
    tls: ServerTLS,
    *,
    listen: str = "127.0.0.1:0",
    tick_seconds: float = 0.25,
    max_workers: int | None = None,
    payload_slots: int = DEFAULT_PAYLOAD_SLOTS,
    limits: ServerLimits | None = None,
    log: Callable[[str], None] | None = None,
    result_hold_seconds: float = RESULT_HOLD_SECONDS,
) -> RunningServer:
    """Serve ``session`` over mutual TLS on ``listen`` (port 0: any free port).

    ``limits`` (default :class:`ServerLimits`) bounds the calls of each caller
    and in total; the thread pool has one worker per call the total admits,
    so an admitted call never waits for a thread (``max_workers`` overrides
    it). ``result_hold_seconds`` bounds a held result poll (the module
    docstring). ``log`` hears the ticker's and the guard's events; a
    :class:`~coordinator.logs.CoordinatorLog` gets them with their fields.
    """
    limits = limits or ServerLimits()
    total = limits.total_calls(len(session.config.node_ids))
    events = as_event_log(log)
    watchdog = Watchdog(time.monotonic)
    guard = CallGuard(
        limits,
        session.config.node_ids,
        watchdog,
        events.event if events else None,
        federation_id=session.config.federation_id,
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=max_workers or total, thread_name_prefix="zerosum-rpc"
        ),
        interceptors=[guard],
        maximum_concurrent_rpcs=total,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # Refuse to share the port with another process (a second coordinator).
            ("grpc.so_reuseport", 0),
            # A fixed 64 KiB read-ahead per stream instead of gRPC's bandwidth-delay
            # probing, which grows every stream's window to megabytes: with K nodes
            # uploading at once the buffered bytes would otherwise grow with K.
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", 64 << 10),
            # Ping idle connections so a vanished node's stream is cancelled (and its
            # payload slot freed) within about half a minute.
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
        ],
    )
    add_coordinator_service(
        CoordinatorServicer(
            session,
            payload_slots=payload_slots,
            verifier=PeerVerifier(tls.ca_certificate, tls.revoked),
            result_hold_seconds=result_hold_seconds,
        ),
        server,
    )
    operations = Operations(server)
    credentials = grpc.ssl_server_credentials(
        [(tls.private_key, tls.certificate)],
        root_certificates=tls.ca_certificate,
        require_client_auth=True,
    )
    try:
        port = server.add_secure_port(listen, credentials)
        if port == 0:
            raise OSError(f"cannot listen on {listen}: the address is in use or invalid.")
    except BaseException:
        watchdog.stop()
        raise
    server.start()
    operations.set_serving(not session.ended())
    ticker = _Ticker(session, tick_seconds, events, operations)
    ticker.start()
    return RunningServer(
        server, port, session, ticker, guard=guard, operations=operations, watchdog=watchdog
    )
