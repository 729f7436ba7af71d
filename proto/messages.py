"""What crosses the wire, as plain values: one frozen dataclass per message, both ends.

The coordinator's state machine returns these and the node's session code
reads them; neither sees protobuf. They mirror the messages of
``proto/zerosum/v1/session.proto`` field for field (times as ``*_ms``, node
id lists as tuples), and ``proto/convert.py`` is the one translation to and
from the generated stubs, in both directions. The in-process gateway
(``zerosum/inprocess.py``) hands them from one end to the other unchanged.

The two status enums carry the values the coordinator stores in its SQLite
file, so a stored state reads back as a member: a session that ended early is
ABORTED on the wire and 'failed' in the store, a round waiting for its
survivors is AWAITING_UNMASK and 'unmask'. UNKNOWN is what a node makes of a
status value newer than itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from noise.keys import KeyBundle
from noise.layout import Layout, TensorSlot
from noise.transcript import sealed_root

__all__ = [
    "U64",
    "Attestation",
    "AttestationReceipt",
    "DroppedNode",
    "JoinReceipt",
    "PayloadSpec",
    "ResultHeader",
    "ResultRequest",
    "RosterRequest",
    "RosterView",
    "RoundDeadline",
    "RoundResult",
    "RoundState",
    "RoundSummary",
    "Sealed",
    "SessionState",
    "SessionStatus",
    "StatusRequest",
    "UnmaskHeader",
    "UnmaskReceipt",
    "UnmaskRefusal",
    "UnmaskRequest",
    "UploadHeader",
    "UploadReceipt",
    "UploadStatement",
    "WithdrawReceipt",
    "WithdrawRequest",
]

U64 = NDArray[np.uint64]


class SessionState(StrEnum):
    """Where a session is (values as stored by the coordinator)."""

    UNKNOWN = "unknown"
    JOINING = "joining"
    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "failed"

    @property
    def ended(self) -> bool:
        return self in (SessionState.COMPLETED, SessionState.ABORTED)


class RoundState(StrEnum):
    """Where a round is (values as stored by the coordinator).

    SUPERSEDED marks a CAPE model round that is rerun after a dropout: it
    will not complete, and a node waits for the rerun, as after FAILED
    while the session goes on.
    """

    UNKNOWN = "unknown"
    OPEN = "open"
    AWAITING_UNMASK = "unmask"
    READY = "ready"
    FAILED = "failed"
    SUPERSEDED = "superseded"

    @property
    def given_up(self) -> bool:
        """True when the round will not complete (FAILED or SUPERSEDED)."""
        return self in (RoundState.FAILED, RoundState.SUPERSEDED)


@dataclass(frozen=True)
class PayloadSpec:
    """What a payload header promises: size, checksum, fixed-point scale and layout.

    ``tensors`` are the slots as received; ``coordinator.layout.validate_payload``
    makes a :class:`Layout` of them.
    """

    total_bytes: int
    total_elements: int
    digest: bytes
    fixed_point_bits: int
    tensors: tuple[TensorSlot, ...]


@dataclass(frozen=True)
class Sealed:
    """An aggregate-check message ``sender`` sealed for ``recipient``, signed by ``sender``.

    A challenge contribution (48 bytes sealed) or four blinded tags (80
    bytes); ``signature`` is the sender's one identity signature over
    everything of the kind it sealed in the call,
    ``noise.transcript.sealed_set_message`` (kind "contribution", or "tags"
    bound to the survivor-set hash) over the Merkle tree of its copies, the
    same on every copy. A relayed copy carries its place in that tree
    (``index`` of ``count`` leaves) and its audit ``path``, so its recipient
    can check that signature (:meth:`signed_root`); a sent one carries none
    (``count`` 0).
    """

    sender: str
    recipient: str
    sealed: bytes
    signature: bytes = b""
    index: int = 0
    count: int = 0
    path: tuple[bytes, ...] = ()

    def signed_root(self) -> bytes:
        """The root of the sender's tree this copy's audit path leads to.

        ValueError when the copy is empty or too long, or the place or path
        cannot be a proof (a sent copy's among them).
        """
        return sealed_root(
            self.recipient, self.sealed, index=self.index, count=self.count, path=self.path
        )


# ---------------------------------------------------------------- node -> coordinator


@dataclass(frozen=True)
class StatusRequest:
    """A node (or an operator) asking where a session is; empty: the current one."""

    session_id: str = ""


@dataclass(frozen=True)
class RosterRequest:
    """A node asking for the roster; ``node_id`` is the caller (its certificate's)."""

    session_id: str
    node_id: str


@dataclass(frozen=True)
class ResultRequest:
    """A node asking for a round's state and, when READY, its aggregate."""

    session_id: str
    round_index: int
    node_id: str


@dataclass(frozen=True)
class UploadHeader:
    """First message of an upload stream, with the node's signed upload statement.

    ``statement_signature`` is the node's Ed25519 identity signature over
    ``noise.transcript.upload_statement_message(config hash, session_id,
    round_index, round_name, roster_hash, payload.digest)``.
    """

    session_id: str
    round_index: int
    round_name: str
    node_id: str
    payload: PayloadSpec
    roster_hash: bytes
    statement_signature: bytes
    self_mask_commitment: bytes
    challenge: tuple[Sealed, ...] = ()


@dataclass(frozen=True)
class Attestation:
    """A survivor's Ed25519 signature over an unmask attempt's survivor hash.

    ``tags``: its aggregate-check tags, sealed for every other survivor
    (sent with the attestation; not repeated when the coordinator lists it).
    """

    node_id: str
    survivor_hash: bytes
    signature: bytes
    session_id: str = ""
    round_index: int = 0
    tags: tuple[Sealed, ...] = ()


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


# ---------------------------------------------------------------- coordinator -> node


@dataclass(frozen=True, kw_only=True)
class JoinReceipt:
    """Answer to a join (``rejoined``: the same session key again)."""

    rejoined: bool
    joined_count: int
    federation_size: int
    session_id: str = ""
    node_id: str = ""
    join_deadline_ms: int = 0


@dataclass(frozen=True)
class RoundDeadline:
    """When a round's uploads are due."""

    round_index: int
    round_name: str
    deadline_ms: int


@dataclass(frozen=True, kw_only=True)
class RosterView:
    """Every joined node's signed key (each still to be verified by a node), and whether
    the roster can still change."""

    session_id: str
    config_hash: bytes
    bundles: tuple[KeyBundle, ...]
    roster_hash: bytes
    final: bool
    excluded: tuple[str, ...]
    version: int = 0
    join_deadline_ms: int = 0
    round_deadline_seconds: float = 0.0
    round_deadlines: tuple[RoundDeadline, ...] = ()


@dataclass(frozen=True, kw_only=True)
class UploadReceipt:
    """Answer to an upload (``duplicate`` when the same payload was stored before).

    ``digest``: the payload's digest as the coordinator received it.
    """

    duplicate: bool
    submitted_count: int
    expected_count: int
    digest: bytes = b""
    received_bytes: int = 0
    session_id: str = ""
    round_index: int = 0
    node_id: str = ""
    received_ms: int = 0


@dataclass(frozen=True)
class UploadStatement:
    """A stored upload's signed statement, handed back with the aggregate that counts it."""

    node_id: str
    round_name: str
    roster_hash: bytes
    payload_digest: bytes
    signature: bytes


@dataclass(frozen=True, kw_only=True)
class UnmaskRequest:
    """What the coordinator asks of one survivor in a round's unmask step.

    ``pending`` False: nothing (the other fields are then empty).
    ``challenge``: the challenge contribution every other survivor sealed for
    this survivor, and ``tags`` the aggregate-check tags every survivor that
    attested sealed for it, for the round's aggregate check.
    """

    session_id: str
    round_index: int
    round_name: str
    pending: bool = True
    dropped: tuple[str, ...] = ()
    survivors: tuple[str, ...] = ()
    survivor_hash: bytes = b""
    attestations: tuple[Attestation, ...] = ()
    tensors: tuple[TensorSlot, ...] = ()
    fixed_point_bits: int = 0
    deadline_ms: int = 0
    min_survivors: int = 0
    attempt: int = 0
    challenge: tuple[Sealed, ...] = ()
    tags: tuple[Sealed, ...] = ()

    def answer(
        self, node_id: str, self_mask_seed: bytes, payload: PayloadSpec | None
    ) -> UnmaskHeader:
        """Survivor ``node_id``'s answer to this request (``payload``: its corrections')."""
        return UnmaskHeader(
            session_id=self.session_id,
            round_index=self.round_index,
            round_name=self.round_name,
            node_id=node_id,
            dropped=self.dropped,
            survivor_hash=self.survivor_hash,
            payload=payload,
            self_mask_seed=self_mask_seed,
        )

    def refusal(self, node_id: str, reason: str, accused: str = "") -> UnmaskRefusal:
        """Survivor ``node_id``'s refusal of this request, naming ``accused`` if a peer's fault."""
        return UnmaskRefusal(
            session_id=self.session_id,
            round_index=self.round_index,
            node_id=node_id,
            dropped=self.dropped,
            survivor_hash=self.survivor_hash,
            reason=reason,
            accused=accused,
        )


@dataclass(frozen=True, kw_only=True)
class ResultHeader:
    """First message of a result stream: the round's state and, when READY, what follows.

    ``payload``: READY only, the header of the aggregate the stream goes on
    with. ``unmask_request``: AWAITING_UNMASK only, when the caller is a
    survivor whose answer is still needed. The other fields as in
    :class:`RoundResult`, which is what a node makes of this header and the
    aggregate after it.
    """

    session_id: str
    round_index: int
    round_name: str
    state: RoundState
    reason: str = ""
    deadline_ms: int = 0
    survivors: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    survivor_hash: bytes = b""
    payload: PayloadSpec | None = None
    unmask_request: UnmaskRequest | None = None
    statements: tuple[UploadStatement, ...] = ()
    tags: tuple[Sealed, ...] = ()


@dataclass(frozen=True)
class RoundResult:
    """A round's state as a node receives it; when READY with its aggregate and the
    statements counted in it.

    ``survivors``: READY, the nodes summed; AWAITING_UNMASK, the current S.
    ``dropped``: the participants left out (READY) or the current D.
    ``tags``: READY, the tags every other survivor sealed for this node.
    """

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
    tags: tuple[Sealed, ...] = ()

    @classmethod
    def of(
        cls, header: ResultHeader, *, aggregate: U64 | None = None, layout: Layout | None = None
    ) -> RoundResult:
        """What a node makes of ``header`` and the aggregate that followed it (READY only).

        An unmask request that is not pending is no request.
        """
        pending = header.unmask_request
        return cls(
            round_index=header.round_index,
            round_name=header.round_name,
            state=header.state,
            reason=header.reason,
            survivors=header.survivors,
            dropped=header.dropped,
            statements=header.statements,
            aggregate=aggregate,
            layout=layout,
            unmask_request=pending if pending is not None and pending.pending else None,
            tags=header.tags,
        )


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
    digest: bytes
    received_count: int
    survivor_count: int


@dataclass(frozen=True)
class RoundSummary:
    """One round in a status report."""

    index: int
    name: str
    state: RoundState
    submitted: tuple[str, ...]
    dropped: tuple[str, ...]
    reason: str = ""
    deadline_ms: int = 0


@dataclass(frozen=True)
class DroppedNode:
    """A node dropped from the session: the round it left and why."""

    node_id: str
    round_index: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class WithdrawReceipt:
    """Answer to a withdrawal: who is dropped from the round now, and the session's state."""

    dropped: tuple[str, ...]
    session_id: str = ""
    round_index: int = 0
    node_id: str = ""
    state: SessionState = SessionState.UNKNOWN


@dataclass(frozen=True, kw_only=True)
class SessionStatus:
    """Where the session is: its state, the rounds opened so far and who dropped."""

    session_id: str
    state: SessionState
    config_hash: bytes
    reason: str
    rounds: tuple[RoundSummary, ...]
    joined: tuple[str, ...] = ()
    dropped: tuple[DroppedNode, ...] = ()
    federation_id: str = ""
    current_round_index: int = 0
    current_round_name: str = ""
    submitted: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    join_deadline_ms: int = 0
    min_nodes: int = 0

    @property
    def current(self) -> RoundSummary | None:
        """The latest round opened, if any."""
        return self.rounds[-1] if self.rounds else None

    def participants(self, round_index: int, roster: Sequence[str]) -> tuple[str, ...]:
        """The roster minus every node dropped from a round before ``round_index``."""
        gone = {n for r in self.rounds if r.index < round_index for n in r.dropped}
        return tuple(n for n in roster if n not in gone)
