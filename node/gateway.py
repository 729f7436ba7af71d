"""How a node speaks to the coordinator: one small interface, plain values in and out.

The session code never touches protobuf or gRPC status codes. It calls a
:class:`CoordinatorGateway`, which returns the frozen dataclasses below and
raises :class:`~node.errors.GatewayError` subclasses (``CoordinatorRefused``,
``AlreadyJoined``, ``CoordinatorUnreachable``). ``node.client.GrpcGateway``
is the real one, over mutual TLS; an in-process gateway over a coordinator
object serves tests (``zerosum.inprocess``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from noise.keys import KeyBundle
from noise.layout import Layout

__all__ = [
    "Attestation",
    "CoordinatorGateway",
    "DroppedNode",
    "JoinReceipt",
    "RosterView",
    "RoundResult",
    "RoundState",
    "RoundSummary",
    "Sealed",
    "SessionState",
    "SessionStatus",
    "UnmaskRequest",
    "UploadReceipt",
    "UploadStatement",
    "WithdrawReceipt",
]

U64 = NDArray[np.uint64]


class SessionState(StrEnum):
    """Where a session is."""

    UNKNOWN = "unknown"
    JOINING = "joining"
    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"

    @property
    def ended(self) -> bool:
        return self in (SessionState.COMPLETED, SessionState.ABORTED)


class RoundState(StrEnum):
    """Where a round is."""

    UNKNOWN = "unknown"
    OPEN = "open"
    AWAITING_UNMASK = "awaiting-unmask"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class JoinReceipt:
    """The coordinator took this node's session key (``rejoined``: the same key again)."""

    rejoined: bool
    joined_count: int
    federation_size: int


@dataclass(frozen=True)
class RosterView:
    """The roster as the coordinator shows it (every bundle still to be verified)."""

    session_id: str
    config_hash: bytes
    bundles: tuple[KeyBundle, ...]
    roster_hash: bytes
    final: bool
    excluded: tuple[str, ...]


@dataclass(frozen=True)
class RoundSummary:
    """One round as ``GetStatus`` lists it."""

    index: int
    name: str
    state: RoundState
    submitted: tuple[str, ...]
    dropped: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class DroppedNode:
    node_id: str
    round_index: int
    reason: str


@dataclass(frozen=True)
class SessionStatus:
    """Where the session is: its id, state, the rounds opened so far and who dropped."""

    session_id: str
    state: SessionState
    config_hash: bytes
    reason: str
    rounds: tuple[RoundSummary, ...]
    joined: tuple[str, ...] = ()
    dropped: tuple[DroppedNode, ...] = ()

    @property
    def current(self) -> RoundSummary | None:
        """The latest round opened, if any."""
        return self.rounds[-1] if self.rounds else None

    def participants(self, round_index: int, roster: Sequence[str]) -> tuple[str, ...]:
        """The roster minus every node dropped from a round before ``round_index``."""
        gone = {n for r in self.rounds if r.index < round_index for n in r.dropped}
        return tuple(n for n in roster if n not in gone)


@dataclass(frozen=True)
class UploadReceipt:
    duplicate: bool
    submitted_count: int
    expected_count: int
    sha256: bytes = b""  # the payload's digest as the coordinator received it
    received_bytes: int = 0


@dataclass(frozen=True)
class UploadStatement:
    """A node's signed statement about one upload, as returned with an aggregate."""

    node_id: str
    round_name: str
    roster_hash: bytes
    payload_sha256: bytes
    signature: bytes


@dataclass(frozen=True)
class Sealed:
    """An aggregate-check message ``sender`` sealed for ``recipient``, signed by ``sender``.

    A challenge contribution (48 bytes sealed) or four blinded tags (80
    bytes); ``signature`` is the sender's identity signature over
    ``noise.transcript.sealed_check_message``.
    """

    sender: str
    recipient: str
    sealed: bytes
    signature: bytes


@dataclass(frozen=True)
class Attestation:
    """A survivor's identity signature over a survivor-set hash."""

    node_id: str
    survivor_hash: bytes
    signature: bytes


@dataclass(frozen=True)
class UnmaskRequest:
    """What the coordinator asks of this node in a round's unmask step.

    ``challenge``: the challenge contribution every other survivor sealed for
    this node, and ``tags`` the aggregate-check tags every survivor that
    attested sealed for it, for the round's aggregate check.
    """

    session_id: str
    round_index: int
    round_name: str
    dropped: tuple[str, ...]
    survivors: tuple[str, ...]
    survivor_hash: bytes
    attestations: tuple[Attestation, ...]
    min_survivors: int
    challenge: tuple[Sealed, ...] = ()
    tags: tuple[Sealed, ...] = ()


@dataclass(frozen=True)
class RoundResult:
    """A round's state; when READY with its aggregate and the statements counted in it."""

    round_index: int
    round_name: str
    state: RoundState
    reason: str
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    statements: tuple[UploadStatement, ...] = ()
    aggregate: U64 | None = None
    layout: Layout | None = None  # the aggregate's layout as announced
    unmask_request: UnmaskRequest | None = None
    tags: tuple[Sealed, ...] = ()  # READY: the tags every other survivor sealed for this node


@dataclass(frozen=True)
class WithdrawReceipt:
    dropped: tuple[str, ...]


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
