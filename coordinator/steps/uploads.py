"""Upload steps of a session: a node's masked payload for a round, chunk by chunk.

A header is checked completely before any byte is accepted (caller, session,
round, the node's signed upload statement, liveness, size, fixed-point scale,
and a layout equal to the round's);
chunks then go to a temporary file and, in the same pass, into the round's
running sum (coordinator/steps/streams.py), so memory does not grow with the
number of nodes. At the end the size and payload digest are verified, the file is
placed (durably, before the session lock is taken) and the upload recorded in
one transaction; if it was the last one the
round moves to its unmask step in that same transaction (the table of
coordinator/transitions.py: an upload completed the round), where every
survivor reveals the seed of the uniform self-mask its upload carries
(coordinator/steps/unmask.py). The header's ``self_mask_commitment`` is
stored with the upload, to check that seed against.

Upload statements: every header carries the node's Ed25519 identity
signature over ``noise.transcript.upload_statement_message`` (config hash,
session, round, round name, the roster hash the node verified, payload
digest). The coordinator refuses a signature that does not verify against
the pinned identity (UNAUTHENTICATED) and a roster hash other than the
session's final one (FAILED_PRECONDITION: the node was shown another roster,
so its masks would not cancel), stores the signature with the upload, and
returns the statements of all summed uploads with the aggregate; each node
then checks that every contributor saw its roster (node/protocol/statements.py).

Uploads are idempotent per (session, round, node) and content hash: the same
payload again is acknowledged as a duplicate (even after the round is ready,
for a node whose receipt was lost); a different one is refused
(FAILED_PRECONDITION).
"""

from __future__ import annotations

from coordinator.aggregate import ContributionWithdrawn
from coordinator.context import CoordinatorContext, Signed, clock_text, short_digest
from coordinator.errors import (
    FailedPrecondition,
    InvalidArgument,
    RetryLater,
    Unauthenticated,
)
from coordinator.events import UploadsComplete
from coordinator.layout import check_announced_size, check_same_layout, validate_payload
from coordinator.steps.checks import (
    check_bits,
    check_in_roster,
    check_live,
    check_round,
    check_round_name,
    check_running,
    check_sealed,
    check_session_id,
    sealed_signatures,
)
from coordinator.steps.streams import Streams, Ticket
from coordinator.store import RoundRow, SessionRow, UploadRow
from coordinator.transitions import StatusChanges
from noise.aggregate_check import SEALED_BYTES
from noise.errors import KeyFormatError
from noise.transcript import upload_statement_message
from proto.messages import (
    RoundState,
    UploadHeader,
    UploadReceipt,
)

__all__ = ["Uploads"]

# A challenge contribution is bound to no survivor set (its tags are).
_NO_BINDING = bytes(32)


class Uploads:
    """Receiving and storing uploads."""

    def __init__(self, ctx: CoordinatorContext, streams: Streams, changes: StatusChanges) -> None:
        self.ctx = ctx
        self.streams = streams
        self.changes = changes

    def begin_upload(self, header: UploadHeader, *, caller: str) -> Ticket | UploadReceipt:
        """Check an upload header; a duplicate is answered at once, else a ticket is returned."""
        ctx = self.ctx
        ctx.signatures.verify_ahead(self._signatures(header, caller))
        with ctx.lock:
            check_in_roster(ctx, caller, header.node_id)
            row = ctx.session()
            check_session_id(header.session_id, row)
            round_row = check_round(ctx, header.round_index, row)
            check_round_name(round_row, header.round_name)
            check_announced_size(
                header.payload,
                ctx.config.layout(round_row.name),
                what=f"upload of node {header.node_id!r} for round {header.round_index}",
            )
            self._check_statement(header, row)
            if len(header.self_mask_commitment) != 32:
                raise InvalidArgument(
                    f"upload of node {header.node_id!r} for round {header.round_index}: "
                    "self_mask_commitment must be 32 raw bytes; got "
                    f"{len(header.self_mask_commitment)} bytes."
                )
            stored = ctx.store.upload(header.round_index, header.node_id)
            if stored is None:
                self._check_challenge(header, round_row)
            if stored is not None:
                if stored.self_mask_commitment != header.self_mask_commitment:
                    raise FailedPrecondition(
                        f"conflicting upload: node {header.node_id!r} already submitted round "
                        f"{header.round_index} ({round_row.name!r}) with self-mask commitment "
                        f"{short_digest(stored.self_mask_commitment)}; this upload commits to "
                        f"{short_digest(header.self_mask_commitment)}."
                    )
                return self._duplicate_upload(stored, header.payload.digest, round_row, row)
            check_live(ctx, header.node_id, row)
            if header.node_id not in round_row.participants:
                raise FailedPrecondition(
                    f"node {header.node_id!r} is not a participant of round "
                    f"{round_row.round_index} ({round_row.name!r})."
                )
            check_running(row)
            if round_row.status != RoundState.OPEN:
                raise FailedPrecondition(
                    f"round {round_row.round_index} ({round_row.name!r}) no longer accepts "
                    f"uploads: it is {round_row.status}."
                )
            if ctx.clock() >= round_row.deadline_ms:
                raise FailedPrecondition(
                    f"round {round_row.round_index} ({round_row.name!r}) stopped accepting "
                    f"uploads at its deadline, {clock_text(round_row.deadline_ms)}."
                )
            what = f"upload of node {header.node_id!r} for round {header.round_index}"
            spec = header.payload
            layout = validate_payload(spec, what=what, max_bytes=ctx.config.max_payload_bytes)
            check_bits(ctx, spec, what)
            # Only this node's upload is refused: the round's layout is the plan's.
            check_same_layout(layout, ctx.config.layout(round_row.name), what=what)
            running = ctx.sum_for(round_row)
            if self.streams.in_progress("upload", header.round_index, header.node_id):
                raise RetryLater(
                    f"an upload of node {header.node_id!r} for round {header.round_index} is "
                    "already in progress; retry when it has finished."
                )
            writer = ctx.store.new_payload()
            name = ctx.store.upload_name(header.round_index, header.node_id, spec.digest)
            return self.streams.register(
                Ticket(
                    kind="upload",
                    round_index=header.round_index,
                    node_id=header.node_id,
                    spec=spec,
                    writer=writer,
                    commit=self._commit_upload,
                    running=running,
                    contribution=running.begin(what, writer.path),
                    statement_signature=header.statement_signature,
                    self_mask_commitment=header.self_mask_commitment,
                    challenge=tuple((c.recipient, c.sealed, c.signature) for c in header.challenge),
                    layout=layout,
                    name=name,
                )
            )

    def _signatures(self, header: UploadHeader, caller: str) -> list[Signed]:
        """The header's statement and sealed contributions as (key, signature, message).

        Verified before the session lock is taken; only for a caller uploading
        as itself (anyone else is refused under the lock, before any of it).
        """
        row = self.ctx.store.session()
        key = self.ctx.config.identity_keys.get(header.node_id)
        if caller != header.node_id or row is None or key is None:
            return []
        try:
            statement = self._statement_message(header, row)
            challenge = sealed_signatures(
                self.ctx,
                header.challenge,
                round_index=header.round_index,
                sender=header.node_id,
                kind="contribution",
                binding=_NO_BINDING,
            )
        except ValueError:  # KeyFormatError too: refused under the lock, with its sentence
            return []
        return [(key, header.statement_signature, statement), *challenge]

    @staticmethod
    def _statement_message(header: UploadHeader, row: SessionRow) -> bytes:
        return upload_statement_message(
            row.config_hash,
            row.session_id,
            header.round_index,
            header.round_name,
            roster_hash=header.roster_hash,
            payload_digest=header.payload.digest,
        )

    def _check_challenge(self, header: UploadHeader, round_row: RoundRow) -> None:
        """One sealed challenge contribution from the node for each other participant, signed."""
        check_sealed(
            self.ctx,
            header.challenge,
            round_index=header.round_index,
            sender=header.node_id,
            recipients=sorted(set(round_row.participants) - {header.node_id}),
            kind="contribution",
            binding=_NO_BINDING,
            size=SEALED_BYTES,
            what=f"upload of node {header.node_id!r} for round {header.round_index}",
        )

    def _check_statement(self, header: UploadHeader, row: SessionRow) -> None:
        """Refuse an upload statement that is not the node's or names another roster.

        The signature is checked first: a roster hash is only worth comparing
        once it is known to be the node's own claim.
        """
        what = f"upload of node {header.node_id!r} for round {header.round_index}"
        try:
            message = self._statement_message(header, row)
        except (KeyFormatError, ValueError) as error:
            raise InvalidArgument(f"{what}: the upload statement is malformed: {error}") from None
        pinned = self.ctx.config.identity_keys[header.node_id]
        if not self.ctx.signatures.verify(pinned, header.statement_signature, message):
            raise Unauthenticated(
                f"the upload statement of node {header.node_id!r} for round "
                f"{header.round_index} ({header.round_name!r}) does not verify against the "
                f"identity key pinned for {header.node_id!r}; the upload is refused."
            )
        final = self.ctx.roster_hash(row)
        if header.roster_hash != final:
            raise FailedPrecondition(
                f"node {header.node_id!r} signed its upload for round {header.round_index} "
                f"({header.round_name!r}) over roster hash {short_digest(header.roster_hash)}, "
                f"but this session's final roster hashes to {short_digest(final)}; the node "
                "was shown a different roster, so its masks would not cancel."
            )

    def _duplicate_upload(
        self, stored: UploadRow, digest: bytes, round_row: RoundRow, row: SessionRow
    ) -> UploadReceipt:
        if stored.digest != digest:
            raise FailedPrecondition(
                f"conflicting upload: node {stored.node_id!r} already submitted round "
                f"{stored.round_index} ({round_row.name!r}) with digest "
                f"{short_digest(stored.digest)}; this upload has digest {short_digest(digest)}."
            )
        return self._upload_receipt(row, round_row, stored, duplicate=True)

    def _upload_receipt(
        self, row: SessionRow, round_row: RoundRow, stored: UploadRow, *, duplicate: bool
    ) -> UploadReceipt:
        return UploadReceipt(
            session_id=row.session_id,
            round_index=stored.round_index,
            node_id=stored.node_id,
            digest=stored.digest,
            received_bytes=stored.size,
            duplicate=duplicate,
            received_ms=stored.received_ms,
            submitted_count=len(self.ctx.store.uploads(stored.round_index)),
            expected_count=len(round_row.participants),
        )

    def _commit_upload(self, ticket: Ticket) -> UploadReceipt:
        """Under the lock: place the payload and record it; the last one completes the round."""
        ctx = self.ctx
        if ticket.cancelled:
            raise FailedPrecondition(ticket.cancelled_sentence())
        contribution, running = ticket.contribution, ticket.running
        assert contribution is not None and running is not None and ticket.layout is not None
        if running is not ctx.current_sum:  # pragma: no cover - a live ticket keeps it current
            raise FailedPrecondition(f"{ticket.what}: the round moved on during the upload.")
        try:
            running.close(contribution)
        except ContributionWithdrawn:
            raise FailedPrecondition(ticket.cancelled_sentence()) from None
        row = ctx.session()
        round_row = ctx.round_row(ticket.round_index)
        stored = ctx.store.upload(ticket.round_index, ticket.node_id)
        if stored is not None:
            # A concurrent stream of the same payload finished first.
            receipt = self._duplicate_upload(stored, ticket.spec.digest, round_row, row)
            if ticket.writer.placed == ctx.store.payload_path(stored.path):
                ticket.writer.placed = None  # the stored upload's own file: never unlinked
            self.streams.abandon(ticket)
            return receipt
        check_live(ctx, ticket.node_id, row)
        check_running(row)
        if round_row.status != RoundState.OPEN:
            raise FailedPrecondition(
                f"{ticket.what}: round {round_row.round_index} ({round_row.name!r}) stopped "
                f"accepting uploads (it is {round_row.status})."
            )
        now = ctx.clock()
        name = ctx.store.upload_name(ticket.round_index, ticket.node_id, ticket.spec.digest)
        contribution.source = ticket.writer.place(name)  # placed already (Streams.finish)
        upload = UploadRow(
            round_index=ticket.round_index,
            node_id=ticket.node_id,
            digest=ticket.spec.digest,
            size=ticket.spec.total_bytes,
            path=name,
            layout=ticket.layout,
            fixed_point_bits=ticket.spec.fixed_point_bits,
            received_ms=now,
            statement_signature=ticket.statement_signature,
            self_mask_commitment=ticket.self_mask_commitment,
            challenge=ticket.challenge,
        )
        uploaded = {u.node_id for u in ctx.store.uploads(ticket.round_index)} | {ticket.node_id}
        complete = set(round_row.participants) <= uploaded
        with ctx.transition():
            ctx.store.add_upload(upload)
            ctx.note(
                f"round {round_row.round_index} ({round_row.name!r}): stored the upload of "
                f"{ticket.node_id!r} ({ticket.spec.total_bytes} bytes, {len(uploaded)} of "
                f"{len(round_row.participants)})",
                event="upload-stored",
                node=ticket.node_id,
            )
            if complete:
                event = UploadsComplete(tuple(sorted(uploaded)))
                self.changes.apply_to_round(round_row.round_index, event, now=now)
        ticket.committed = True
        self.streams.abandon(ticket)
        return self._upload_receipt(ctx.session(), round_row, upload, duplicate=False)
