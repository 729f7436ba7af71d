"""How a node speaks to the coordinator: one small interface, plain values in and out.

The session code never touches protobuf or gRPC status codes. It calls a
:class:`CoordinatorGateway`, which returns the plain messages of
``proto.messages`` (the same types the coordinator returns) and
raises :class:`~node.errors.GatewayError` subclasses (``CoordinatorRefused``,
``AlreadyJoined``, ``CoordinatorUnreachable``). ``node.protocol.client.GrpcGateway``
is the real one, over mutual TLS; an in-process gateway over a coordinator
object serves tests (``zerosum.inprocess``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from noise.keys import KeyBundle
from noise.layout import Layout
from proto.messages import (
    U64,
    JoinReceipt,
    RosterView,
    RoundResult,
    Sealed,
    SessionStatus,
    UnmaskRequest,
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
    ) -> UploadReceipt: ...

    def uploaded_sha256(self, session_id: str, round_index: int) -> bytes | None:
        """The digest of the payload this gateway uploaded for a round, if it did."""
        ...

    def result(self, session_id: str, round_index: int) -> RoundResult: ...

    def attest(
        self,
        *,
        session_id: str,
        round_index: int,
        survivor_hash: bytes,
        signature: bytes,
        tags: Sequence[Sealed],
    ) -> None: ...

    def submit_unmask(
        self,
        *,
        request: UnmaskRequest,
        self_mask_seed: bytes,
        payload: U64 | None,
        layout: Layout,
        fixed_point_bits: int,
    ) -> None: ...

    def refuse_unmask(self, *, request: UnmaskRequest, reason: str, accused: str = "") -> None:
        """Refuse ``request``; ``accused``: the survivor whose signed sealed message is why."""
        ...

    def withdraw(self, session_id: str, round_index: int, reason: str) -> WithdrawReceipt: ...

    def close(self) -> None: ...
