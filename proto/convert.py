"""The one translation between the protobuf stubs and the plain types of proto/messages.py.

Both ends use it: the node's gRPC gateway (node/protocol/client.py) writes
its requests with the ``*_to_pb`` functions and the coordinator's servicer
(coordinator/server.py) reads them with the matching ``*_from_pb``; the
servicer writes its answers with ``*_to_pb`` and the gateway reads them back
with ``*_from_pb``. So every message has both directions here, and
tests/proto/test_convert.py round-trips them; neither end sets a field of a
stub by hand. Field for field, one function per message and direction; the
streams (an upload, an unmask answer) are framed here too, their payload
cut by ``proto.chunks``. Only this module, ``proto.chunks`` (the payload streams), the
gRPC client and the server import the generated stubs
(tests/house/test_import_rules.py). A message that cannot be
read (a malformed key bundle) raises :class:`~proto.errors.MalformedMessage`.

Status names: the enums of proto/messages.py map one to one onto the
proto's (ROUND_STATUS_SUPERSEDED included); a status value a node does not
know reads as UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from noise.errors import KeyFormatError
from noise.keys import KeyBundle
from noise.layout import Layout, TensorSlot
from proto.chunk_wire import encoded_chunks
from proto.chunks import tensor_layouts
from proto.errors import MalformedMessage
from proto.messages import (
    U64,
    Attestation,
    AttestationReceipt,
    DroppedNode,
    JoinReceipt,
    PayloadSpec,
    ResultHeader,
    ResultRequest,
    RosterRequest,
    RosterView,
    RoundDeadline,
    RoundResult,
    RoundState,
    RoundSummary,
    Sealed,
    SessionState,
    SessionStatus,
    StatusRequest,
    UnmaskHeader,
    UnmaskReceipt,
    UnmaskRefusal,
    UnmaskRequest,
    UploadHeader,
    UploadReceipt,
    UploadStatement,
    WithdrawReceipt,
    WithdrawRequest,
)
from proto.text import sanitise_text
from proto.zerosum.v1 import session_pb2 as pb

__all__ = [
    "REASON_CHARACTERS",
    "ROUND_STATUS",
    "SESSION_STATE",
    "attestation_from_pb",
    "attestation_receipt_to_pb",
    "attestation_to_pb",
    "join_request_to_pb",
    "join_response_from_pb",
    "join_response_to_pb",
    "key_bundle_from_pb",
    "key_bundle_to_pb",
    "payload_spec_from_pb",
    "payload_spec_to_pb",
    "result_header_from_pb",
    "result_header_to_pb",
    "result_request_from_pb",
    "result_request_to_pb",
    "roster_from_pb",
    "roster_request_from_pb",
    "roster_request_to_pb",
    "roster_to_pb",
    "round_result_from_pb",
    "round_state_from_pb",
    "sealed_contributions_to_pb",
    "sealed_from_pb",
    "sealed_tags_to_pb",
    "session_state_from_pb",
    "statements_to_pb",
    "status_from_pb",
    "status_request_from_pb",
    "status_request_to_pb",
    "status_to_pb",
    "tensor_slots_from_pb",
    "unmask_chunks_to_pb",
    "unmask_header_from_pb",
    "unmask_header_to_pb",
    "unmask_receipt_to_pb",
    "unmask_refusal_chunks_to_pb",
    "unmask_refusal_from_pb",
    "unmask_refusal_to_pb",
    "unmask_request_from_pb",
    "unmask_request_to_pb",
    "upload_chunks_to_pb",
    "upload_header_from_pb",
    "upload_header_to_pb",
    "upload_receipt_from_pb",
    "upload_receipt_to_pb",
    "withdraw_receipt_from_pb",
    "withdraw_receipt_to_pb",
    "withdraw_request_from_pb",
    "withdraw_request_to_pb",
]

ROUND_STATUS = {
    RoundState.OPEN: pb.ROUND_STATUS_OPEN,
    RoundState.AWAITING_UNMASK: pb.ROUND_STATUS_AWAITING_UNMASK,
    RoundState.READY: pb.ROUND_STATUS_READY,
    RoundState.FAILED: pb.ROUND_STATUS_FAILED,
    RoundState.SUPERSEDED: pb.ROUND_STATUS_SUPERSEDED,
}
SESSION_STATE = {
    SessionState.JOINING: pb.SESSION_STATE_JOINING,
    SessionState.RUNNING: pb.SESSION_STATE_RUNNING,
    SessionState.COMPLETED: pb.SESSION_STATE_COMPLETED,
    SessionState.ABORTED: pb.SESSION_STATE_ABORTED,
}
_ROUND_STATES: dict[int, RoundState] = {int(v): k for k, v in ROUND_STATUS.items()}
_SESSION_STATES: dict[int, SessionState] = {int(v): k for k, v in SESSION_STATE.items()}


def round_state_from_pb(status: int) -> RoundState:
    """The plain round state of a proto status (UNKNOWN for a value this version lacks)."""
    return _ROUND_STATES.get(status, RoundState.UNKNOWN)


def session_state_from_pb(state: int) -> SessionState:
    """The plain session state of a proto state (UNKNOWN for a value this version lacks)."""
    return _SESSION_STATES.get(state, SessionState.UNKNOWN)


# ---------------------------------------- requests, as the coordinator reads them


def tensor_slots_from_pb(tensors: Iterable[pb.TensorLayout]) -> tuple[TensorSlot, ...]:
    """Tensor slots as received (checked by whoever relies on them)."""
    return tuple(
        TensorSlot(name=t.name, shape=tuple(int(n) for n in t.shape), offset=t.offset, size=t.size)
        for t in tensors
    )


def payload_spec_from_pb(header: pb.PayloadHeader) -> PayloadSpec:
    """What a payload header promises, as received (checked by the session)."""
    return PayloadSpec(
        total_bytes=header.total_bytes,
        total_elements=header.total_elements,
        digest=bytes(header.digest),
        fixed_point_bits=header.fixed_point_bits,
        tensors=tensor_slots_from_pb(header.tensors),
    )


def key_bundle_from_pb(request: pb.JoinRequest) -> KeyBundle:
    """The signed key bundle of a join; MalformedMessage if absent or malformed."""
    if not request.HasField("bundle"):
        raise MalformedMessage("the join request carries no key bundle.")
    b = request.bundle
    try:
        return KeyBundle(
            config_hash=bytes(b.config_hash),
            session_id=b.session_id,
            node_id=b.node_id,
            public_key=bytes(b.public_key),
            signature=bytes(b.signature),
        )
    except KeyFormatError as error:
        raise MalformedMessage(f"the key bundle is malformed: {error}") from None


def upload_header_from_pb(h: pb.UploadHeader) -> UploadHeader:
    """The first message of an upload stream."""
    return UploadHeader(
        session_id=h.session_id,
        round_index=h.round_index,
        round_name=h.round_name,
        node_id=h.node_id,
        payload=payload_spec_from_pb(h.payload),
        roster_hash=bytes(h.roster_hash),
        statement_signature=bytes(h.statement_signature),
        self_mask_commitment=bytes(h.self_mask_commitment),
        challenge=tuple(sealed_from_pb(c) for c in h.challenge),
    )


def unmask_header_from_pb(h: pb.UnmaskHeader) -> UnmaskHeader:
    """The first message of a correction stream."""
    return UnmaskHeader(
        session_id=h.session_id,
        round_index=h.round_index,
        round_name=h.round_name,
        node_id=h.node_id,
        dropped=tuple(h.dropped_node_ids),
        survivor_hash=bytes(h.survivor_hash),
        payload=payload_spec_from_pb(h.payload) if h.HasField("payload") else None,
        self_mask_seed=bytes(h.self_mask_seed),
    )


def unmask_refusal_from_pb(r: pb.UnmaskRefusal) -> UnmaskRefusal:
    """A survivor's refusal to unmask."""
    return UnmaskRefusal(
        session_id=r.session_id,
        round_index=r.round_index,
        node_id=r.node_id,
        dropped=tuple(r.dropped_node_ids),
        survivor_hash=bytes(r.survivor_hash),
        reason=r.reason,
        accused=r.accused_node_id,
    )


def attestation_from_pb(request: pb.SurvivorAttestation) -> Attestation:
    """A survivor's signature over an unmask attempt's survivor hash."""
    return Attestation(
        session_id=request.session_id,
        round_index=request.round_index,
        node_id=request.node_id,
        survivor_hash=bytes(request.survivor_hash),
        signature=bytes(request.signature),
        tags=tuple(sealed_from_pb(t) for t in request.sealed_tags),
    )


def status_request_from_pb(request: pb.GetStatusRequest) -> StatusRequest:
    """Where a session is, asked for."""
    return StatusRequest(session_id=request.session_id)


def roster_request_from_pb(request: pb.GetRosterRequest) -> RosterRequest:
    """The roster, asked for."""
    return RosterRequest(session_id=request.session_id, node_id=request.node_id)


def result_request_from_pb(request: pb.GetResultRequest) -> ResultRequest:
    """A round's result, asked for."""
    return ResultRequest(
        session_id=request.session_id, round_index=request.round_index, node_id=request.node_id
    )


def withdraw_request_from_pb(request: pb.WithdrawRequest) -> WithdrawRequest:
    """A node stopping on purpose."""
    return WithdrawRequest(
        session_id=request.session_id,
        round_index=request.round_index,
        node_id=request.node_id,
        reason=request.reason,
    )


# ---------------------------------------- requests, as a node writes them


def payload_spec_to_pb(spec: PayloadSpec) -> pb.PayloadHeader:
    """A payload header (``proto.chunks.payload_spec`` makes one from the words)."""
    return pb.PayloadHeader(
        total_bytes=spec.total_bytes,
        total_elements=spec.total_elements,
        digest=spec.digest,
        fixed_point_bits=spec.fixed_point_bits,
        tensors=tensor_layouts(spec.tensors),
    )


def join_request_to_pb(bundle: KeyBundle) -> pb.JoinRequest:
    """A join: the node's signed key bundle."""
    return pb.JoinRequest(bundle=key_bundle_to_pb(bundle))


def status_request_to_pb(request: StatusRequest) -> pb.GetStatusRequest:
    """Where a session is, asked for."""
    return pb.GetStatusRequest(session_id=request.session_id)


def roster_request_to_pb(request: RosterRequest) -> pb.GetRosterRequest:
    """The roster, asked for."""
    return pb.GetRosterRequest(session_id=request.session_id, node_id=request.node_id)


def result_request_to_pb(request: ResultRequest) -> pb.GetResultRequest:
    """A round's result, asked for."""
    return pb.GetResultRequest(
        session_id=request.session_id, round_index=request.round_index, node_id=request.node_id
    )


def withdraw_request_to_pb(request: WithdrawRequest) -> pb.WithdrawRequest:
    """A node stopping on purpose."""
    return pb.WithdrawRequest(
        session_id=request.session_id,
        node_id=request.node_id,
        round_index=request.round_index,
        reason=request.reason,
    )


def upload_header_to_pb(header: UploadHeader) -> pb.UploadHeader:
    """The first message of an upload stream."""
    return pb.UploadHeader(
        session_id=header.session_id,
        round_index=header.round_index,
        round_name=header.round_name,
        node_id=header.node_id,
        payload=payload_spec_to_pb(header.payload),
        roster_hash=header.roster_hash,
        statement_signature=header.statement_signature,
        self_mask_commitment=header.self_mask_commitment,
        challenge=sealed_contributions_to_pb(header.challenge),
    )


def upload_chunks_to_pb(header: UploadHeader, payload: U64) -> Iterator[pb.UploadChunk | bytes]:
    """An upload stream: its header, then the payload in chunks, already encoded.

    Each data chunk is the serialized ``UploadChunk`` itself, written from
    the payload by ``proto.chunk_wire`` (one copy of each chunk); it goes out
    through a serializer that passes bytes as they are.
    """
    yield pb.UploadChunk(header=upload_header_to_pb(header))
    yield from encoded_chunks(payload)


def attestation_to_pb(attestation: Attestation) -> pb.SurvivorAttestation:
    """A survivor's signature over an unmask attempt's survivor hash, with its tags."""
    return pb.SurvivorAttestation(
        session_id=attestation.session_id,
        round_index=attestation.round_index,
        node_id=attestation.node_id,
        survivor_hash=attestation.survivor_hash,
        signature=attestation.signature,
        sealed_tags=sealed_tags_to_pb(attestation.tags),
    )


def unmask_header_to_pb(header: UnmaskHeader) -> pb.UnmaskHeader:
    """The first message of an unmask answer (its payload header only with corrections)."""
    return pb.UnmaskHeader(
        session_id=header.session_id,
        round_index=header.round_index,
        round_name=header.round_name,
        node_id=header.node_id,
        dropped_node_ids=list(header.dropped),
        survivor_hash=header.survivor_hash,
        self_mask_seed=header.self_mask_seed,
        payload=None if header.payload is None else payload_spec_to_pb(header.payload),
    )


def unmask_chunks_to_pb(
    header: UnmaskHeader, payload: U64 | None
) -> Iterator[pb.UnmaskChunk | bytes]:
    """An unmask answer: its header, then the corrections (if any) in chunks, already encoded.

    The data chunks are serialized ``UnmaskChunk`` messages, as in
    :func:`upload_chunks_to_pb`.
    """
    yield pb.UnmaskChunk(header=unmask_header_to_pb(header))
    if payload is not None:
        yield from encoded_chunks(payload)


def unmask_refusal_to_pb(refusal: UnmaskRefusal) -> pb.UnmaskRefusal:
    """A survivor's refusal to unmask."""
    return pb.UnmaskRefusal(
        accused_node_id=refusal.accused,
        session_id=refusal.session_id,
        round_index=refusal.round_index,
        node_id=refusal.node_id,
        dropped_node_ids=list(refusal.dropped),
        survivor_hash=refusal.survivor_hash,
        reason=refusal.reason,
    )


def unmask_refusal_chunks_to_pb(refusal: UnmaskRefusal) -> Iterator[pb.UnmaskChunk]:
    """A refusal as the one message of an unmask stream."""
    yield pb.UnmaskChunk(refusal=unmask_refusal_to_pb(refusal))


# ---------------------------------------- answers, as the coordinator writes them


def join_response_to_pb(receipt: JoinReceipt) -> pb.JoinResponse:
    """The answer to a join."""
    return pb.JoinResponse(
        session_id=receipt.session_id,
        node_id=receipt.node_id,
        rejoined=receipt.rejoined,
        joined_count=receipt.joined_count,
        federation_size=receipt.federation_size,
        join_deadline_unix_ms=receipt.join_deadline_ms,
    )


def roster_to_pb(view: RosterView) -> pb.Roster:
    """Every joined node's signed key, and whether the roster can still change."""
    return pb.Roster(
        session_id=view.session_id,
        config_hash=view.config_hash,
        bundles=[key_bundle_to_pb(b) for b in view.bundles],
        version=view.version,
        roster_hash=view.roster_hash,
        final=view.final,
        join_deadline_unix_ms=view.join_deadline_ms,
        excluded_node_ids=list(view.excluded),
        round_deadline_seconds=view.round_deadline_seconds,
        round_deadlines=[
            pb.RoundDeadline(
                round_index=d.round_index,
                round_name=d.round_name,
                deadline_unix_ms=d.deadline_ms,
            )
            for d in view.round_deadlines
        ],
    )


def upload_receipt_to_pb(receipt: UploadReceipt) -> pb.UploadReceipt:
    """The answer to an upload."""
    return pb.UploadReceipt(
        session_id=receipt.session_id,
        round_index=receipt.round_index,
        node_id=receipt.node_id,
        digest=receipt.digest,
        received_bytes=receipt.received_bytes,
        duplicate=receipt.duplicate,
        received_unix_ms=receipt.received_ms,
        submitted_count=receipt.submitted_count,
        expected_count=receipt.expected_count,
    )


def unmask_receipt_to_pb(receipt: UnmaskReceipt) -> pb.UnmaskReceipt:
    """The answer to a correction or a refusal."""
    return pb.UnmaskReceipt(
        session_id=receipt.session_id,
        round_index=receipt.round_index,
        node_id=receipt.node_id,
        accepted=receipt.accepted,
        duplicate=receipt.duplicate,
        digest=receipt.digest,
        received_count=receipt.received_count,
        survivor_count=receipt.survivor_count,
    )


def unmask_request_to_pb(view: UnmaskRequest) -> pb.UnmaskRequest:
    """What the coordinator asks of a survivor."""
    return pb.UnmaskRequest(
        session_id=view.session_id,
        round_index=view.round_index,
        round_name=view.round_name,
        pending=view.pending,
        dropped_node_ids=list(view.dropped),
        survivor_node_ids=list(view.survivors),
        survivor_hash=view.survivor_hash,
        attestations=[
            pb.SurvivorAttestation(
                session_id=a.session_id,
                round_index=a.round_index,
                node_id=a.node_id,
                survivor_hash=a.survivor_hash,
                signature=a.signature,
            )
            for a in view.attestations
        ],
        tensors=tensor_layouts(Layout(view.tensors)) if view.tensors else [],
        fixed_point_bits=view.fixed_point_bits,
        deadline_unix_ms=view.deadline_ms,
        min_survivors=view.min_survivors,
        challenge=sealed_contributions_to_pb(view.challenge),
        sealed_tags=sealed_tags_to_pb(view.tags),
    )


def result_header_to_pb(header: ResultHeader) -> pb.ResultHeader:
    """The first message of a result stream (the aggregate's chunks follow when READY)."""
    return pb.ResultHeader(
        session_id=header.session_id,
        round_index=header.round_index,
        round_name=header.round_name,
        status=ROUND_STATUS[header.state],
        reason=header.reason,
        deadline_unix_ms=header.deadline_ms,
        survivor_node_ids=list(header.survivors),
        dropped_node_ids=list(header.dropped),
        survivor_hash=header.survivor_hash,
        statements=statements_to_pb(header.statements),
        sealed_tags=sealed_tags_to_pb(header.tags),
        payload=None if header.payload is None else payload_spec_to_pb(header.payload),
        unmask_request=(
            None if header.unmask_request is None else unmask_request_to_pb(header.unmask_request)
        ),
    )


def sealed_tags_to_pb(tags: Sequence[Sealed]) -> list[pb.SealedTags]:
    """Aggregate-check tags as sent with an attestation or handed back with a result."""
    return [
        pb.SealedTags(
            sender_node_id=t.sender,
            recipient_node_id=t.recipient,
            sealed=t.sealed,
            signature=t.signature,
            leaf_index=t.index,
            leaf_count=t.count,
            path=t.path,
        )
        for t in tags
    ]


def attestation_receipt_to_pb(receipt: AttestationReceipt) -> pb.AttestationReceipt:
    """The answer to an attestation."""
    return pb.AttestationReceipt(
        attested_count=receipt.attested_count, survivor_count=receipt.survivor_count
    )


def status_to_pb(view: SessionStatus) -> pb.SessionStatus:
    """Where the session is."""
    return pb.SessionStatus(
        session_id=view.session_id,
        state=SESSION_STATE[view.state],
        config_hash=view.config_hash,
        federation_id=view.federation_id,
        current_round_index=view.current_round_index,
        current_round_name=view.current_round_name,
        joined_node_ids=list(view.joined),
        submitted_node_ids=list(view.submitted),
        excluded_node_ids=list(view.excluded),
        reason=view.reason,
        join_deadline_unix_ms=view.join_deadline_ms,
        min_nodes=view.min_nodes,
        rounds=[
            pb.RoundSummary(
                round_index=r.index,
                round_name=r.name,
                status=ROUND_STATUS[r.state],
                submitted_node_ids=list(r.submitted),
                dropped_node_ids=list(r.dropped),
                deadline_unix_ms=r.deadline_ms,
                reason=r.reason,
            )
            for r in view.rounds
        ],
        dropped_nodes=[
            pb.DroppedNode(node_id=d.node_id, round_index=d.round_index, reason=d.reason)
            for d in view.dropped
        ],
    )


def withdraw_receipt_to_pb(receipt: WithdrawReceipt) -> pb.WithdrawReceipt:
    """The answer to a withdrawal."""
    return pb.WithdrawReceipt(
        session_id=receipt.session_id,
        round_index=receipt.round_index,
        node_id=receipt.node_id,
        dropped_node_ids=list(receipt.dropped),
        state=SESSION_STATE[receipt.state],
    )


def statements_to_pb(statements: tuple[UploadStatement, ...]) -> list[pb.UploadStatement]:
    """The upload statements handed back with an aggregate."""
    return [
        pb.UploadStatement(
            node_id=s.node_id,
            round_name=s.round_name,
            roster_hash=s.roster_hash,
            payload_digest=s.payload_digest,
            signature=s.signature,
        )
        for s in statements
    ]


def key_bundle_to_pb(bundle: KeyBundle) -> pb.KeyBundle:
    """A signed key bundle as sent in a join and listed in a roster."""
    return pb.KeyBundle(
        config_hash=bundle.config_hash,
        session_id=bundle.session_id,
        node_id=bundle.node_id,
        public_key=bundle.public_key,
        signature=bundle.signature,
    )


def sealed_contributions_to_pb(sealed: Sequence[Sealed]) -> list[pb.SealedContribution]:
    """Challenge contributions as sent with an upload or listed in an unmask request."""
    return [
        pb.SealedContribution(
            sender_node_id=c.sender,
            recipient_node_id=c.recipient,
            sealed=c.sealed,
            signature=c.signature,
            leaf_index=c.index,
            leaf_count=c.count,
            path=c.path,
        )
        for c in sealed
    ]


# ---------------------------------------- answers, as a node reads them
#
# Text written by the coordinator or another node (every ``reason``) is made
# safe to print on the way in (proto.text), at most REASON_CHARACTERS long.

REASON_CHARACTERS = 1000


def _peer_text(text: str) -> str:
    return sanitise_text(text, REASON_CHARACTERS)


def sealed_from_pb(message: pb.SealedContribution | pb.SealedTags) -> Sealed:
    """A sealed aggregate-check message (a challenge contribution or tags)."""
    return Sealed(
        sender=message.sender_node_id,
        recipient=message.recipient_node_id,
        sealed=bytes(message.sealed),
        signature=bytes(message.signature),
        index=message.leaf_index,
        count=message.leaf_count,
        path=tuple(bytes(p) for p in message.path),
    )


def _bundle_from_pb(b: pb.KeyBundle) -> KeyBundle:
    return KeyBundle(
        config_hash=bytes(b.config_hash),
        session_id=b.session_id,
        node_id=b.node_id,
        public_key=bytes(b.public_key),
        signature=bytes(b.signature),
    )


def join_response_from_pb(response: pb.JoinResponse) -> JoinReceipt:
    """The answer to a join."""
    return JoinReceipt(
        session_id=response.session_id,
        node_id=response.node_id,
        rejoined=response.rejoined,
        joined_count=response.joined_count,
        federation_size=response.federation_size,
        join_deadline_ms=response.join_deadline_unix_ms,
    )


def roster_from_pb(message: pb.Roster) -> RosterView:
    """The roster as the coordinator shows it (every bundle still to be verified)."""
    return RosterView(
        session_id=message.session_id,
        config_hash=bytes(message.config_hash),
        bundles=tuple(_bundle_from_pb(b) for b in message.bundles),
        version=message.version,
        roster_hash=bytes(message.roster_hash),
        final=message.final,
        join_deadline_ms=message.join_deadline_unix_ms,
        excluded=tuple(message.excluded_node_ids),
        round_deadline_seconds=message.round_deadline_seconds,
        round_deadlines=tuple(
            RoundDeadline(d.round_index, d.round_name, d.deadline_unix_ms)
            for d in message.round_deadlines
        ),
    )


def upload_receipt_from_pb(receipt: pb.UploadReceipt) -> UploadReceipt:
    """The answer to an upload."""
    return UploadReceipt(
        session_id=receipt.session_id,
        round_index=receipt.round_index,
        node_id=receipt.node_id,
        digest=bytes(receipt.digest),
        received_bytes=receipt.received_bytes,
        duplicate=receipt.duplicate,
        received_ms=receipt.received_unix_ms,
        submitted_count=receipt.submitted_count,
        expected_count=receipt.expected_count,
    )


def withdraw_receipt_from_pb(receipt: pb.WithdrawReceipt) -> WithdrawReceipt:
    """The answer to a withdrawal."""
    return WithdrawReceipt(
        session_id=receipt.session_id,
        round_index=receipt.round_index,
        node_id=receipt.node_id,
        dropped=tuple(receipt.dropped_node_ids),
        state=session_state_from_pb(receipt.state),
    )


def status_from_pb(message: pb.SessionStatus) -> SessionStatus:
    """Where the session is."""
    return SessionStatus(
        session_id=message.session_id,
        state=session_state_from_pb(message.state),
        config_hash=bytes(message.config_hash),
        federation_id=message.federation_id,
        current_round_index=message.current_round_index,
        current_round_name=message.current_round_name,
        joined=tuple(message.joined_node_ids),
        submitted=tuple(message.submitted_node_ids),
        excluded=tuple(message.excluded_node_ids),
        reason=_peer_text(message.reason),
        join_deadline_ms=message.join_deadline_unix_ms,
        min_nodes=message.min_nodes,
        rounds=tuple(
            RoundSummary(
                index=r.round_index,
                name=r.round_name,
                state=round_state_from_pb(r.status),
                submitted=tuple(r.submitted_node_ids),
                dropped=tuple(r.dropped_node_ids),
                reason=_peer_text(r.reason),
                deadline_ms=r.deadline_unix_ms,
            )
            for r in message.rounds
        ),
        dropped=tuple(
            DroppedNode(d.node_id, d.round_index, _peer_text(d.reason))
            for d in message.dropped_nodes
        ),
    )


def unmask_request_from_pb(message: pb.UnmaskRequest) -> UnmaskRequest | None:
    """What the coordinator asks of this survivor; None when nothing is pending."""
    if not message.pending:
        return None
    return UnmaskRequest(
        session_id=message.session_id,
        round_index=message.round_index,
        round_name=message.round_name,
        pending=True,
        dropped=tuple(message.dropped_node_ids),
        survivors=tuple(message.survivor_node_ids),
        survivor_hash=bytes(message.survivor_hash),
        attestations=tuple(
            Attestation(
                a.node_id,
                bytes(a.survivor_hash),
                bytes(a.signature),
                session_id=a.session_id,
                round_index=a.round_index,
            )
            for a in message.attestations
        ),
        tensors=tensor_slots_from_pb(message.tensors),
        fixed_point_bits=message.fixed_point_bits,
        deadline_ms=message.deadline_unix_ms,
        min_survivors=message.min_survivors,
        challenge=tuple(sealed_from_pb(c) for c in message.challenge),
        tags=tuple(sealed_from_pb(t) for t in message.sealed_tags),
    )


def result_header_from_pb(header: pb.ResultHeader) -> ResultHeader:
    """The first message of a result stream, as received."""
    return ResultHeader(
        session_id=header.session_id,
        round_index=header.round_index,
        round_name=header.round_name,
        state=round_state_from_pb(header.status),
        reason=_peer_text(header.reason),
        deadline_ms=header.deadline_unix_ms,
        survivors=tuple(header.survivor_node_ids),
        dropped=tuple(header.dropped_node_ids),
        survivor_hash=bytes(header.survivor_hash),
        payload=payload_spec_from_pb(header.payload) if header.HasField("payload") else None,
        unmask_request=(
            unmask_request_from_pb(header.unmask_request)
            if header.HasField("unmask_request")
            else None
        ),
        statements=tuple(
            UploadStatement(
                node_id=s.node_id,
                round_name=s.round_name,
                roster_hash=bytes(s.roster_hash),
                payload_digest=bytes(s.payload_digest),
                signature=bytes(s.signature),
            )
            for s in header.statements
        ),
        tags=tuple(sealed_from_pb(t) for t in header.sealed_tags),
    )


def round_result_from_pb(
    header: pb.ResultHeader, *, aggregate: U64 | None = None, layout: Layout | None = None
) -> RoundResult:
    """A round's state from the first message of a result stream.

    ``aggregate`` and ``layout``: the payload that followed the header, as
    assembled and checked by the caller (READY only).
    """
    return RoundResult.of(result_header_from_pb(header), aggregate=aggregate, layout=layout)
