"""A node's gateway to a coordinator in the same process: the real session, no network.

:class:`InProcessGateway` implements ``node.protocol.gateway.CoordinatorGateway`` by
calling a ``coordinator.session.Session`` directly, with the node's id as the
authenticated caller (what the TLS layer proves over gRPC). Both ends speak
the plain messages of ``proto.messages``, so requests and answers pass through
unchanged; only a result's stored aggregate file is read into memory here. Payloads go through
the same chunked path as over the wire (``proto.chunks``), and a refusal of
the coordinator raises the same ``CoordinatorRefused`` with the same status
name and sentence. Tests and demonstrations run whole sessions with it, many
nodes in threads, without certificates or sockets; deadlines still need the
coordinator's ``tick``, which :class:`Ticker` calls in the background.

This module imports both node and coordinator, which only the ``zerosum``
package may do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from coordinator.errors import CoordinatorError
from coordinator.session import Session, Ticket
from node.errors import AlreadyJoined, CoordinatorRefused
from noise.keys import KeyBundle
from noise.layout import Layout, payload_digest
from proto.chunks import CHUNK_BYTES, payload_chunks
from proto.messages import (
    Attestation,
    JoinReceipt,
    RosterView,
    RoundResult,
    SessionStatus,
    UnmaskHeader,
    UnmaskReceipt,
    UnmaskRefusal,
    UploadHeader,
    UploadReceipt,
    WithdrawReceipt,
    WithdrawRequest,
)

__all__ = ["InProcessGateway", "Ticker"]


U64 = NDArray[np.uint64]
_R = TypeVar("_R")


class Ticker(threading.Thread):
    """Applies the session's deadlines every ``seconds`` until stopped (as the server does)."""

    def __init__(self, session: Session, seconds: float = 0.05) -> None:
        super().__init__(name="zerosum-ticker", daemon=True)
        self._session = session
        self._seconds = seconds
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self._seconds):
            self._session.tick()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


class InProcessGateway:
    """``CoordinatorGateway`` over a coordinator ``Session`` object (see the module docstring)."""

    def __init__(self, session: Session, node_id: str) -> None:
        self._session = session
        self._node_id = node_id
        self._uploaded: dict[tuple[str, int], bytes] = {}

    @property
    def node_id(self) -> str:
        return self._node_id

    def close(self) -> None:
        return None

    def _call(self, method: str, action: Callable[[], _R]) -> _R:
        try:
            return action()
        except CoordinatorError as error:
            kind = CoordinatorRefused
            if method == "Join" and error.status == "ALREADY_EXISTS":
                kind = AlreadyJoined
            raise kind(method, error.status, error.sentence) from None

    def _stream(
        self, ticket: Ticket | UploadReceipt | UnmaskReceipt, payload: U64
    ) -> UploadReceipt | UnmaskReceipt:
        if not isinstance(ticket, Ticket):
            return ticket  # answered at once (a duplicate)
        try:
            for chunk in payload_chunks(payload, CHUNK_BYTES):
                self._session.receive(ticket, chunk.offset, chunk.data)
            return self._session.finish(ticket)
        finally:
            self._session.abandon(ticket)

    def status(self, session_id: str = "") -> SessionStatus:
        view = self._call(
            "GetStatus", lambda: self._session.status(session_id, caller=self._node_id)
        )
        return view

    def join(self, bundle: KeyBundle) -> JoinReceipt:
        receipt = self._call("Join", lambda: self._session.join(bundle, caller=self._node_id))
        return receipt

    def roster(self, session_id: str) -> RosterView:
        view = self._call(
            "GetRoster", lambda: self._session.roster(session_id, caller=self._node_id)
        )
        return view

    def upload(self, header: UploadHeader, payload: U64) -> UploadReceipt:
        def send() -> UploadReceipt | UnmaskReceipt:
            return self._stream(self._session.begin_upload(header, caller=self._node_id), payload)

        receipt = self._call("UploadEgress", send)
        assert isinstance(receipt, UploadReceipt)
        self._uploaded[(header.session_id, header.round_index)] = header.payload.digest
        return receipt

    def uploaded_digest(self, session_id: str, round_index: int) -> bytes | None:
        return self._uploaded.get((session_id, round_index))

    def result(self, session_id: str, round_index: int) -> RoundResult:
        view = self._call(
            "GetResult",
            lambda: self._session.result(session_id, round_index, caller=self._node_id),
        )
        aggregate = None
        layout = None
        if view.path is not None and view.payload is not None:
            aggregate = np.frombuffer(view.path.read_bytes(), dtype="<u8").astype(np.uint64)
            layout = Layout(view.payload.tensors)
            if payload_digest(aggregate) != view.payload.digest:
                raise CoordinatorRefused(
                    "GetResult", "DATA_LOSS", "the stored aggregate does not match its digest"
                )
            self._session.record_delivery(round_index, self._node_id)
        return RoundResult.of(view.header(), aggregate=aggregate, layout=layout)

    def attest(self, attestation: Attestation) -> None:
        self._call(
            "AttestSurvivors", lambda: self._session.attest(attestation, caller=self._node_id)
        )

    def submit_unmask(self, header: UnmaskHeader, payload: U64 | None) -> None:
        def send() -> UploadReceipt | UnmaskReceipt:
            begun = self._session.begin_unmask(header, caller=self._node_id)
            if payload is None:
                assert not isinstance(begun, Ticket), "an answer without corrections has no stream"
                return begun
            return self._stream(begun, payload)

        self._call("SubmitUnmask", send)

    def refuse_unmask(self, refusal: UnmaskRefusal) -> None:
        self._call(
            "SubmitUnmask", lambda: self._session.refuse_unmask(refusal, caller=self._node_id)
        )

    def withdraw(self, session_id: str, round_index: int, reason: str) -> WithdrawReceipt:
        request = WithdrawRequest(
            session_id=session_id, round_index=round_index, node_id=self._node_id, reason=reason
        )
        receipt: WithdrawReceipt = self._call(
            "Withdraw", lambda: self._session.withdraw(request, caller=self._node_id)
        )
        return receipt
