"""Plain dataclasses the session state machine takes and returns.

They mirror the messages of proto/zerosum/v1/session.proto field for field
where it matters, but carry no protobuf or gRPC types, so the state machine
can be tested without a network; coordinator/wire.py translates them for
the servicer of coordinator/server.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coordinator.layout import PayloadSpec, TensorSlot
from noise.keys import KeyBundle

__all__ = [
    "Attestation",
    "AttestationReceipt",
    "DroppedNode",
    "JoinReceipt",
    "ResultView",
    "RosterView",
    "RoundDeadline",
    "RoundStatus",
    "RoundSummary",
    "SealedContribution",
    "SealedTags",
    "SessionState",
    "StatusView",
    "UnmaskHeader",
    "UnmaskReceipt",
    "UnmaskRefusal",
    "UnmaskRequestView",
    "UploadHeader",
    "UploadReceipt",
    "UploadStatement",
    "WithdrawReceipt",
    "WithdrawRequest",
]


class SessionState:
    """Session states as stored (the proto's ABORTED is stored as 'failed')."""

    JOINING = "joining"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class RoundStatus:
    """Round statuses as stored.

    'superseded' marks a CAPE model round rerun after a dropout; on the wire
    it is ROUND_STATUS_FAILED with a reason naming the rerun.
    """

    OPEN = "open"
    UNMASK = "unmask"
    READY = "ready"
    FAILED = "failed"
    SUPERSEDED = "superseded"


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class SealedContribution:
    """A challenge contribution sealed by ``sender`` for ``recipient`` (opaque, 48 bytes).

    ``signature``: the sender's identity signature over it
    (``noise.transcript.sealed_check_message``, kind "contribution").
    """

    sender: str
    recipient: str
    sealed: bytes
    signature: bytes = b""


@dataclass(frozen=True)
class SealedTags:
    """Aggregate-check tags sealed by ``sender`` for ``recipient`` (opaque, 80 bytes).

    ``signature``: the sender's identity signature over them, bound to the
    survivor-set hash (``noise.transcript.sealed_check_message``, kind "tags").
    """

    sender: str
    recipient: str
    sealed: bytes
    signature: bytes


@dataclass(frozen=True)
class UploadHeader:
    """First message of an upload stream, with the node's signed upload statement.

    ``statement_signature`` is the node's Ed25519 identity signature over
    ``noise.transcript.upload_statement_message(config hash, session_id,
    round_index, round_name, roster_hash, payload.sha256)``.
    """

    session_id: str
    round_index: int
    round_name: str
    node_id: str
    payload: PayloadSpec
    roster_hash: bytes
    statement_signature: bytes
    self_mask_commitment: bytes
    challenge: tuple[SealedContribution, ...] = ()


@dataclass(frozen=True)
class Attestation:
    """A survivor's Ed25519 signature over an unmask attempt's survivor hash.

    ``tags``: its aggregate-check tags, sealed for every other survivor.
    """

    session_id: str
    round_index: int
    node_id: str
    survivor_hash: bytes
    signature: bytes
    tags: tuple[SealedTags, ...] = ()


@dataclass(frozen=True)
class UnmaskHeader:
    """First message of an unmask answer: the request it answers, the seed, the corrections.

    ``payload`` describes the pair terms with the dropped nodes that follow;
    None when nobody dropped (the answer is then ``self_mask_seed`` alone).
    """

    session_id: str
    round_index: int
    round_name: str
    node_id: str
    dropped: tuple[str, ...]
    survivor_hash: bytes
    payload: PayloadSpec | None
    self_mask_seed: bytes


@dataclass(frozen=True)
class UnmaskRefusal:
    """A survivor's refusal to answer an unmask request, and why.

    ``accused``: the survivor the refusal names as its cause (its signed
    sealed message does not open for the refusing node), or empty.
    """

    session_id: str
    round_index: int
    node_id: str
    dropped: tuple[str, ...]
    survivor_hash: bytes
    reason: str
    accused: str = ""


@dataclass(frozen=True)
class WithdrawRequest:
    """A node stopping on purpose before it uploaded ``round_index``, and why."""

    session_id: str
    round_index: int
    node_id: str
    reason: str


# ---------------------------------------------------------------- answers


@dataclass(frozen=True)
class JoinReceipt:
    """Answer to a join."""

    session_id: str
    node_id: str
    rejoined: bool
    joined_count: int
    federation_size: int
    join_deadline_ms: int


@dataclass(frozen=True)
class RoundDeadline:
    """When a round's uploads are due."""

    round_index: int
    round_name: str
    deadline_ms: int


@dataclass(frozen=True)
class RosterView:
    """Every joined node's signed key, and whether the roster can still change."""

    session_id: str
    config_hash: bytes
    bundles: tuple[KeyBundle, ...]
    version: int
    roster_hash: bytes
    final: bool
    join_deadline_ms: int
    excluded: tuple[str, ...]
    round_deadline_seconds: float
    round_deadlines: tuple[RoundDeadline, ...]


@dataclass(frozen=True)
class UploadReceipt:
    """Answer to an upload (``duplicate`` when the same payload was stored before)."""

    session_id: str
    round_index: int
    node_id: str
    sha256: bytes
    received_bytes: int
    duplicate: bool
    received_ms: int
    submitted_count: int
    expected_count: int


@dataclass(frozen=True)
class UploadStatement:
    """A stored upload's signed statement, handed back with the aggregate that counts it."""

    node_id: str
    round_name: str
    roster_hash: bytes
    payload_sha256: bytes
    signature: bytes


@dataclass(frozen=True)
class UnmaskRequestView:
    """What the coordinator asks of one survivor (``pending`` False: nothing)."""

    session_id: str
    round_index: int
    round_name: str
    pending: bool
    dropped: tuple[str, ...] = ()
    survivors: tuple[str, ...] = ()
    survivor_hash: bytes = b""
    attestations: tuple[Attestation, ...] = ()
    tensors: tuple[TensorSlot, ...] = ()
    fixed_point_bits: int = 0
    deadline_ms: int = 0
    min_survivors: int = 0
    attempt: int = 0
    challenge: tuple[SealedContribution, ...] = ()
    tags: tuple[SealedTags, ...] = ()  # sealed for this survivor by those that attested


@dataclass(frozen=True)
class ResultView:
    """A round's status; when READY, also the aggregate's header and stored file.

    ``survivors``: READY, the nodes summed; AWAITING_UNMASK, the current S;
    OPEN, the round's participants (the nodes expected to upload). ``dropped``:
    the participants left out (READY) or the current D (AWAITING_UNMASK).
    ``statements``: READY only, the upload statement of every survivor.
    """

    session_id: str
    round_index: int
    round_name: str
    status: str
    reason: str
    deadline_ms: int
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    survivor_hash: bytes
    payload: PayloadSpec | None
    path: Path | None
    unmask_request: UnmaskRequestView | None
    statements: tuple[UploadStatement, ...] = ()
    tags: tuple[SealedTags, ...] = ()  # READY: every other survivor's tags sealed for the caller


@dataclass(frozen=True)
class AttestationReceipt:
    """Answer to an attestation."""

    attested_count: int
    survivor_count: int


@dataclass(frozen=True)
class UnmaskReceipt:
    """Answer to a correction or a refusal."""

    session_id: str
    round_index: int
    node_id: str
    accepted: bool
    duplicate: bool
    sha256: bytes
    received_count: int
    survivor_count: int


@dataclass(frozen=True)
class RoundSummary:
    """One round in a status report."""

    round_index: int
    round_name: str
    status: str
    submitted: tuple[str, ...]
    dropped: tuple[str, ...]
    deadline_ms: int
    reason: str


@dataclass(frozen=True)
class DroppedNode:
    """A node dropped from the session: the round it left and why."""

    node_id: str
    round_index: int
    reason: str


@dataclass(frozen=True)
class WithdrawReceipt:
    """Answer to a withdrawal: who is dropped from the round now, and the session's state."""

    session_id: str
    round_index: int
    node_id: str
    dropped: tuple[str, ...]
    state: str


@dataclass(frozen=True)
class StatusView:
    """Where the session is."""

    session_id: str
    state: str
    config_hash: bytes
    federation_id: str
    current_round_index: int
    current_round_name: str
    joined: tuple[str, ...]
    submitted: tuple[str, ...]
    excluded: tuple[str, ...]
    reason: str
    join_deadline_ms: int
    min_nodes: int
    rounds: tuple[RoundSummary, ...]
    dropped_nodes: tuple[DroppedNode, ...] = ()
