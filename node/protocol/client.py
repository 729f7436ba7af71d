"""The node's gRPC gateway: mutual TLS, retries with backoff, payloads in chunks.

A TRE node only ever opens outbound connections to the coordinator (the only
server). :class:`GrpcGateway` implements ``node.protocol.gateway.CoordinatorGateway``:
each call makes its request as a plain message of ``proto.messages`` and
``proto.convert`` writes it, and reads the answer back, so nothing beyond
this module sees gRPC and this module sets no field of a stub itself.

Every call is retried on UNAVAILABLE and DEADLINE_EXCEEDED — the coordinator
may be restarting after a crash and resumes from its SQLite state — with
capped exponential backoff and "full jitter": attempt n sleeps a uniform time
in [0, min(cap, base·2^n)] (Brooker 2015, "Exponential Backoff And Jitter",
AWS Architecture Blog), so restarted nodes do not reconnect in lock step.
While it retries it reports progress every few seconds; retries stop after a
bounded total time with :class:`~node.errors.CoordinatorUnreachable` ("did
not answer"). A handshake that fails on a certificate also reads UNAVAILABLE;
so on UNAVAILABLE the gateway makes one TLS handshake of its own
(``node.protocol.tls_probe``, at most every few seconds), and a certificate that does
not match ends the call at once with :class:`~node.errors.TlsMismatch`, one
sentence naming the certificate, instead of minutes of retries. Every other
status is a decision of the coordinator and is raised at once as
:class:`~node.errors.CoordinatorRefused` (or :class:`~node.errors.AlreadyJoined`)
with its code and sentence.

Payloads travel as client or server streams of chunks of at most 1 MiB
(``proto.chunks``). Their data chunks go out already encoded from the
payload (one copy of each chunk) and the aggregate's come in as views of the
received messages (``proto.chunk_wire``), through calls of the stub's methods
whose serializers take those bytes. A streamed upload is re-sent from its
first chunk on each attempt; the coordinator treats a repeated identical upload as a no-op. The
gateway remembers the digest of each payload it uploaded, for checking the
statements that come back with the aggregate.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

import grpc
import numpy as np
from numpy.typing import NDArray

from bounded.files import KIB, LocalFileError, read_limited, read_secret
from node.errors import (
    AlreadyJoined,
    CoordinatorRefused,
    CoordinatorUnreachable,
    SetupError,
    TlsMismatch,
)
from node.protocol.coordinator_certificate import verify_coordinator
from node.protocol.tls_probe import tls_mismatch
from noise.keys import KeyBundle
from noise.layout import as_words
from proto.chunk_wire import (
    DataChunk,
    as_data_chunk,
    data_chunk_decoder,
    passthrough_serializer,
)
from proto.chunks import (
    CHUNK_BYTES,
    Chunk,
    PayloadAssembler,
    PayloadError,
    layout_of,
)
from proto.convert import (
    attestation_to_pb,
    join_request_to_pb,
    join_response_from_pb,
    result_request_to_pb,
    roster_from_pb,
    roster_request_to_pb,
    round_result_from_pb,
    status_from_pb,
    status_request_to_pb,
    unmask_chunks_to_pb,
    unmask_refusal_chunks_to_pb,
    upload_chunks_to_pb,
    upload_receipt_from_pb,
    withdraw_receipt_from_pb,
    withdraw_request_to_pb,
)
from proto.messages import (
    Attestation,
    JoinReceipt,
    ResultRequest,
    RosterRequest,
    RosterView,
    RoundResult,
    SessionStatus,
    StatusRequest,
    UnmaskHeader,
    UnmaskRefusal,
    UploadHeader,
    UploadReceipt,
    WithdrawReceipt,
    WithdrawRequest,
)
from proto.text import sanitise_text
from proto.tls import CertificateError, check_node_credentials
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc

__all__ = [
    "CHUNK_BYTES",
    "GrpcGateway",
    "Retrier",
    "RetryPolicy",
    "assemble_payload",
]

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# Certificates and keys are a few kilobytes; anything larger is not one.
_CREDENTIAL_BYTES: Final = 64 * KIB
# How often a node that keeps retrying says so.
_PROGRESS_SECONDS: Final = 10.0
# How often, at most, an UNAVAILABLE call is followed by a TLS handshake of the node's own.
_DIAGNOSE_SECONDS: Final = 2.0

_R = TypeVar("_R")


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for transient failures: base·2^n capped at ``max_backoff``, full jitter.

    ``total_seconds`` bounds the time spent retrying one call; ``attempt_timeout``
    is each attempt's gRPC deadline.
    """

    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    total_seconds: float = 120.0
    attempt_timeout: float = 60.0

    def __post_init__(self) -> None:
        for name in ("initial_backoff", "max_backoff", "total_seconds", "attempt_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"RetryPolicy.{name} must be > 0; got {value!r}")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Sleep before retry number ``attempt`` (0-based)."""
        ceiling = min(self.max_backoff, self.initial_backoff * 2.0**attempt)
        return rng.uniform(0.0, ceiling)


class Retrier:
    """Runs one call with the retries of a :class:`RetryPolicy` (see the module docstring).

    ``attempt(timeout)`` makes the call; a gRPC error with a retryable status
    is retried after a jittered backoff, any other becomes
    :class:`~node.errors.CoordinatorRefused` (``AlreadyJoined`` for a second
    key at Join). ``progress`` hears, every few seconds, that the coordinator
    does not answer yet.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        address: str,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[str], None] | None = None,
        diagnose: Callable[[], str | None] | None = None,
    ) -> None:
        self.policy = policy
        self.address = address
        # Says why the coordinator cannot be reached when a retry would not help.
        self._diagnose = diagnose
        self._diagnosed: float | None = None
        # Jitter needs no secrecy, only independence between nodes.
        self._rng = rng or random.SystemRandom()
        self._sleep = sleep
        self._clock = clock
        self._progress = progress

    def run(self, method: str, attempt: Callable[[float], _R]) -> _R:
        started = self._clock()
        said = started
        tries = 0
        while True:
            tries += 1
            try:
                return attempt(self.policy.attempt_timeout)
            except grpc.RpcError as error:
                code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
                # The coordinator's sentence reaches the terminal and the logs.
                details = sanitise_text(
                    (error.details() if hasattr(error, "details") else "") or ""
                )
                if code not in _RETRYABLE:
                    kind = CoordinatorRefused
                    if method == "Join" and code == grpc.StatusCode.ALREADY_EXISTS:
                        kind = AlreadyJoined
                    raise kind(method, code.name, details) from None
                now = self._clock()
                if (
                    code == grpc.StatusCode.UNAVAILABLE
                    and self._diagnose is not None
                    and (self._diagnosed is None or now - self._diagnosed >= _DIAGNOSE_SECONDS)
                ):
                    self._diagnosed = now
                    mismatch = self._diagnose()
                    if mismatch is not None:
                        raise TlsMismatch(mismatch) from None
                    now = self._clock()
                elapsed = now - started
                pause = self.policy.backoff(tries - 1, self._rng)
                if elapsed + pause > self.policy.total_seconds:
                    raise CoordinatorUnreachable(
                        method, code.name, details, tries, elapsed
                    ) from None
                if self._progress is not None and now - said >= _PROGRESS_SECONDS:
                    said = now
                    self._progress(
                        f"the coordinator at {self.address} does not answer yet ({method}, "
                        f"{tries} attempts over {elapsed:.0f} s, {code.name}: {details}); "
                        f"still trying for up to {self.policy.total_seconds:.0f} s"
                    )
                self._sleep(pause)


def _method(name: str) -> str:
    """The path of a Coordinator method on the wire, from the protocol's descriptor."""
    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    return f"/{service.full_name}/{service.methods_by_name[name].name}"


def assemble_payload(
    header: pb.PayloadHeader, chunks: Iterable[Chunk], *, what: str, check_digest: bool = True
) -> NDArray[np.uint64]:
    """Join streamed chunks with :class:`~proto.chunks.PayloadAssembler`.

    Raises :class:`~proto.chunks.PayloadError` (a ValueError) naming ``what``
    when the order, size or (with ``check_digest``) digest does not match
    the header.
    """
    try:
        assembler = PayloadAssembler(header, check_digest=check_digest)
        for chunk in chunks:
            assembler.add(chunk)
        return assembler.finish()
    except PayloadError as error:
        raise PayloadError(f"{what}: {error}") from None


def _read_credential(path: Path, what: str, *, secret: bool = False) -> bytes:
    try:
        if secret:
            return read_secret(path, _CREDENTIAL_BYTES, what=what)
        return read_limited(path, _CREDENTIAL_BYTES, what=what)
    except LocalFileError as error:
        raise SetupError(str(error)) from None


class _HandshakeFailed(grpc.RpcError):
    """A handshake of the certificate check that did not complete: retried like UNAVAILABLE."""

    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


class GrpcGateway:
    """Typed, retrying calls to the coordinator over one mutual-TLS channel."""

    def __init__(
        self,
        address: str,
        *,
        node_id: str,
        root_certificate: bytes,
        certificate_chain: bytes,
        private_key: bytes,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[str], None] | None = None,
        server_check: Callable[[float], str] | None = None,
        tls_files: tuple[Path, Path, Path] | None = None,
    ) -> None:
        self.address = address
        # Checks the coordinator's certificate before the first call (returns its fingerprint).
        self._server_check = server_check
        self._node_id = node_id
        self.retry = retry or RetryPolicy()
        diagnose = None
        if tls_files is not None:
            ca_path, certificate_path, key_path = tls_files

            def diagnose() -> str | None:
                return tls_mismatch(
                    address,
                    ca_certificate=ca_path,
                    client_certificate=certificate_path,
                    client_key=key_path,
                )

        self._retrier = Retrier(
            self.retry,
            address=address,
            rng=rng,
            sleep=sleep,
            clock=clock,
            progress=progress,
            diagnose=diagnose,
        )
        credentials = grpc.ssl_channel_credentials(
            root_certificates=root_certificate,
            private_key=private_key,
            certificate_chain=certificate_chain,
        )
        self._channel = grpc.secure_channel(address, credentials)
        self._stub = pb_grpc.CoordinatorStub(self._channel)
        # The payload streams, with the stub's methods and messages: data chunks go
        # out already encoded from the payload, and come in as views of the received
        # messages (proto.chunk_wire); every other message is protobuf's as usual.
        self._upload_stream = self._channel.stream_unary(
            _method("UploadEgress"),
            request_serializer=passthrough_serializer,
            response_deserializer=pb.UploadReceipt.FromString,
        )
        self._unmask_stream = self._channel.stream_unary(
            _method("SubmitUnmask"),
            request_serializer=passthrough_serializer,
            response_deserializer=pb.UnmaskReceipt.FromString,
        )
        self._result_stream = self._channel.unary_stream(
            _method("GetResult"),
            request_serializer=pb.GetResultRequest.SerializeToString,
            response_deserializer=data_chunk_decoder(pb.ResultChunk.FromString),
        )
        # (session id, round index) -> digest of the payload this gateway uploaded.
        self._uploaded: dict[tuple[str, int], bytes] = {}

    @classmethod
    def from_files(
        cls,
        address: str,
        *,
        node_id: str,
        ca_certificate: Path,
        client_certificate: Path,
        client_key: Path,
        retry: RetryPolicy | None = None,
        progress: Callable[[str], None] | None = None,
        revoked: tuple[str, ...] = (),
    ) -> GrpcGateway:
        """A gateway with the node's TLS files, checked first (SetupError naming the fault).

        Before its first call the gateway checks the certificate the
        coordinator presents against ``revoked`` (``node.protocol.coordinator_certificate``).
        """
        ca = _read_credential(ca_certificate, "CA certificate")
        certificate = _read_credential(client_certificate, "client certificate")
        key = _read_credential(client_key, "client key", secret=True)
        try:
            check_node_credentials(ca, certificate, key, node_id, revoked=revoked)
        except CertificateError as error:
            raise SetupError(f"{client_certificate}: {error}") from None

        def server_check(timeout: float) -> str:
            return verify_coordinator(
                address,
                ca_pem=ca,
                ca_certificate=ca_certificate,
                client_certificate=client_certificate,
                client_key=client_key,
                revoked=revoked,
                timeout=timeout,
            )

        return cls(
            address,
            node_id=node_id,
            root_certificate=ca,
            certificate_chain=certificate,
            private_key=key,
            retry=retry,
            progress=progress,
            server_check=server_check,
            tls_files=(ca_certificate, client_certificate, client_key),
        )

    @property
    def node_id(self) -> str:
        return self._node_id

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GrpcGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, attempt: Callable[[float], _R]) -> _R:
        if self._server_check is not None:
            self._retrier.run("the TLS handshake checking its certificate", self._check_server)
        return self._retrier.run(method, attempt)

    def _check_server(self, timeout: float) -> None:
        check = self._server_check
        if check is None:
            return
        try:
            check(timeout)
        except OSError as error:
            raise _HandshakeFailed(f"{type(error).__name__}: {error}") from None
        except CertificateError as error:
            raise SetupError(
                f"refusing the coordinator at {self.address}: {error} Nothing was sent"
            ) from None
        self._server_check = None

    # -- calls ----------------------------------------------------------

    def join(self, bundle: KeyBundle) -> JoinReceipt:
        request = join_request_to_pb(bundle)
        response: pb.JoinResponse = self._call(
            "Join", lambda t: self._stub.Join(request, timeout=t)
        )
        return join_response_from_pb(response)

    def status(self, session_id: str = "") -> SessionStatus:
        request = status_request_to_pb(StatusRequest(session_id))
        message: pb.SessionStatus = self._call(
            "GetStatus", lambda t: self._stub.GetStatus(request, timeout=t)
        )
        return status_from_pb(message)

    def withdraw(self, session_id: str, round_index: int, reason: str) -> WithdrawReceipt:
        """Tell the coordinator this node stops before uploading ``round_index``, and why.

        The coordinator drops the node from that round at once, as the round
        deadline would have; it refuses once the node has uploaded the round.
        ``reason`` is shown to every node, so it must be a sentence without
        data (at most 1000 characters).
        """
        request = withdraw_request_to_pb(
            WithdrawRequest(session_id, round_index, self._node_id, reason)
        )
        receipt: pb.WithdrawReceipt = self._call(
            "Withdraw", lambda t: self._stub.Withdraw(request, timeout=t)
        )
        return withdraw_receipt_from_pb(receipt)

    def roster(self, session_id: str) -> RosterView:
        request = roster_request_to_pb(RosterRequest(session_id, self._node_id))
        message: pb.Roster = self._call(
            "GetRoster", lambda t: self._stub.GetRoster(request, timeout=t)
        )
        return roster_from_pb(message)

    def upload(self, header: UploadHeader, payload: NDArray[np.uint64]) -> UploadReceipt:
        """Stream a payload with its signed upload statement (see node/protocol/statements.py)."""
        if as_words(payload).shape != (header.payload.total_elements,):
            raise PayloadError(
                f"a payload of {as_words(payload).size} words does not fit a layout of "
                f"{header.payload.total_elements} words"
            )
        receipt: pb.UploadReceipt = self._call(
            "UploadEgress",
            lambda t: self._upload_stream(upload_chunks_to_pb(header, payload), timeout=t),
        )
        self._uploaded[(header.session_id, header.round_index)] = header.payload.digest
        return upload_receipt_from_pb(receipt)

    def uploaded_digest(self, session_id: str, round_index: int) -> bytes | None:
        """The digest of the payload this gateway uploaded for a round; None if it sent none."""
        return self._uploaded.get((session_id, round_index))

    def result(self, session_id: str, round_index: int) -> RoundResult:
        """The round's state; when READY also the aggregate, whole but not yet checked.

        Its words are not hashed against the header's digest: the coordinator
        chose both, so agreeing with each other proves nothing against it, and
        TLS already refuses anything altered in transit. The node checks the
        aggregate with its secret tags instead (``node.session.aggregate_tags
        .check_aggregate``), which no aggregate but the survivors' sum passes,
        and refuses to use it unchecked.
        """
        request = result_request_to_pb(ResultRequest(session_id, round_index, self._node_id))

        def attempt(timeout: float) -> RoundResult:
            stream = iter(self._result_stream(request, timeout=timeout))
            first = next(stream, None)
            if first is None or isinstance(first, DataChunk) or not first.HasField("header"):
                raise CoordinatorRefused(
                    "GetResult", "INTERNAL", "the result stream did not start with a header"
                )
            header = first.header
            chunks = (chunk for chunk in map(as_data_chunk, stream) if chunk is not None)
            aggregate = None
            layout = None
            if header.status == pb.ROUND_STATUS_READY:
                try:
                    # Chunks go into the assembler as they arrive, never held as a list.
                    aggregate = assemble_payload(
                        header.payload,
                        chunks,
                        what=f"aggregate of round {round_index}",
                        check_digest=False,
                    )
                    layout = layout_of(header.payload.tensors)
                except PayloadError as error:
                    raise CoordinatorRefused("GetResult", "DATA_LOSS", str(error)) from None
            else:
                for _ in chunks:  # none are sent; drain the stream all the same
                    pass
            return round_result_from_pb(header, aggregate=aggregate, layout=layout)

        return self._call("GetResult", attempt)

    def attest(self, attestation: Attestation) -> None:
        request = attestation_to_pb(attestation)
        self._call("AttestSurvivors", lambda t: self._stub.AttestSurvivors(request, timeout=t))

    def submit_unmask(self, header: UnmaskHeader, payload: NDArray[np.uint64] | None) -> None:
        """Send this node's unmask answer: its self-mask seed, and its corrections if any."""
        self._call(
            "SubmitUnmask",
            lambda t: self._unmask_stream(unmask_chunks_to_pb(header, payload), timeout=t),
        )

    def refuse_unmask(self, refusal: UnmaskRefusal) -> None:
        self._call(
            "SubmitUnmask",
            lambda t: self._unmask_stream(unmask_refusal_chunks_to_pb(refusal), timeout=t),
        )
