"""A node's gateway to a coordinator in the same process: the real session, no network.

:class:`InProcessGateway` implements ``node.gateway.CoordinatorGateway`` by
calling a ``coordinator.session.Session`` directly, with the node's id as the
authenticated caller (what the TLS layer proves over gRPC). Payloads go through
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
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from coordinator.errors import CoordinatorError
from coordinator.layout import PayloadSpec
from coordinator.messages import (
    Attestation as CoordinatorAttestation,
)
from coordinator.messages import (
    SealedContribution,
    SealedTags,
    UnmaskHeader,
    UnmaskReceipt,
    UnmaskRefusal,
    UploadHeader,
    WithdrawRequest,
)
from coordinator.messages import (
    UploadReceipt as CoordinatorUploadReceipt,
)
from coordinator.session import Session, Ticket
from node.errors import AlreadyJoined, CoordinatorRefused
from node.gateway import (
    Attestation,
    DroppedNode,
    JoinReceipt,
    RosterView,
    RoundResult,
    RoundState,
    RoundSummary,
    Sealed,
    SessionState,
    SessionStatus,
    UnmaskRequest,
    UploadReceipt,
    UploadStatement,
    WithdrawReceipt,
)
from noise.keys import KeyBundle
from noise.layout import Layout, payload_digest
from proto.chunks import CHUNK_BYTES, payload_chunks

__all__ = ["InProcessGateway", "Ticker"]


def _sealed(tags: Sequence[SealedTags]) -> tuple[Sealed, ...]:
    return tuple(Sealed(t.sender, t.recipient, t.sealed, t.signature) for t in tags)


U64 = NDArray[np.uint64]
_R = TypeVar("_R")

_SESSION_STATES = {
    "joining": SessionState.JOINING,
    "running": SessionState.RUNNING,
    "completed": SessionState.COMPLETED,
    "failed": SessionState.ABORTED,
}
_ROUND_STATES = {
    "open": RoundState.OPEN,
    "unmask": RoundState.AWAITING_UNMASK,
    "ready": RoundState.READY,
    "failed": RoundState.FAILED,
    "superseded": RoundState.FAILED,
}


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
        self, ticket: Ticket | CoordinatorUploadReceipt | UnmaskReceipt, payload: U64
    ) -> CoordinatorUploadReceipt | UnmaskReceipt:
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
        return SessionStatus(
            session_id=view.session_id,
            state=_SESSION_STATES.get(view.state, SessionState.UNKNOWN),
            config_hash=view.config_hash,
            reason=view.reason,
            rounds=tuple(
                RoundSummary(
                    index=r.round_index,
                    name=r.round_name,
                    state=_ROUND_STATES.get(r.status, RoundState.UNKNOWN),
                    submitted=r.submitted,
                    dropped=r.dropped,
                    reason=r.reason,
                )
                for r in view.rounds
            ),
            joined=view.joined,
            dropped=tuple(
                DroppedNode(d.node_id, d.round_index, d.reason) for d in view.dropped_nodes
            ),
        )

    def join(self, bundle: KeyBundle) -> JoinReceipt:
        receipt = self._call("Join", lambda: self._session.join(bundle, caller=self._node_id))
        return JoinReceipt(
            rejoined=receipt.rejoined,
            joined_count=receipt.joined_count,
            federation_size=receipt.federation_size,
        )

    def roster(self, session_id: str) -> RosterView:
        view = self._call(
            "GetRoster", lambda: self._session.roster(session_id, caller=self._node_id)
        )
        return RosterView(
            session_id=view.session_id,
            config_hash=view.config_hash,
            bundles=view.bundles,
            roster_hash=view.roster_hash,
            final=view.final,
            excluded=view.excluded,
        )

    def upload(
        self,
        *,
        session_id: str,
        round_index: int,
        round_name: str,
        payload: U64,
        layout: Layout,
        fixed_point_bits: int,
        roster_hash: bytes,
        statement_signature: bytes,
        self_mask_commitment: bytes,
        challenge: Sequence[Sealed],
        payload_sha256: bytes | None = None,
    ) -> UploadReceipt:
        digest = payload_digest(payload) if payload_sha256 is None else payload_sha256
        header = UploadHeader(
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            node_id=self._node_id,
            payload=PayloadSpec(
                total_bytes=layout.nbytes,
                total_elements=layout.size,
                sha256=digest,
                fixed_point_bits=fixed_point_bits,
                tensors=layout.slots,
            ),
            roster_hash=roster_hash,
            statement_signature=statement_signature,
            self_mask_commitment=self_mask_commitment,
            challenge=tuple(
                SealedContribution(c.sender, c.recipient, c.sealed, c.signature) for c in challenge
            ),
        )

        def send() -> CoordinatorUploadReceipt | UnmaskReceipt:
            return self._stream(self._session.begin_upload(header, caller=self._node_id), payload)

        receipt = self._call("UploadEgress", send)
        assert isinstance(receipt, CoordinatorUploadReceipt)
        self._uploaded[(session_id, round_index)] = digest
        return UploadReceipt(
            duplicate=receipt.duplicate,
            submitted_count=receipt.submitted_count,
            expected_count=receipt.expected_count,
            sha256=receipt.sha256,
            received_bytes=receipt.received_bytes,
        )

    def uploaded_sha256(self, session_id: str, round_index: int) -> bytes | None:
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
            if payload_digest(aggregate) != view.payload.sha256:
                raise CoordinatorRefused(
                    "GetResult", "DATA_LOSS", "the stored aggregate does not match its digest"
                )
            self._session.record_delivery(round_index, self._node_id)
        request = None
        if view.unmask_request is not None and view.unmask_request.pending:
            r = view.unmask_request
            request = UnmaskRequest(
                session_id=r.session_id,
                round_index=r.round_index,
                round_name=r.round_name,
                dropped=r.dropped,
                survivors=r.survivors,
                survivor_hash=r.survivor_hash,
                attestations=tuple(
                    Attestation(a.node_id, a.survivor_hash, a.signature) for a in r.attestations
                ),
                min_survivors=r.min_survivors,
                challenge=tuple(
                    Sealed(c.sender, c.recipient, c.sealed, c.signature) for c in r.challenge
                ),
                tags=_sealed(r.tags),
            )
        return RoundResult(
            round_index=view.round_index,
            round_name=view.round_name,
            state=_ROUND_STATES.get(view.status, RoundState.UNKNOWN),
            reason=view.reason,
            survivors=view.survivors,
            dropped=view.dropped,
            statements=tuple(
                UploadStatement(
                    s.node_id, s.round_name, s.roster_hash, s.payload_sha256, s.signature
                )
                for s in view.statements
            ),
            aggregate=aggregate,
            layout=layout,
            unmask_request=request,
            tags=_sealed(view.tags),
        )

    def attest(
        self,
        *,
        session_id: str,
        round_index: int,
        survivor_hash: bytes,
        signature: bytes,
        tags: Sequence[Sealed],
    ) -> None:
        attestation = CoordinatorAttestation(
            session_id=session_id,
            round_index=round_index,
            node_id=self._node_id,
            survivor_hash=survivor_hash,
            signature=signature,
            tags=tuple(SealedTags(t.sender, t.recipient, t.sealed, t.signature) for t in tags),
        )
        self._call(
            "AttestSurvivors", lambda: self._session.attest(attestation, caller=self._node_id)
        )

    def submit_unmask(
        self,
        *,
        request: UnmaskRequest,
        self_mask_seed: bytes,
        payload: U64 | None,
        layout: Layout,
        fixed_point_bits: int,
    ) -> None:
        header = UnmaskHeader(
            session_id=request.session_id,
            round_index=request.round_index,
            round_name=request.round_name,
            node_id=self._node_id,
            dropped=request.dropped,
            survivor_hash=request.survivor_hash,
            payload=None
            if payload is None
            else PayloadSpec(
                total_bytes=layout.nbytes,
                total_elements=layout.size,
                sha256=payload_digest(payload),
                fixed_point_bits=fixed_point_bits,
                tensors=layout.slots,
            ),
            self_mask_seed=self_mask_seed,
        )

        def send() -> CoordinatorUploadReceipt | UnmaskReceipt:
            begun = self._session.begin_unmask(header, caller=self._node_id)
            if payload is None:
                assert not isinstance(begun, Ticket), "an answer without corrections has no stream"
                return begun
            return self._stream(begun, payload)

        self._call("SubmitUnmask", send)

    def refuse_unmask(self, *, request: UnmaskRequest, reason: str, accused: str = "") -> None:
        refusal = UnmaskRefusal(
            session_id=request.session_id,
            round_index=request.round_index,
            node_id=self._node_id,
            dropped=request.dropped,
            survivor_hash=request.survivor_hash,
            reason=reason,
            accused=accused,
        )
        self._call(
            "SubmitUnmask", lambda: self._session.refuse_unmask(refusal, caller=self._node_id)
        )

    def withdraw(self, session_id: str, round_index: int, reason: str) -> WithdrawReceipt:
        request = WithdrawRequest(
            session_id=session_id, round_index=round_index, node_id=self._node_id, reason=reason
        )
        receipt = self._call(
            "Withdraw", lambda: self._session.withdraw(request, caller=self._node_id)
        )
        return WithdrawReceipt(dropped=receipt.dropped)
