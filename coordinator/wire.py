"""Translation between the protobuf messages of the Coordinator service and plain dataclasses.

The session never sees protobuf types (coordinator/messages.py holds what it
takes and returns); the servicer (coordinator/server.py) calls these
functions at the edge, one per message, field for field. A message that
cannot be read (a malformed key bundle) raises
:class:`~coordinator.errors.InvalidArgument` like any refused message.

Status names: a 'superseded' round (a CAPE model round rerun after a dropout)
goes out as ROUND_STATUS_FAILED with a reason naming the rerun, and a
'failed' session as SESSION_STATE_ABORTED.
"""

from __future__ import annotations

from coordinator.errors import InvalidArgument
from coordinator.layout import PayloadSpec, TensorSlot
from coordinator.messages import (
    Attestation,
    AttestationReceipt,
    JoinReceipt,
    ResultView,
    RosterView,
    RoundStatus,
    SealedContribution,
    SealedTags,
    SessionState,
    StatusView,
    UnmaskHeader,
    UnmaskReceipt,
    UnmaskRefusal,
    UnmaskRequestView,
    UploadHeader,
    UploadReceipt,
    WithdrawReceipt,
    WithdrawRequest,
)
from noise.errors import KeyFormatError
from noise.keys import KeyBundle
from noise.layout import Layout
from proto.chunks import payload_header, tensor_layouts
from proto.zerosum.v1 import session_pb2 as pb

__all__ = [
    "ROUND_STATUS",
    "SESSION_STATE",
    "attestation_from_pb",
    "attestation_receipt_to_pb",
    "join_response_to_pb",
    "key_bundle_from_pb",
    "payload_spec_from_pb",
    "result_header_to_pb",
    "roster_to_pb",
    "status_to_pb",
    "unmask_header_from_pb",
    "unmask_receipt_to_pb",
    "unmask_refusal_from_pb",
    "unmask_request_to_pb",
    "upload_header_from_pb",
    "upload_receipt_to_pb",
    "withdraw_receipt_to_pb",
    "withdraw_request_from_pb",
]

ROUND_STATUS = {
    RoundStatus.OPEN: pb.ROUND_STATUS_OPEN,
    RoundStatus.UNMASK: pb.ROUND_STATUS_AWAITING_UNMASK,
    RoundStatus.READY: pb.ROUND_STATUS_READY,
    RoundStatus.FAILED: pb.ROUND_STATUS_FAILED,
    RoundStatus.SUPERSEDED: pb.ROUND_STATUS_FAILED,
}
SESSION_STATE = {
    SessionState.JOINING: pb.SESSION_STATE_JOINING,
    SessionState.RUNNING: pb.SESSION_STATE_RUNNING,
    SessionState.COMPLETED: pb.SESSION_STATE_COMPLETED,
    SessionState.FAILED: pb.SESSION_STATE_ABORTED,
}


# ---------------------------------------------------------------- in


def payload_spec_from_pb(header: pb.PayloadHeader) -> PayloadSpec:
    """What a payload header promises, as received (checked by the session)."""
    return PayloadSpec(
        total_bytes=header.total_bytes,
        total_elements=header.total_elements,
        sha256=bytes(header.sha256),
        fixed_point_bits=header.fixed_point_bits,
        tensors=tuple(
            TensorSlot(
                name=t.name, shape=tuple(int(n) for n in t.shape), offset=t.offset, size=t.size
            )
            for t in header.tensors
        ),
    )


def key_bundle_from_pb(request: pb.JoinRequest) -> KeyBundle:
    """The signed key bundle of a join; InvalidArgument if absent or malformed."""
    if not request.HasField("bundle"):
        raise InvalidArgument("the join request carries no key bundle.")
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
        raise InvalidArgument(f"the key bundle is malformed: {error}") from None


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
        challenge=tuple(
            SealedContribution(
                c.sender_node_id, c.recipient_node_id, bytes(c.sealed), bytes(c.signature)
            )
            for c in h.challenge
        ),
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
        tags=tuple(
            SealedTags(t.sender_node_id, t.recipient_node_id, bytes(t.sealed), bytes(t.signature))
            for t in request.sealed_tags
        ),
    )


def withdraw_request_from_pb(request: pb.WithdrawRequest) -> WithdrawRequest:
    """A node stopping on purpose."""
    return WithdrawRequest(
        session_id=request.session_id,
        round_index=request.round_index,
        node_id=request.node_id,
        reason=request.reason,
    )


# ---------------------------------------------------------------- out


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
        bundles=[
            pb.KeyBundle(
                config_hash=b.config_hash,
                session_id=b.session_id,
                node_id=b.node_id,
                public_key=b.public_key,
                signature=b.signature,
            )
            for b in view.bundles
        ],
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
        sha256=receipt.sha256,
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
        sha256=receipt.sha256,
        received_count=receipt.received_count,
        survivor_count=receipt.survivor_count,
    )


def unmask_request_to_pb(view: UnmaskRequestView) -> pb.UnmaskRequest:
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
        challenge=[
            pb.SealedContribution(
                sender_node_id=c.sender,
                recipient_node_id=c.recipient,
                sealed=c.sealed,
                signature=c.signature,
            )
            for c in view.challenge
        ],
        sealed_tags=_sealed_tags_to_pb(view.tags),
    )


def _sealed_tags_to_pb(tags: tuple[SealedTags, ...]) -> list[pb.SealedTags]:
    return [
        pb.SealedTags(
            sender_node_id=t.sender,
            recipient_node_id=t.recipient,
            sealed=t.sealed,
            signature=t.signature,
        )
        for t in tags
    ]


def attestation_receipt_to_pb(receipt: AttestationReceipt) -> pb.AttestationReceipt:
    """The answer to an attestation."""
    return pb.AttestationReceipt(
        attested_count=receipt.attested_count, survivor_count=receipt.survivor_count
    )


def result_header_to_pb(view: ResultView) -> pb.ResultHeader:
    """The first message of a result stream: the round's status and, when ready, its payload."""
    header = pb.ResultHeader(
        session_id=view.session_id,
        round_index=view.round_index,
        round_name=view.round_name,
        status=ROUND_STATUS[view.status],
        reason=view.reason,
        deadline_unix_ms=view.deadline_ms,
        survivor_node_ids=list(view.survivors),
        dropped_node_ids=list(view.dropped),
        survivor_hash=view.survivor_hash,
        statements=[
            pb.UploadStatement(
                node_id=s.node_id,
                round_name=s.round_name,
                roster_hash=s.roster_hash,
                payload_sha256=s.payload_sha256,
                signature=s.signature,
            )
            for s in view.statements
        ],
        sealed_tags=_sealed_tags_to_pb(view.tags),
    )
    if view.payload is not None:
        spec = view.payload
        header.payload.CopyFrom(
            payload_header(None, Layout(spec.tensors), spec.fixed_point_bits, sha256=spec.sha256)
        )
    if view.unmask_request is not None:
        header.unmask_request.CopyFrom(unmask_request_to_pb(view.unmask_request))
    return header


def status_to_pb(view: StatusView) -> pb.SessionStatus:
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
                round_index=r.round_index,
                round_name=r.round_name,
                status=ROUND_STATUS[r.status],
                submitted_node_ids=list(r.submitted),
                dropped_node_ids=list(r.dropped),
                deadline_unix_ms=r.deadline_ms,
                reason=r.reason,
            )
            for r in view.rounds
        ],
        dropped_nodes=[
            pb.DroppedNode(node_id=d.node_id, round_index=d.round_index, reason=d.reason)
            for d in view.dropped_nodes
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
