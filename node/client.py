"""The node's gRPC client: mutual TLS, retries with backoff, payloads in chunks.

A TRE node only ever opens outbound connections to the coordinator (the only
server). Every call is retried on UNAVAILABLE and DEADLINE_EXCEEDED — the
coordinator may be restarting after a crash and resumes from its SQLite state
— with capped exponential backoff and "full jitter": attempt n sleeps a
uniform time in [0, min(cap, base·2^n)] (Brooker 2015, "Exponential Backoff
And Jitter", AWS Architecture Blog), so restarted nodes do not reconnect in
lock step. Retries stop after a bounded total time. Every other status is a
decision of the coordinator and is raised at once as :class:`CoordinatorError`
with its code and sentence.

Payloads (uint64 fixed-point vectors, little-endian on the wire) travel as
client or server streams of chunks of at most 1 MiB, far below gRPC's 4 MiB
message limit whatever the payload size. A streamed upload is re-sent from
its first chunk on each attempt; the coordinator treats a repeated identical
upload as a no-op (idempotent per session, round, node and SHA-256). Every
upload carries the node's signed upload statement (node/statements.py); the
client remembers the digest of each payload it uploaded, for checking the
statements that come back with the aggregate. Downloads are put back
together, checked and hashed in one pass by ``proto.chunks.PayloadAssembler``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
from numpy.typing import NDArray

from noise.layout import Layout
from proto.chunks import CHUNK_BYTES, PayloadAssembler, PayloadError, payload_chunks, payload_header
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc

__all__ = [
    "CHUNK_BYTES",
    "CoordinatorClient",
    "CoordinatorError",
    "CoordinatorUnreachable",
    "RetryPolicy",
    "assemble_payload",
]

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_R = TypeVar("_R")


class CoordinatorError(Exception):
    """The coordinator answered with an error status (not retried)."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        self.method = method
        self.code = code
        self.details = details
        super().__init__(f"{method}: {code.name}: {details}")


class CoordinatorUnreachable(CoordinatorError):
    """Retries on UNAVAILABLE / DEADLINE_EXCEEDED ran out of time."""

    def __init__(
        self, method: str, code: grpc.StatusCode, details: str, attempts: int, seconds: float
    ) -> None:
        super().__init__(method, code, details)
        self.attempts = attempts
        self.seconds = seconds
        self.args = (
            f"{method}: the coordinator did not answer after {attempts} attempts over "
            f"{seconds:.1f} s (last status {code.name}: {details})",
        )


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


def assemble_payload(
    header: pb.PayloadHeader, chunks: Iterable[pb.PayloadChunk], *, what: str
) -> NDArray[np.uint64]:
    """Join streamed chunks with :class:`~proto.chunks.PayloadAssembler`.

    Raises :class:`~proto.chunks.PayloadError` (a ValueError) naming ``what``
    when the order, size or SHA-256 does not match the header.
    """
    try:
        assembler = PayloadAssembler(header)
        for chunk in chunks:
            assembler.add(chunk)
        return assembler.finish()
    except PayloadError as error:
        raise PayloadError(f"{what}: {error}") from None


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None


class CoordinatorClient:
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
    ) -> None:
        self.address = address
        self.node_id = node_id
        self.retry = retry or RetryPolicy()
        # Jitter needs no secrecy, only independence between nodes.
        self._rng = rng or random.SystemRandom()
        self._sleep = sleep
        self._clock = clock
        credentials = grpc.ssl_channel_credentials(
            root_certificates=root_certificate,
            private_key=private_key,
            certificate_chain=certificate_chain,
        )
        self._channel = grpc.secure_channel(address, credentials)
        self._stub = pb_grpc.CoordinatorStub(self._channel)
        # (session id, round index) -> SHA-256 of the payload this client uploaded.
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
    ) -> CoordinatorClient:
        return cls(
            address,
            node_id=node_id,
            root_certificate=_read(ca_certificate, "CA certificate"),
            certificate_chain=_read(client_certificate, "client certificate"),
            private_key=_read(client_key, "client key"),
            retry=retry,
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the retry loop -------------------------------------------------

    def _call(self, method: str, attempt: Callable[[float], _R]) -> _R:
        started = self._clock()
        tries = 0
        while True:
            tries += 1
            try:
                return attempt(self.retry.attempt_timeout)
            except grpc.RpcError as error:
                code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
                details = (error.details() if hasattr(error, "details") else "") or ""
                if code not in _RETRYABLE:
                    raise CoordinatorError(method, code, details) from None
                elapsed = self._clock() - started
                pause = self.retry.backoff(tries - 1, self._rng)
                if elapsed + pause > self.retry.total_seconds:
                    raise CoordinatorUnreachable(method, code, details, tries, elapsed) from None
                self._sleep(pause)

    # -- calls ----------------------------------------------------------

    def join(self, bundle: pb.KeyBundle) -> pb.JoinResponse:
        request = pb.JoinRequest(bundle=bundle)
        return self._call("Join", lambda t: self._stub.Join(request, timeout=t))

    def get_status(self, session_id: str = "") -> pb.SessionStatus:
        request = pb.GetStatusRequest(session_id=session_id)
        return self._call("GetStatus", lambda t: self._stub.GetStatus(request, timeout=t))

    def withdraw(self, session_id: str, round_index: int, reason: str) -> pb.WithdrawReceipt:
        """Tell the coordinator this node stops before uploading ``round_index``, and why.

        The coordinator drops the node from that round at once, as the round
        deadline would have (see coordinator/withdraw.py); it refuses with
        FAILED_PRECONDITION once the node has uploaded the round. ``reason`` is
        shown to every node, so it must be a sentence without data (at most
        1000 characters).
        """
        request = pb.WithdrawRequest(
            session_id=session_id, node_id=self.node_id, round_index=round_index, reason=reason
        )
        return self._call("Withdraw", lambda t: self._stub.Withdraw(request, timeout=t))

    def get_roster(self, session_id: str) -> pb.Roster:
        request = pb.GetRosterRequest(session_id=session_id, node_id=self.node_id)
        return self._call("GetRoster", lambda t: self._stub.GetRoster(request, timeout=t))

    def upload(
        self,
        *,
        session_id: str,
        round_index: int,
        round_name: str,
        payload: NDArray[np.uint64],
        layout: Layout,
        fixed_point_bits: int,
        roster_hash: bytes,
        statement_signature: bytes,
    ) -> pb.UploadReceipt:
        """Stream a payload with its signed upload statement (see node/statements.py).

        ``roster_hash`` is the hash of the roster this node verified,
        ``statement_signature`` its identity signature over the statement for
        exactly this session, round, roster and payload.
        """
        header = pb.UploadHeader(
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            node_id=self.node_id,
            payload=payload_header(payload, layout, fixed_point_bits),
            roster_hash=roster_hash,
            statement_signature=statement_signature,
        )

        def messages() -> Iterator[pb.UploadChunk]:
            yield pb.UploadChunk(header=header)
            for chunk in payload_chunks(payload):
                yield pb.UploadChunk(data=chunk)

        receipt: pb.UploadReceipt = self._call(
            "UploadEgress", lambda t: self._stub.UploadEgress(messages(), timeout=t)
        )
        self._uploaded[(session_id, round_index)] = bytes(header.payload.sha256)
        return receipt

    def uploaded_sha256(self, session_id: str, round_index: int) -> bytes | None:
        """SHA-256 of the payload this client uploaded for a round; None if it sent none.

        None also for a round uploaded before a restart, by an earlier client.
        """
        return self._uploaded.get((session_id, round_index))

    def get_result(
        self, session_id: str, round_index: int
    ) -> tuple[pb.ResultHeader, NDArray[np.uint64] | None]:
        """The round's status; with status READY also the aggregate (checked against its hash).

        The header carries, when READY, the upload statements of every node
        counted (``header.statements``), for node.statements.check_statements.
        """
        request = pb.GetResultRequest(
            session_id=session_id, round_index=round_index, node_id=self.node_id
        )

        def attempt(timeout: float) -> tuple[pb.ResultHeader, NDArray[np.uint64] | None]:
            stream = iter(self._stub.GetResult(request, timeout=timeout))
            first = next(stream, None)
            if first is None or not first.HasField("header"):
                raise CoordinatorError(
                    "GetResult",
                    grpc.StatusCode.INTERNAL,
                    "the result stream did not start with a header",
                )
            header = first.header
            chunks = (message.data for message in stream if message.HasField("data"))
            if header.status != pb.ROUND_STATUS_READY:
                for _ in chunks:  # none are sent; drain the stream all the same
                    pass
                return header, None
            what = f"aggregate of round {round_index}"
            try:
                # Chunks go into the assembler as they arrive, never held as a list.
                return header, assemble_payload(header.payload, chunks, what=what)
            except PayloadError as error:
                raise CoordinatorError("GetResult", grpc.StatusCode.DATA_LOSS, str(error)) from None

        return self._call("GetResult", attempt)

    def get_unmask_request(self, session_id: str, round_index: int) -> pb.UnmaskRequest:
        request = pb.GetUnmaskRequestRequest(
            session_id=session_id, round_index=round_index, node_id=self.node_id
        )
        return self._call(
            "GetUnmaskRequest", lambda t: self._stub.GetUnmaskRequest(request, timeout=t)
        )

    def attest_survivors(
        self, *, session_id: str, round_index: int, survivor_hash: bytes, signature: bytes
    ) -> pb.AttestationReceipt:
        request = pb.SurvivorAttestation(
            session_id=session_id,
            round_index=round_index,
            node_id=self.node_id,
            survivor_hash=survivor_hash,
            signature=signature,
        )
        return self._call(
            "AttestSurvivors", lambda t: self._stub.AttestSurvivors(request, timeout=t)
        )

    def submit_unmask(
        self,
        *,
        request: pb.UnmaskRequest,
        payload: NDArray[np.uint64],
        layout: Layout,
        fixed_point_bits: int,
    ) -> pb.UnmaskReceipt:
        header = pb.UnmaskHeader(
            session_id=request.session_id,
            round_index=request.round_index,
            round_name=request.round_name,
            node_id=self.node_id,
            dropped_node_ids=list(request.dropped_node_ids),
            survivor_hash=request.survivor_hash,
            payload=payload_header(payload, layout, fixed_point_bits),
        )

        def messages() -> Iterator[pb.UnmaskChunk]:
            yield pb.UnmaskChunk(header=header)
            for chunk in payload_chunks(payload):
                yield pb.UnmaskChunk(data=chunk)

        return self._call("SubmitUnmask", lambda t: self._stub.SubmitUnmask(messages(), timeout=t))

    def refuse_unmask(self, *, request: pb.UnmaskRequest, reason: str) -> pb.UnmaskReceipt:
        refusal = pb.UnmaskRefusal(
            session_id=request.session_id,
            round_index=request.round_index,
            node_id=self.node_id,
            dropped_node_ids=list(request.dropped_node_ids),
            survivor_hash=request.survivor_hash,
            reason=reason,
        )
        return self._call(
            "SubmitUnmask",
            lambda t: self._stub.SubmitUnmask(iter([pb.UnmaskChunk(refusal=refusal)]), timeout=t),
        )
