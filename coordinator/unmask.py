"""Unmask steps of a session: exact sums over the survivors after a dropout.

When participants miss a round's deadline, the survivors' uploads still carry
the pair terms they share with the dropped nodes. The coordinator issues an
unmask request (survivors S, dropped D, and the survivor-set hash binding them
to the session and round); every survivor signs the hash with its identity
key, and once all have, each sees all the signatures, checks them, and sends
its pair terms with D (its *correction*) or refuses. The result is
Σ_S uploads − Σ_S corrections, the exact sum over S: the consistency check
and unmasking of Bonawitz et al. 2017 (ACM CCS, "Practical Secure Aggregation
for Privacy-Preserving Machine Learning", §4), so the coordinator cannot show
different survivor sets to different nodes.

A survivor silent at the unmask deadline moves from S to D, its upload leaves
the running sum, and a new attempt is issued (its earlier corrections no
longer count). A refusal cannot be worked around without exposing the refusing
node's noise, so it ends the session with the node's reason.
"""

from __future__ import annotations

from coordinator.errors import (
    FailedPrecondition,
    InvalidArgument,
    RetryLater,
    Unauthenticated,
)
from coordinator.layout import check_same_layout, validate_payload
from coordinator.messages import (
    Attestation,
    AttestationReceipt,
    RoundStatus,
    SessionState,
    UnmaskHeader,
    UnmaskReceipt,
    UnmaskRefusal,
    UnmaskRequestView,
)
from coordinator.session_base import (
    SessionBase,
    Ticket,
    node_list,
    short_digest,
    verify_ed25519,
)
from coordinator.store import (
    AttestationRow,
    CorrectionRow,
    RefusalRow,
    RoundRow,
    SessionRow,
    UnmaskRow,
)
from noise.keys import key_fingerprint
from noise.transcript import survivor_attestation_message, survivor_set_hash

__all__ = ["UnmaskSteps"]

_MAX_REASON_CHARS = 2000


class UnmaskSteps(SessionBase):
    """Unmask requests, attestations, corrections and refusals (mixed into Session)."""

    def _request_unmask(
        self,
        round_row: RoundRow,
        attempt: int,
        survivors: list[str],
        dropped: list[str],
        now: int,
    ) -> None:
        """Inside a transaction: issue unmask attempt ``attempt`` for (S, D)."""
        row = self._session()
        digest = survivor_set_hash(
            row.config_hash, row.session_id, round_row.round_index, survivors, dropped
        )
        self.store.add_unmask_request(
            UnmaskRow(
                round_index=round_row.round_index,
                attempt=attempt,
                survivors=tuple(survivors),
                dropped=tuple(dropped),
                survivor_hash=digest,
                opened_ms=now,
                deadline_ms=now + self.config.unmask_timeout,
            )
        )
        self.store.update_round(
            round_row.round_index,
            status=RoundStatus.UNMASK,
            unmask_attempt=attempt,
            reason=(
                f"waiting for unmask corrections from {node_list(survivors)} "
                f"({node_list(dropped)} dropped)"
            ),
        )
        self._note(
            f"round {round_row.round_index} ({round_row.name!r}): {node_list(dropped)} dropped; "
            f"asking {node_list(survivors)} for unmask corrections (attempt {attempt})"
        )

    def _unmask_deadline(self, round_row: RoundRow, request: UnmaskRow, now: int) -> None:
        # Corrections can only be sent once every survivor has attested, so a
        # survivor that never attested must not take down those that attested
        # and were waiting for it: while attestations are missing, only the
        # silent ones are laggards; after that, those without a correction.
        attested = {
            a.node_id for a in self.store.attestations(round_row.round_index, request.attempt)
        }
        if set(request.survivors) - attested:
            answered = attested
        else:
            answered = {
                c.node_id for c in self.store.corrections(round_row.round_index, request.attempt)
            }
        laggards = set(request.survivors) - answered
        survivors = sorted(set(request.survivors) - laggards)
        dropped = sorted(set(request.dropped) | laggards)
        self._withdraw_streams("correction", round_row.round_index, laggards)
        why = (
            f"did not answer the unmask request for round {round_row.round_index} "
            f"({round_row.name!r}) before its deadline"
        )
        if len(survivors) < self.config.min_nodes:
            reason = (
                f"only {len(survivors)} of {len(request.survivors)} survivors answered the "
                f"unmask request for round {round_row.name!r} ({node_list(laggards)} dropped); "
                f"the federation requires at least {self.config.min_nodes}"
            )
            with self._transition():
                for node_id in sorted(laggards):
                    self.store.drop_member(node_id, round_row.round_index, why)
                self._fail(round_row, reason, now)
            self._forget_sum()
            return
        running = self._sum_for(round_row)
        try:
            if running is not None:
                for upload in self.store.uploads(round_row.round_index):
                    if upload.node_id in laggards:
                        running.subtract_file(self.store.payload_path(upload.path))
            with self._transition():
                for node_id in sorted(laggards):
                    self.store.drop_member(node_id, round_row.round_index, why)
                self._request_unmask(round_row, request.attempt + 1, survivors, dropped, now)
        except BaseException:
            self._forget_sum()
            raise

    def _current_unmask(
        self, session_id: str, round_index: int, node_id: str, caller: str
    ) -> tuple[SessionRow, RoundRow, UnmaskRow]:
        self.check_caller(caller, node_id)
        row = self._session()
        self._check_session_id(session_id, row)
        round_row = self._check_round(round_index, row)
        self._check_running(row)
        if round_row.status != RoundStatus.UNMASK:
            raise FailedPrecondition(
                f"round {round_index} ({round_row.name!r}) is not awaiting unmask corrections "
                f"(it is {round_row.status})."
            )
        request = self._unmask_row(round_row)
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

    def unmask_request(
        self, session_id: str, round_index: int, *, caller: str
    ) -> UnmaskRequestView:
        """What the coordinator asks of ``caller`` for a round (``pending`` False: nothing)."""
        with self._lock:
            self.check_caller(caller, caller)
            row = self._session()
            self._check_session_id(session_id, row)
            round_row = self._check_round(round_index, row)
            self._note_terminal(caller, row)
            return self._request_view(row, round_row, caller)

    def _request_view(self, row: SessionRow, round_row: RoundRow, caller: str) -> UnmaskRequestView:
        idle = UnmaskRequestView(
            session_id=row.session_id,
            round_index=round_row.round_index,
            round_name=round_row.name,
            pending=False,
        )
        if round_row.status != RoundStatus.UNMASK or row.state != SessionState.RUNNING:
            return idle
        request = self._unmask_row(round_row)
        answered = {
            c.node_id for c in self.store.corrections(round_row.round_index, request.attempt)
        }
        if caller not in request.survivors or caller in answered:
            return idle
        attestations = tuple(
            Attestation(
                session_id=row.session_id,
                round_index=a.round_index,
                node_id=a.node_id,
                survivor_hash=request.survivor_hash,
                signature=a.signature,
            )
            for a in self.store.attestations(round_row.round_index, request.attempt)
        )
        return UnmaskRequestView(
            session_id=row.session_id,
            round_index=round_row.round_index,
            round_name=round_row.name,
            pending=True,
            dropped=request.dropped,
            survivors=request.survivors,
            survivor_hash=request.survivor_hash,
            attestations=attestations,
            tensors=tuple(round_row.layout) if round_row.layout is not None else (),
            fixed_point_bits=int(round_row.fixed_point_bits or 0),
            deadline_ms=request.deadline_ms,
            min_survivors=self.config.min_nodes,
            attempt=request.attempt,
        )

    def attest(self, attestation: Attestation, *, caller: str) -> AttestationReceipt:
        """Record a survivor's signature over the current survivor set."""
        with self._lock:
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
            if not verify_ed25519(
                self.config.identity_keys[attestation.node_id], attestation.signature, message
            ):
                raise Unauthenticated(
                    f"{what}: the signature does not verify against the node's pinned identity key "
                    f"({key_fingerprint(self.config.identity_keys[attestation.node_id])})."
                )
            known = self.store.attestations(round_row.round_index, request.attempt)
            if attestation.node_id not in {a.node_id for a in known}:
                with self._transition():
                    self.store.add_attestation(
                        AttestationRow(
                            round_index=round_row.round_index,
                            attempt=request.attempt,
                            node_id=attestation.node_id,
                            signature=attestation.signature,
                            received_ms=self._clock(),
                        )
                    )
                    self._note(
                        f"round {round_row.round_index}: {attestation.node_id!r} attested the "
                        f"survivor set ({len(known) + 1} of {len(request.survivors)})"
                    )
            count = len(self.store.attestations(round_row.round_index, request.attempt))
            return AttestationReceipt(attested_count=count, survivor_count=len(request.survivors))

    def begin_unmask(self, header: UnmaskHeader, *, caller: str) -> Ticket | UnmaskReceipt:
        """Check a correction header; a duplicate is answered at once, else a ticket is returned."""
        with self._lock:
            self.check_caller(caller, header.node_id)
            row = self._session()
            self._check_session_id(header.session_id, row)
            round_row = self._check_round(header.round_index, row)
            self._check_round_name(round_row, header.round_name)
            if round_row.status == RoundStatus.UNMASK:
                request = self._unmask_row(round_row)
                stored = next(
                    (
                        c
                        for c in self.store.corrections(header.round_index, request.attempt)
                        if c.node_id == header.node_id
                    ),
                    None,
                )
                if stored is not None and header.survivor_hash == request.survivor_hash:
                    return self._duplicate_correction(stored, header.payload.sha256, request, row)
            row, round_row, request = self._current_unmask(
                header.session_id, header.round_index, header.node_id, caller
            )
            what = f"unmask correction of node {header.node_id!r} for round {header.round_index}"
            self._check_request_match(request, header.dropped, header.survivor_hash, what)
            attested = {
                a.node_id for a in self.store.attestations(header.round_index, request.attempt)
            }
            missing = set(request.survivors) - attested
            if missing:
                raise FailedPrecondition(
                    f"{what}: not every survivor has attested the survivor set yet "
                    f"({node_list(missing)} missing); answer once all have."
                )
            spec = header.payload
            layout = validate_payload(spec, what=what, max_bytes=self.config.max_payload_bytes)
            self._check_bits(spec, what)
            assert round_row.layout is not None
            check_same_layout(layout, round_row.layout, what=what)
            if spec.fixed_point_bits != round_row.fixed_point_bits:
                raise InvalidArgument(
                    f"{what}: fixed_point_bits is {spec.fixed_point_bits}; this round's "
                    f"payloads use {round_row.fixed_point_bits}."
                )
            key = ("correction", header.round_index, header.node_id)
            if key in self._tickets:
                raise RetryLater(f"{what}: another stream of it is in progress; retry later.")
            ticket = Ticket(
                kind="correction",
                round_index=header.round_index,
                node_id=header.node_id,
                spec=spec,
                writer=self.store.new_payload(),
                attempt=request.attempt,
            )
            self._tickets[key] = ticket
            return ticket

    def _duplicate_correction(
        self, stored: CorrectionRow, sha256: bytes, request: UnmaskRow, row: SessionRow
    ) -> UnmaskReceipt:
        if stored.sha256 != sha256:
            raise FailedPrecondition(
                f"conflicting unmask correction: node {stored.node_id!r} already answered round "
                f"{stored.round_index} (attempt {stored.attempt}) with sha256 "
                f"{short_digest(stored.sha256)}; this one has sha256 {short_digest(sha256)}."
            )
        return UnmaskReceipt(
            session_id=row.session_id,
            round_index=stored.round_index,
            node_id=stored.node_id,
            accepted=True,
            duplicate=True,
            sha256=stored.sha256,
            received_count=len(self.store.corrections(stored.round_index, stored.attempt)),
            survivor_count=len(request.survivors),
        )

    def _commit_correction(self, ticket: Ticket) -> UnmaskReceipt:
        if ticket.cancelled:
            raise FailedPrecondition(self._cancelled_sentence(ticket))
        row = self._session()
        self._check_running(row)
        round_row = self._round_row(ticket.round_index)
        if round_row.status != RoundStatus.UNMASK or round_row.unmask_attempt != ticket.attempt:
            raise FailedPrecondition(
                f"{ticket.what}: the unmask request changed while the correction was in "
                "progress; fetch the request again."
            )
        request = self._unmask_row(round_row)
        now = self._clock()
        name = self.store.correction_name(
            ticket.round_index, ticket.attempt, ticket.node_id, ticket.spec.sha256
        )
        ticket.writer.place(name)
        correction = CorrectionRow(
            round_index=ticket.round_index,
            attempt=ticket.attempt,
            node_id=ticket.node_id,
            sha256=ticket.spec.sha256,
            size=ticket.spec.total_bytes,
            path=name,
            received_ms=now,
        )
        stored = self.store.corrections(ticket.round_index, ticket.attempt)
        answered = {c.node_id for c in stored} | {ticket.node_id}
        complete = set(request.survivors) <= answered
        result: tuple[str, bytes] | None = None
        try:
            if complete:
                running = self._sum_for(round_row)
                assert running is not None
                for earlier in stored:
                    running.subtract_file(self.store.payload_path(earlier.path))
                running.subtract_file(self.store.payload_path(name))
                result = self._write_result(running, ticket.round_index)
            with self._transition():
                self.store.add_correction(correction)
                self._note(
                    f"round {round_row.round_index} ({round_row.name!r}): stored the unmask "
                    f"correction of {ticket.node_id!r} ({len(answered)} of "
                    f"{len(request.survivors)})"
                )
                if result is not None:
                    self._publish(
                        round_row, list(request.survivors), list(request.dropped), result, now
                    )
        except BaseException:
            if complete:
                self._forget_sum()
            if result is not None:
                self._unlink_placed(self.store.payload_path(result[0]))
            raise
        ticket.committed = True
        self.abandon(ticket)
        if complete:
            self._forget_sum()
        return UnmaskReceipt(
            session_id=row.session_id,
            round_index=ticket.round_index,
            node_id=ticket.node_id,
            accepted=True,
            duplicate=False,
            sha256=ticket.spec.sha256,
            received_count=len(answered),
            survivor_count=len(request.survivors),
        )

    def refuse_unmask(self, refusal: UnmaskRefusal, *, caller: str) -> UnmaskReceipt:
        """Record a survivor's refusal; the round cannot be completed and the session fails."""
        with self._lock:
            row, round_row, request = self._current_unmask(
                refusal.session_id, refusal.round_index, refusal.node_id, caller
            )
            what = f"unmask refusal of node {refusal.node_id!r} for round {refusal.round_index}"
            self._check_request_match(request, refusal.dropped, refusal.survivor_hash, what)
            text = " ".join(refusal.reason.split())[:_MAX_REASON_CHARS]
            if not text:
                raise InvalidArgument(f"{what}: the refusal gives no reason.")
            now = self._clock()
            reason = (
                f"node {refusal.node_id!r} refused to unmask round {round_row.round_index} "
                f"({round_row.name!r}): {text}"
            )
            with self._transition():
                self.store.add_refusal(
                    RefusalRow(
                        round_index=round_row.round_index,
                        attempt=request.attempt,
                        node_id=refusal.node_id,
                        reason=text,
                        received_ms=now,
                    )
                )
                self._fail(round_row, reason, now)
            self._withdraw_streams("correction", round_row.round_index, set(request.survivors))
            self._forget_sum()
            return UnmaskReceipt(
                session_id=row.session_id,
                round_index=round_row.round_index,
                node_id=refusal.node_id,
                accepted=False,
                duplicate=False,
                sha256=b"",
                received_count=len(self.store.corrections(round_row.round_index, request.attempt)),
                survivor_count=len(request.survivors),
            )
