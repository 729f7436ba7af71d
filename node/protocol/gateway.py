"""How a node speaks to the coordinator: one small interface, plain values in and out.

The session code never touches protobuf or gRPC status codes. It calls a
:class:`CoordinatorGateway` with the plain messages of ``proto.messages`` it
builds itself, and gets back the plain messages the coordinator returns and
raises :class:`~node.errors.GatewayError` subclasses (``CoordinatorRefused``,
``AlreadyJoined``, ``CoordinatorUnreachable``). ``node.protocol.client.GrpcGateway``
is the real one, over mutual TLS; an in-process gateway over a coordinator
object serves tests (``zerosum.inprocess``).
"""

from __future__ import annotations

from typing import Protocol

from noise.keys import KeyBundle
from proto.messages import (
    U64,
    Attestation,
    JoinReceipt,
    RosterView,
    RoundResult,
    SessionStatus,
    UnmaskHeader,
    UnmaskRefusal,
    UploadHeader,
    UploadReceipt,
    WithdrawReceipt,
)

__all__ = ["CoordinatorGateway"]


class CoordinatorGateway(Protocol):
    """Every call a node makes to the coordinator (see the module docstring)."""

    @property
    def node_id(self) -> str: ...

    def status(self, session_id: str = "") -> SessionStatus: ...

    def join(self, bundle: KeyBundle) -> JoinReceipt: ...

    def roster(self, session_id: str) -> RosterView: ...

    def upload(self, header: UploadHeader, payload: U64) -> UploadReceipt:
        """Stream ``payload`` after ``header`` (its payload header names the digest)."""
        ...

    def uploaded_digest(self, session_id: str, round_index: int) -> bytes | None:
        """The digest of the payload this gateway uploaded for a round, if it did."""
        ...

    def result(self, session_id: str, round_index: int) -> RoundResult: ...

    def attest(self, attestation: Attestation) -> None: ...

    def submit_unmask(self, header: UnmaskHeader, payload: U64 | None) -> None:
        """Send an unmask answer; ``payload``: its corrections, when its header has a payload."""
        ...

    def refuse_unmask(self, refusal: UnmaskRefusal) -> None:
        """Refuse an unmask request; ``refusal.accused``: the survivor whose signed sealed
        message is why, if one is."""
        ...

    def withdraw(self, session_id: str, round_index: int, reason: str) -> WithdrawReceipt: ...

    def close(self) -> None: ...
