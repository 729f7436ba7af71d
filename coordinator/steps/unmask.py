"""Unmask steps of a session: every round's self-mask seeds, and pair terms after a dropout.

Every upload carries a uniform self-mask (noise/self_mask.py) on top of its
zero-sum noise, so once a round's uploads are in (or its deadline passed) the
round always has an unmask step. The coordinator issues one unmask request
per round index (survivors S, dropped D — possibly empty — and the
survivor-set hash binding them to the session and round); every survivor
signs the hash with its identity key, and once all have, each sees all the
signatures, checks them, and answers with its self-mask seed (checked here
against the commitment sent with its upload) and, if D is not empty, its pair
terms with D (its *correction*), or refuses. The result is
Σ_S uploads − Σ_S self-masks − Σ_S corrections, the exact sum over S: the
consistency check and double masking of Bonawitz et al. 2017 (ACM CCS,
"Practical Secure Aggregation for Privacy-Preserving Machine Learning", §4),
with each node revealing its own seed, so the coordinator can neither show
different survivor sets to different nodes nor hold both an uploaded node's
seed and its partners' pair terms with it (docs/design.md §4.6).

Every attestation carries the node's aggregate-check tags sealed for each
other survivor, and every upload its sealed challenge contributions; the
coordinator cannot open them but checks each author's signature before it
stores and relays them (docs/design.md §4.5).

A survivor silent at the unmask deadline ends the round index: it is
superseded and rerun among the survivors that spoke (coordinator/steps/
deadlines.py), since a second, smaller set for the same index could show a
node both survived and dropped. A refusal that names another survivor (its
signed sealed message does not open for the refusing node) supersedes the
round the same way, without the named survivor. Any other refusal cannot be
worked around without exposing the refusing node's noise, so it ends the
session with the node's reason.

The unmask request itself is issued by the status change that closes the
round (coordinator/transitions.py); what a node is asked is shown by
coordinator/steps/views.py.
"""

from __future__ import annotations

from coordinator.context import CoordinatorContext, Signed, node_list, short_digest
from coordinator.errors import (
    FailedPrecondition,
    InvalidArgument,
    RetryLater,
    Unauthenticated,
)
from coordinator.events import (
    AttestationsComplete,
    CorrectionsComplete,
    MemberNamed,
    ResultFile,
    TooFewAnswered,
    UnmaskRefused,
)
from coordinator.layout import check_announced_size, check_same_layout, validate_payload
from coordinator.steps.checks import (
    check_bits,
    check_in_roster,
    check_round,
    check_round_name,
    check_running,
    check_sealed,
    check_session_id,
    sealed_signatures,
)
from coordinator.steps.self_mask_sums import SelfMaskSums
from coordinator.steps.streams import Streams, Ticket, unlink_placed
from coordinator.store import (
    AttestationRow,
    CorrectionRow,
    RefusalRow,
    RoundRow,
    SessionRow,
    UnmaskRow,
)
from coordinator.transitions import StatusChanges
from noise.aggregate_check import SEALED_TAGS_BYTES
from noise.keys import key_fingerprint
from noise.seeds import SEED_BYTES
from noise.self_mask import self_mask_commitment
from noise.transcript import survivor_attestation_message
from proto.messages import (
    Attestation,
    AttestationReceipt,
    RoundState,
    UnmaskHeader,
    UnmaskReceipt,
    UnmaskRefusal,
)
from proto.rounds import RoundRef

__all__ = ["Unmasking"]

_MAX_REASON_CHARS = 2000


class Unmasking:
    """Attestations, corrections and refusals of the survivors of a round."""

    def __init__(self, ctx: CoordinatorContext, streams: Streams, changes: StatusChanges) -> None:
        self.ctx = ctx
        self.streams = streams
        self.changes = changes
        self.self_masks = SelfMaskSums()

    def _current_unmask(
        self, session_id: str, round_index: int, node_id: str, caller: str
    ) -> tuple[SessionRow, RoundRow, UnmaskRow]:
        check_in_roster(self.ctx, caller, node_id)
        row = self.ctx.session()
        check_session_id(session_id, row)
        round_row = check_round(self.ctx, round_index, row)
        check_running(row)
        if round_row.status != RoundState.AWAITING_UNMASK:
            raise FailedPrecondition(
                f"round {round_index} ({round_row.name!r}) is not awaiting unmask corrections "
                f"(it is {round_row.status})."
            )
        request = self.ctx.unmask_row(round_row)
        if node_id not in request.survivors:
            raise FailedPrecondition(
                f"node {node_id!r} is not a survivor of round {round_index}'s unmask request "
                f"(survivors: {node_list(list(request.survivors))})."
            )
        return row, round_row, request

    def _check_request_match(
        self, request: UnmaskRow, dropped: tuple[str, ...], survivor_hash: bytes, what: str
    ) -> None:
        if len(survivor_hash) != 32:
            raise InvalidArgument(
                f"{what}: survivor_hash must be 32 raw bytes; got {len(survivor_hash)} bytes."
            )
        if survivor_hash != request.survivor_hash or tuple(sorted(dropped)) != request.dropped:
            raise FailedPrecondition(
                f"{what}: it answers survivor hash {short_digest(survivor_hash)} with dropped "
                f"nodes {node_list(list(dropped))}, but the current request "
                f"(attempt {request.attempt}) has hash {short_digest(request.survivor_hash)} "
                f"with dropped nodes {node_list(list(request.dropped))}; fetch the request again."
            )

    def attest(self, attestation: Attestation, *, caller: str) -> AttestationReceipt:
        """Record a survivor's signature over the current survivor set."""
        self.ctx.signatures.verify_ahead(self._signatures(attestation, caller))
        with self.ctx.lock:
            row, round_row, request = self._current_unmask(
                attestation.session_id, attestation.round_index, attestation.node_id, caller
            )
            what = f"attestation of node {attestation.node_id!r} for round {round_row.round_index}"
            if len(attestation.signature) != 64:
                raise InvalidArgument(
                    f"{what}: signature must be 64 bytes; got {len(attestation.signature)} bytes."
                )
            self._check_request_match(request, request.dropped, attestation.survivor_hash, what)
            message = survivor_attestation_message(
                row.config_hash, row.session_id, round_row.round_index, request.survivor_hash
            )
            if not self.ctx.signatures.verify(
                self.ctx.config.identity_keys[attestation.node_id], attestation.signature, message
            ):
                raise Unauthenticated(
                    f"{what}: the signature does not verify against the node's pinned identity key "
                    f"({key_fingerprint(self.ctx.config.identity_keys[attestation.node_id])})."
                )
            check_sealed(
                self.ctx,
                attestation.tags,
                round_index=round_row.round_index,
                sender=attestation.node_id,
                recipients=sorted(set(request.survivors) - {attestation.node_id}),
                kind="tags",
                binding=request.survivor_hash,
                size=SEALED_TAGS_BYTES,
                what=what,
            )
            known = self.ctx.store.attestations(round_row.round_index, request.attempt)
            if attestation.node_id not in {a.node_id for a in known}:
                now = self.ctx.clock()
                with self.ctx.transition():
                    self.ctx.store.add_attestation(
                        AttestationRow(
                            round_index=round_row.round_index,
                            attempt=request.attempt,
                            node_id=attestation.node_id,
                            signature=attestation.signature,
                            received_ms=now,
                            tags=tuple(
                                (t.recipient, t.sealed, t.signature) for t in attestation.tags
                            ),
                        )
                    )
                    self.ctx.note(
                        f"round {round_row.round_index}: {attestation.node_id!r} attested the "
                        f"survivor set ({len(known) + 1} of {len(request.survivors)})",
                        event="survivors-attested",
                        node=attestation.node_id,
                    )
                    if len(known) + 1 == len(request.survivors):
                        self.changes.apply_to_round(
                            round_row.round_index, AttestationsComplete(), now=now
                        )
            count = len(self.ctx.store.attestations(round_row.round_index, request.attempt))
            return AttestationReceipt(attested_count=count, survivor_count=len(request.survivors))

    def _signatures(self, attestation: Attestation, caller: str) -> list[Signed]:
        """The attestation's signatures as (key, signature, message), for the survivor set
        it names; verified before the session lock is taken, for a caller attesting as itself.
        """
        row = self.ctx.store.session()
        key = self.ctx.config.identity_keys.get(attestation.node_id)
        if caller != attestation.node_id or row is None or key is None:
            return []
        try:
            message = survivor_attestation_message(
                row.config_hash, row.session_id, attestation.round_index, attestation.survivor_hash
            )
            tags = sealed_signatures(
                self.ctx,
                attestation.tags,
                round_index=attestation.round_index,
                sender=attestation.node_id,
                kind="tags",
                binding=attestation.survivor_hash,
            )
        except ValueError:
            return []  # refused under the lock, with the sentence for it
        return [(key, attestation.signature, message), *tags]

    def begin_unmask(self, header: UnmaskHeader, *, caller: str) -> Ticket | UnmaskReceipt:
        """Check an unmask answer's header.

        A duplicate is answered at once; so is an answer that is a seed alone
        (nobody dropped), which is recorded here. Otherwise a ticket for the
        corrections' stream is returned.
        """
        with self.ctx.lock:
            check_in_roster(self.ctx, caller, header.node_id)
            row = self.ctx.session()
            check_session_id(header.session_id, row)
            round_row = check_round(self.ctx, header.round_index, row)
            check_round_name(round_row, header.round_name)
            digest = header.payload.digest if header.payload is not None else b""
            # An answer already stored is acknowledged again also after the round
            # moved on (the receipt of the last answer may have been lost).
            if round_row.unmask_attempt > 0:
                request = self.ctx.unmask_row(round_row)
                stored = next(
                    (
                        c
                        for c in self.ctx.store.corrections(header.round_index, request.attempt)
                        if c.node_id == header.node_id
                    ),
                    None,
                )
                if stored is not None and header.survivor_hash == request.survivor_hash:
                    return self._duplicate_correction(
                        stored, digest, header.self_mask_seed, request, row
                    )
            row, round_row, request = self._current_unmask(
                header.session_id, header.round_index, header.node_id, caller
            )
            what = f"unmask answer of node {header.node_id!r} for round {header.round_index}"
            self._check_request_match(request, header.dropped, header.survivor_hash, what)
            attested = {
                a.node_id for a in self.ctx.store.attestations(header.round_index, request.attempt)
            }
            missing = set(request.survivors) - attested
            if missing:
                raise FailedPrecondition(
                    f"{what}: not every survivor has attested the survivor set yet "
                    f"({node_list(missing)} missing); answer once all have."
                )
            self._check_seed(header, what)
            spec = header.payload
            if not request.dropped:
                if spec is not None:
                    raise InvalidArgument(
                        f"{what}: nobody dropped, so the answer is the self-mask seed alone; "
                        "it carries a correction payload."
                    )
                return self._record_answer(
                    round_row,
                    request=request,
                    node_id=header.node_id,
                    seed=header.self_mask_seed,
                    corrections=None,
                )
            if spec is None:
                raise InvalidArgument(
                    f"{what}: nodes {node_list(list(request.dropped))} dropped, so the answer "
                    "must carry the pair terms with them; it has no payload."
                )
            assert round_row.layout is not None
            check_announced_size(spec, round_row.layout, what=what)
            layout = validate_payload(spec, what=what, max_bytes=self.ctx.config.max_payload_bytes)
            check_bits(self.ctx, spec, what)
            check_same_layout(layout, round_row.layout, what=what)
            if spec.fixed_point_bits != round_row.fixed_point_bits:
                raise InvalidArgument(
                    f"{what}: fixed_point_bits is {spec.fixed_point_bits}; this round's "
                    f"payloads use {round_row.fixed_point_bits}."
                )
            if self.streams.in_progress("correction", header.round_index, header.node_id):
                raise RetryLater(f"{what}: another stream of it is in progress; retry later.")
            return self.streams.register(
                Ticket(
                    kind="correction",
                    round_index=header.round_index,
                    node_id=header.node_id,
                    spec=spec,
                    writer=self.ctx.store.new_payload(),
                    commit=self._commit_correction,
                    attempt=request.attempt,
                    self_mask_seed=header.self_mask_seed,
                    name=self.ctx.store.correction_name(
                        header.round_index, request.attempt, header.node_id, spec.digest
                    ),
                )
            )

    def _check_seed(self, header: UnmaskHeader, what: str) -> None:
        """The revealed seed must be the one the node's upload committed to."""
        seed = header.self_mask_seed
        if len(seed) != SEED_BYTES:
            raise InvalidArgument(
                f"{what}: self_mask_seed must be {SEED_BYTES} raw bytes; got {len(seed)} bytes."
            )
        upload = self.ctx.store.upload(header.round_index, header.node_id)
        assert upload is not None, "every survivor has an upload"
        if self_mask_commitment(seed) != upload.self_mask_commitment:
            raise InvalidArgument(
                f"{what}: the self-mask seed does not match the commitment "
                f"{short_digest(upload.self_mask_commitment)} sent with its upload; the node's "
                "upload could not be unmasked with it."
            )

    def _duplicate_correction(
        self,
        stored: CorrectionRow,
        digest: bytes,
        seed: bytes,
        request: UnmaskRow,
        row: SessionRow,
    ) -> UnmaskReceipt:
        if stored.digest != digest or stored.self_mask_seed != seed:
            raise FailedPrecondition(
                f"conflicting unmask answer: node {stored.node_id!r} already answered round "
                f"{stored.round_index} (attempt {stored.attempt}) with corrections digest "
                f"{short_digest(stored.digest) if stored.digest else 'none'} and another "
                "self-mask seed or corrections than this answer."
            )
        return UnmaskReceipt(
            session_id=row.session_id,
            round_index=stored.round_index,
            node_id=stored.node_id,
            accepted=True,
            duplicate=True,
            digest=stored.digest,
            received_count=len(self.ctx.store.corrections(stored.round_index, stored.attempt)),
            survivor_count=len(request.survivors),
        )

    def _commit_correction(self, ticket: Ticket) -> UnmaskReceipt:
        """Under the lock: place the corrections' file and record the answer."""
        if ticket.cancelled:
            raise FailedPrecondition(ticket.cancelled_sentence())
        check_running(self.ctx.session())
        round_row = self.ctx.round_row(ticket.round_index)
        if (
            round_row.status != RoundState.AWAITING_UNMASK
            or round_row.unmask_attempt != ticket.attempt
        ):
            raise FailedPrecondition(
                f"{ticket.what}: the unmask request changed while the correction was in "
                "progress; fetch the request again."
            )
        request = self.ctx.unmask_row(round_row)
        name = self.ctx.store.correction_name(
            ticket.round_index, ticket.attempt, ticket.node_id, ticket.spec.digest
        )
        ticket.writer.place(name)
        receipt = self._record_answer(
            round_row,
            request=request,
            node_id=ticket.node_id,
            seed=ticket.self_mask_seed,
            corrections=(name, ticket.spec.digest, ticket.spec.total_bytes),
        )
        ticket.committed = True
        self.streams.abandon(ticket)
        return receipt

    def _record_answer(
        self,
        round_row: RoundRow,
        *,
        request: UnmaskRow,
        node_id: str,
        seed: bytes,
        corrections: tuple[str, bytes, int] | None,
    ) -> UnmaskReceipt:
        """Record one survivor's answer; the last one completes the round (under the lock).

        The aggregate is Σ_S uploads − Σ_S self-masks − Σ_S corrections.
        """
        row = self.ctx.session()
        now = self.ctx.clock()
        name, digest, size = corrections if corrections is not None else (None, b"", 0)
        answer = CorrectionRow(
            round_index=round_row.round_index,
            attempt=request.attempt,
            node_id=node_id,
            digest=digest,
            size=size,
            path=name,
            received_ms=now,
            self_mask_seed=seed,
        )
        stored = self.ctx.store.corrections(round_row.round_index, request.attempt)
        answered = {c.node_id for c in stored} | {node_id}
        complete = set(request.survivors) <= answered
        result: ResultFile | None = None
        try:
            if complete:
                result = self._aggregate(round_row, [*stored, answer])
            with self.ctx.transition():
                self.ctx.store.add_correction(answer)
                self.ctx.note(
                    f"round {round_row.round_index} ({round_row.name!r}): stored the unmask "
                    f"answer of {node_id!r} ({len(answered)} of {len(request.survivors)})",
                    event="unmask-stored",
                    node=node_id,
                )
                if result is not None:
                    event = CorrectionsComplete(request.survivors, request.dropped, result)
                    self.changes.apply_to_round(round_row.round_index, event, now=now)
        except BaseException:
            if complete:
                self.ctx.forget_sum()
            if result is not None:
                unlink_placed(self.ctx.store.payload_path(result.name))
            raise
        if complete:
            self.ctx.forget_sum()
            self.self_masks.forget()
        else:
            assert round_row.layout is not None
            self.self_masks.add(
                round_row.round_index, request.attempt, node_id, seed, round_row.layout
            )
        return UnmaskReceipt(
            session_id=row.session_id,
            round_index=round_row.round_index,
            node_id=node_id,
            accepted=True,
            duplicate=False,
            digest=digest,
            received_count=len(answered),
            survivor_count=len(request.survivors),
        )

    def _aggregate(self, round_row: RoundRow, answers: list[CorrectionRow]) -> ResultFile:
        """Write Σ_S uploads − Σ_S self-masks − Σ_S corrections as the round's result file."""
        running = self.ctx.sum_for(round_row)
        assert round_row.layout is not None
        for answer in answers:
            if answer.path is not None:
                running.subtract_file(self.ctx.store.payload_path(answer.path))
        seeds = {answer.node_id: answer.self_mask_seed for answer in answers}
        attempt = answers[0].attempt if answers else 0
        masks = self.self_masks.total(round_row.round_index, attempt, seeds, round_row.layout)
        running.subtract_words(masks)
        self.self_masks.recycle(masks)  # read: the next round's sum is made in it
        return self.streams.write_result(running, round_row.round_index)

    def refuse_unmask(self, refusal: UnmaskRefusal, *, caller: str) -> UnmaskReceipt:
        """Record a survivor's refusal; the round cannot be completed and the session fails."""
        with self.ctx.lock:
            row, round_row, request = self._current_unmask(
                refusal.session_id, refusal.round_index, refusal.node_id, caller
            )
            what = f"unmask refusal of node {refusal.node_id!r} for round {refusal.round_index}"
            self._check_request_match(request, refusal.dropped, refusal.survivor_hash, what)
            text = " ".join(refusal.reason.split())[:_MAX_REASON_CHARS]
            if not text:
                raise InvalidArgument(f"{what}: the refusal gives no reason.")
            now = self.ctx.clock()
            if refusal.accused:
                return self._named(refusal, round_row, request, text, now)
            reason = (
                f"node {refusal.node_id!r} refused to unmask round {round_row.round_index} "
                f"({round_row.name!r}): {text}"
            )
            with self.ctx.transition():
                self.ctx.store.add_refusal(
                    RefusalRow(
                        round_index=round_row.round_index,
                        attempt=request.attempt,
                        node_id=refusal.node_id,
                        reason=text,
                        received_ms=now,
                    )
                )
                self.changes.apply_to_round(round_row.round_index, UnmaskRefused(reason), now=now)
            self.streams.cancel("correction", round_row.round_index, set(request.survivors))
            self.ctx.forget_sum()
            return UnmaskReceipt(
                session_id=row.session_id,
                round_index=round_row.round_index,
                node_id=refusal.node_id,
                accepted=False,
                duplicate=False,
                digest=b"",
                received_count=len(
                    self.ctx.store.corrections(round_row.round_index, request.attempt)
                ),
                survivor_count=len(request.survivors),
            )

    def _named(
        self,
        refusal: UnmaskRefusal,
        round_row: RoundRow,
        request: UnmaskRow,
        text: str,
        now: int,
    ) -> UnmaskReceipt:
        """A refusal naming another survivor: drop it and rerun the round without it (locked).

        Its evidence is the named survivor's signature over the sealed message
        that does not open, checked here on receipt (``check_sealed``), so
        what the refusing node was relayed is what the named one signed.
        With fewer than ``min_nodes`` left the round fails, naming it.
        """
        ctx, index, name = self.ctx, round_row.round_index, round_row.name
        accused, accuser = refusal.accused, refusal.node_id
        what = f"unmask refusal of node {accuser!r} for round {index}"
        if accused == accuser or accused not in request.survivors:
            raise InvalidArgument(
                f"{what}: it names {accused!r}, which is not another survivor of the request "
                f"({node_list(list(request.survivors))})."
            )
        survivors = tuple(sorted(set(request.survivors) - {accused}))
        why = f"named by {accuser!r} in round {index} ({name!r}): {text}"
        with ctx.transition():
            ctx.store.add_refusal(
                RefusalRow(
                    round_index=index,
                    attempt=request.attempt,
                    node_id=accuser,
                    reason=f"names {accused!r}: {text}",
                    received_ms=now,
                )
            )
            ctx.store.drop_member(accused, index, why)
            if len(survivors) < ctx.config.min_nodes:
                reason = (
                    f"survivor {accused!r} was {why}; without it {len(survivors)} survivors are "
                    f"left and the federation requires at least {ctx.config.min_nodes}"
                )
                self.changes.apply_to_round(index, TooFewAnswered(reason), now=now)
            else:
                cape_model = (
                    ctx.config.construction == "cape" and not RoundRef.parse(name).is_cape_sum
                )
                rerun = ctx.config.next_round_name(name, superseded=True) if cape_model else name
                assert rerun is not None
                reason = (
                    f"survivor {accused!r} was {why}; the round is rerun as {rerun!r} among "
                    f"{node_list(list(survivors))} from round {index + 1}, with fresh keys"
                )
                self.changes.apply_to_round(index, MemberNamed(survivors, rerun, reason), now=now)
        self.streams.cancel("correction", index, set(request.survivors))
        ctx.forget_sum()
        return UnmaskReceipt(
            session_id=ctx.session().session_id,
            round_index=index,
            node_id=accuser,
            accepted=False,
            duplicate=False,
            digest=b"",
            received_count=len(ctx.store.corrections(index, request.attempt)),
            survivor_count=len(request.survivors),
        )
