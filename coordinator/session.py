"""The coordinator's session state machine: joins, roster, rounds, dropouts, unmasking.

Plain Python over the SQLite store (coordinator/store.py); no gRPC. Every
method either raises a :class:`~coordinator.errors.CoordinatorError` *before*
writing anything, or performs its transition in one store transaction, so a
refused message leaves the state exactly as it was and a crash at any instant
leaves a state the next start resumes from.

Lifecycle (DESIGN.md §4):

* **joining**: nodes post signed ephemeral keys until every federation node
  has joined or the join deadline passes; fewer than ``min_nodes`` joined
  ends the session (failed), otherwise round 0 opens with the joined nodes.
* **running**: round r is *open* for uploads from its participants (the live
  nodes when it opened). Once all have uploaded, the wrapping sum is the
  result (*ready*) and the next round opens with the same nodes. At the
  deadline the missing participants are dropped for the rest of the session;
  with fewer than ``min_nodes`` survivors the session fails, otherwise the
  round awaits *unmask* corrections: every survivor attests the survivor set
  (S, D) with its identity key, sees every other survivor's attestation, and
  streams its pair terms with D (or refuses, which ends the session). The
  result is Σ_S uploads − Σ_S corrections, the exact sum over survivors
  (Bonawitz et al. 2017, ACM CCS, §4). A survivor silent at the unmask
  deadline moves from S to D, its upload leaves the sum, and the request is
  reissued. Under CAPE a model-round dropout reruns the CAPE sum instead
  (coordinator/config.py).
* **completed** after the last round, **failed** with a reason otherwise.

Uploads are idempotent per (session, round, node) and content hash: the same
payload again is acknowledged as a duplicate; a different one is refused.
Chunks are added to the round's running sum as they arrive
(coordinator/aggregate.py), so memory does not grow with the number of nodes.

A node that stops on purpose before uploading (its output checker rejected
the egress, its budget or noise floor would be broken) withdraws at once
instead of leaving everyone to wait for the deadline
(coordinator/withdraw.py): it is dropped with its reason, and the round takes
the deadline's path as soon as every participant still live has uploaded.

This module holds the session's life: start or resume, joins and roster,
deadlines, results and status. Receiving uploads is in coordinator/uploads.py,
unmasking in coordinator/unmask.py, withdrawals in coordinator/withdraw.py,
the shared machinery in coordinator/session_base.py.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

from coordinator.config import SessionConfig, is_cape_sum_round
from coordinator.errors import (
    FailedPrecondition,
    NotFound,
    StateFileError,
    Unauthenticated,
)
from coordinator.layout import PayloadSpec
from coordinator.messages import (
    DroppedNode,
    JoinReceipt,
    ResultView,
    RosterView,
    RoundDeadline,
    RoundStatus,
    RoundSummary,
    SessionState,
    StatusView,
    UploadStatement,
)
from coordinator.session_base import (
    MAX_CHUNK_BYTES,
    Ticket,
    clock_text,
    node_list,
    wall_clock_ms,
)
from coordinator.store import (
    RoundRow,
    SessionRow,
    Store,
)
from coordinator.unmask import UnmaskSteps
from coordinator.uploads import UploadSteps
from coordinator.withdraw import WithdrawSteps
from noise.errors import SignatureError
from noise.keys import KeyBundle, key_fingerprint, verify_key_bundle
from noise.transcript import roster_hash, survivor_set_hash

__all__ = ["MAX_CHUNK_BYTES", "Session", "Ticket", "wall_clock_ms"]


class Session(UploadSteps, UnmaskSteps, WithdrawSteps):
    """One federation session, resumed from (or created in) ``store``.

    ``clock`` returns Unix milliseconds; tests pass a fake one. ``log``
    receives one line per transition (a node joined, a round is ready, a node
    was dropped), after the transition has been committed. All public
    methods are thread-safe; payload chunks are received without holding the
    session lock.
    """

    def __init__(
        self,
        store: Store,
        config: SessionConfig,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        log: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(store, config, clock=clock, log=log)
        self._open_or_resume()

    def _open_or_resume(self) -> None:
        self.store.recover()
        row = self.store.session()
        now = self._clock()
        if row is None:
            with self._transition():
                self.store.create_session(
                    session_id=secrets.token_hex(16),
                    config_hash=self.config.config_hash,
                    federation_id=self.config.federation_id,
                    created_ms=now,
                    join_deadline_ms=now + self.config.join_timeout_ms,
                )
            return
        if row.config_hash != self.config.config_hash:
            raise StateFileError(
                f"state file {self.store.path} belongs to the federation config with hash "
                f"{row.config_hash.hex()[:16]}…, but the federation file now hashes to "
                f"{self.config.config_hash.hex()[:16]}…; start with a new --state path."
            )
        self.resumed = True
        self._extend_deadlines(row, now)

    def _extend_deadlines(self, row: SessionRow, now: int) -> None:
        """The coordinator's own downtime never counts against the nodes.

        A deadline of the phase in progress is moved to at least ``now`` plus
        that phase's full period.
        """
        with self._transition():
            if row.state == SessionState.JOINING:
                self.store.update_session(
                    join_deadline_ms=max(row.join_deadline_ms, now + self.config.join_timeout_ms)
                )
            elif row.state == SessionState.RUNNING and row.current_round is not None:
                current = self._round_row(row.current_round)
                if current.status == RoundStatus.OPEN:
                    deadline = max(current.deadline_ms, now + self.config.round_timeout_ms)
                    self.store.update_round(current.round_index, deadline_ms=deadline)
                elif current.status == RoundStatus.UNMASK:
                    request = self._unmask_row(current)
                    deadline = max(request.deadline_ms, now + self.config.unmask_timeout)
                    self.store.update_unmask_deadline(
                        current.round_index, request.attempt, deadline
                    )

    def join(self, bundle: KeyBundle, *, caller: str) -> JoinReceipt:
        """Record a node's signed ephemeral key (idempotent for the same bundle)."""
        with self._lock:
            row = self._session()
            self.check_caller(caller, bundle.node_id)
            try:
                verify_key_bundle(
                    bundle,
                    self.config.identity_keys[bundle.node_id],
                    config_hash=self.config.config_hash,
                    session_id=row.session_id,
                    node_id=caller,
                )
            except SignatureError as error:
                raise Unauthenticated(str(error)) from None
            members = {m.node_id: m for m in self.store.members()}
            existing = members.get(bundle.node_id)
            if existing is not None:
                if (
                    existing.public_key == bundle.public_key
                    and existing.signature == bundle.signature
                ):
                    return self._join_receipt(
                        row, bundle.node_id, rejoined=True, count=len(members)
                    )
                raise FailedPrecondition(
                    f"node {bundle.node_id!r} already joined session {row.session_id!r} with key "
                    f"{key_fingerprint(existing.public_key)}; a second key "
                    f"{key_fingerprint(bundle.public_key)} is refused."
                )
            if row.state != SessionState.JOINING or row.roster_final:
                raise FailedPrecondition(
                    f"the join phase of session {row.session_id!r} has closed; node "
                    f"{bundle.node_id!r} is excluded from this session."
                )
            now = self._clock()
            if now >= row.join_deadline_ms:
                raise FailedPrecondition(
                    f"the join deadline of session {row.session_id!r} passed at "
                    f"{clock_text(row.join_deadline_ms)}; node {bundle.node_id!r} is excluded "
                    "from this session."
                )
            with self._transition():
                self.store.add_member(bundle.node_id, bundle.public_key, bundle.signature, now)
                self.store.update_session(roster_version=row.roster_version + 1)
                self._note(
                    f"node {bundle.node_id!r} joined ({len(members) + 1} of "
                    f"{len(self.config.node_ids)}, key {key_fingerprint(bundle.public_key)})"
                )
                if len(members) + 1 == len(self.config.node_ids):
                    self._close_join(now)
            return self._join_receipt(self._session(), bundle.node_id, False, len(members) + 1)

    def _join_receipt(
        self, row: SessionRow, node_id: str, rejoined: bool, count: int
    ) -> JoinReceipt:
        return JoinReceipt(
            session_id=row.session_id,
            node_id=node_id,
            rejoined=rejoined,
            joined_count=count,
            federation_size=len(self.config.node_ids),
            join_deadline_ms=row.join_deadline_ms,
        )

    def _close_join(self, now: int) -> None:
        """Inside a transaction: make the roster final; open round 0 or fail."""
        joined = [m.node_id for m in self.store.members()]
        missing = sorted(set(self.config.node_ids) - set(joined))
        if len(joined) < self.config.min_nodes:
            reason = (
                f"only {len(joined)} of {len(self.config.node_ids)} nodes joined before the "
                f"join deadline ({node_list(missing)} missing); the federation requires at "
                f"least {self.config.min_nodes}"
            )
            self.store.update_session(
                roster_final=1, state=SessionState.FAILED, reason=reason, ended_ms=now
            )
            self._note(f"session failed: {reason}")
            return
        self.store.update_session(roster_final=1, state=SessionState.RUNNING)
        excluded = f"; excluded: {node_list(missing)}" if missing else ""
        self._note(f"roster final: {node_list(joined)} joined{excluded}")
        first = self.config.next_round_name(None)
        assert first is not None
        self._open_round(0, first, joined, now)

    def roster(self, session_id: str, *, caller: str) -> RosterView:
        """Every joined node's signed bundle and whether the roster is final."""
        with self._lock:
            self.check_caller(caller, caller)
            row = self._session()
            self._check_session_id(session_id, row)
            members = self.store.members()
            bundles = tuple(
                KeyBundle(
                    config_hash=row.config_hash,
                    session_id=row.session_id,
                    node_id=m.node_id,
                    public_key=m.public_key,
                    signature=m.signature,
                )
                for m in members
            )
            joined = {m.node_id for m in members}
            excluded = (
                tuple(n for n in self.config.node_ids if n not in joined)
                if row.roster_final
                else ()
            )
            return RosterView(
                session_id=row.session_id,
                config_hash=row.config_hash,
                bundles=bundles,
                version=row.roster_version,
                roster_hash=roster_hash(row.config_hash, row.session_id, bundles),
                final=row.roster_final,
                join_deadline_ms=row.join_deadline_ms,
                excluded=excluded,
                round_deadline_seconds=self.config.round_timeout_ms / 1000.0,
                round_deadlines=tuple(
                    RoundDeadline(r.round_index, r.name, r.deadline_ms) for r in self.store.rounds()
                ),
            )

    def tick(self, now: int | None = None) -> None:
        """Apply every deadline that has passed at ``now`` (default: the clock)."""
        with self._lock:
            now = self._clock() if now is None else now
            row = self._session()
            if row.state == SessionState.JOINING:
                if now >= row.join_deadline_ms:
                    with self._transition():
                        self._close_join(now)
                return
            if row.state != SessionState.RUNNING or row.current_round is None:
                return
            current = self._round_row(row.current_round)
            if current.status == RoundStatus.OPEN and (
                now >= current.deadline_ms or self._only_withdrawn_missing(current)
            ):
                self._round_deadline(current, now)
            elif current.status == RoundStatus.UNMASK:
                request = self._unmask_row(current)
                if now >= request.deadline_ms:
                    self._unmask_deadline(current, request, now)

    def _round_deadline(self, round_row: RoundRow, now: int) -> None:
        uploaded = {u.node_id for u in self.store.uploads(round_row.round_index)}
        participants = set(round_row.participants)
        missing = participants - uploaded
        survivors = sorted(participants & uploaded)
        # Nodes that withdrew are dropped already, with their own reason.
        live = self.store.live_node_ids()
        late = sorted(missing & live)
        self._withdraw_streams("upload", round_row.round_index, missing)
        why = f"missed the deadline of round {round_row.round_index} ({round_row.name!r})"
        if len(survivors) < self.config.min_nodes:
            withdrawals = self._withdrawal_notes(round_row)
            reason = (
                f"only {len(survivors)} of {len(participants)} nodes submitted round "
                f"{round_row.name!r} ({node_list(missing)} dropped); the federation requires at "
                f"least {self.config.min_nodes}" + (f"; {withdrawals}" if withdrawals else "")
            )
            with self._transition():
                for node_id in late:
                    self.store.drop_member(node_id, round_row.round_index, why)
                self._fail(round_row, reason, now)
            self._forget_sum()
            return
        if self.config.construction == "cape" and not is_cape_sum_round(round_row.name):
            rerun = self.config.next_round_name(round_row.name, superseded=True)
            assert rerun is not None
            reason = (
                f"{node_list(missing)} dropped after the CAPE sum of round {round_row.name!r}; "
                f"their CAPE noise would not cancel, so {rerun!r} and {round_row.name!r} are "
                f"rerun among the {len(survivors)} survivors from round "
                f"{round_row.round_index + 1}"
            )
            with self._transition():
                for node_id in late:
                    self.store.drop_member(node_id, round_row.round_index, why)
                self.store.update_round(
                    round_row.round_index, status=RoundStatus.SUPERSEDED, reason=reason
                )
                self._note(f"round {round_row.round_index} ({round_row.name!r}): {reason}")
                self._open_round(round_row.round_index + 1, rerun, survivors, now)
            self._forget_sum()
            return
        with self._transition():
            for node_id in late:
                self.store.drop_member(node_id, round_row.round_index, why)
            self._request_unmask(round_row, 1, survivors, sorted(missing), now)

    def result(self, session_id: str, round_index: int, *, caller: str) -> ResultView:
        """A round's status and, when ready, where its aggregate is stored."""
        with self._lock:
            self.check_caller(caller, caller)
            row = self._session()
            self._check_session_id(session_id, row)
            round_row = self.store.round(round_index)
            if round_row is None:
                current = (
                    "no round has opened yet"
                    if row.current_round is None
                    else (f"the current round is {row.current_round}")
                )
                raise NotFound(f"round_index {round_index} has not opened; {current}.")
            self._note_terminal(caller, row)
            survivors: tuple[str, ...] = ()
            dropped: tuple[str, ...] = ()
            digest = b""
            payload: PayloadSpec | None = None
            path: Path | None = None
            statements: tuple[UploadStatement, ...] = ()
            deadline = round_row.deadline_ms
            status = round_row.status
            if status == RoundStatus.READY:
                stored = self.store.result(round_index)
                assert stored is not None and round_row.layout is not None
                survivors, dropped = stored.survivors, stored.dropped
                digest = survivor_set_hash(
                    row.config_hash, row.session_id, round_index, survivors, dropped
                )
                payload = PayloadSpec(
                    total_bytes=stored.size,
                    total_elements=stored.size // 8,
                    sha256=stored.sha256,
                    fixed_point_bits=int(round_row.fixed_point_bits or 0),
                    tensors=tuple(round_row.layout),
                )
                path = self.store.payload_path(stored.path)
                statements = self._statements(row, round_row, survivors)
            elif status == RoundStatus.UNMASK:
                request = self._unmask_row(round_row)
                survivors, dropped, digest = (
                    request.survivors,
                    request.dropped,
                    request.survivor_hash,
                )
                deadline = request.deadline_ms
            elif status == RoundStatus.OPEN:
                survivors = round_row.participants
            else:
                dropped = tuple(
                    m.node_id for m in self.store.members() if m.dropped_round == round_index
                )
                survivors = tuple(sorted(set(round_row.participants) - set(dropped)))
            reason = round_row.reason
            if row.state == SessionState.FAILED and status != RoundStatus.READY:
                reason = row.reason
            request_view = self._request_view(row, round_row, caller)
            return ResultView(
                session_id=row.session_id,
                round_index=round_index,
                round_name=round_row.name,
                status=status,
                reason=reason,
                deadline_ms=deadline,
                survivors=survivors,
                dropped=dropped,
                survivor_hash=digest,
                payload=payload,
                path=path,
                unmask_request=request_view if request_view.pending else None,
                statements=statements,
            )

    def _statements(
        self, row: SessionRow, round_row: RoundRow, survivors: tuple[str, ...]
    ) -> tuple[UploadStatement, ...]:
        """The stored upload statement of every survivor (the uploads in the aggregate)."""
        final = self._roster_hash(row)
        counted = set(survivors)
        return tuple(
            UploadStatement(
                node_id=upload.node_id,
                round_name=round_row.name,
                roster_hash=final,
                payload_sha256=upload.sha256,
                signature=upload.statement_signature,
            )
            for upload in self.store.uploads(round_row.round_index)
            if upload.node_id in counted
        )

    def record_delivery(self, round_index: int, node_id: str) -> None:
        """Note that ``node_id`` was sent the whole result of a round."""
        with self._lock, self.store.transaction():
            self.store.add_delivery(round_index, node_id, self._clock())

    def status(self, session_id: str = "", *, caller: str | None = None) -> StatusView:
        """Where the session is. ``session_id`` may be empty (a node learning the id)."""
        with self._lock:
            if caller is not None:
                self.check_caller(caller, caller)
            row = self._session()
            if session_id:
                self._check_session_id(session_id, row)
            if caller is not None:
                self._note_terminal(caller, row)
            members = self.store.members()
            joined = tuple(m.node_id for m in members)
            rounds = self.store.rounds()
            summaries = []
            for r in rounds:
                dropped = tuple(m.node_id for m in members if m.dropped_round == r.round_index)
                deadline = r.deadline_ms
                if r.status == RoundStatus.UNMASK:
                    deadline = self._unmask_row(r).deadline_ms
                summaries.append(
                    RoundSummary(
                        round_index=r.round_index,
                        round_name=r.name,
                        status=r.status,
                        submitted=tuple(u.node_id for u in self.store.uploads(r.round_index)),
                        dropped=dropped,
                        deadline_ms=deadline,
                        reason=r.reason,
                    )
                )
            current = rounds[-1] if rounds else None
            return StatusView(
                session_id=row.session_id,
                state=row.state,
                config_hash=row.config_hash,
                federation_id=row.federation_id,
                current_round_index=current.round_index if current else 0,
                current_round_name=current.name if current else "",
                joined=joined,
                submitted=summaries[-1].submitted if summaries else (),
                excluded=(
                    tuple(n for n in self.config.node_ids if n not in set(joined))
                    if row.roster_final
                    else ()
                ),
                reason=row.reason,
                join_deadline_ms=row.join_deadline_ms,
                min_nodes=self.config.min_nodes,
                rounds=tuple(summaries),
                dropped_nodes=tuple(
                    DroppedNode(m.node_id, int(m.dropped_round or 0), m.dropped_reason)
                    for m in members
                    if m.status == "dropped"
                ),
            )

    def ended(self) -> bool:
        """True once the session completed or failed."""
        return self.state() in (SessionState.COMPLETED, SessionState.FAILED)

    def everyone_informed(self) -> bool:
        """True when every live node has learnt the outcome (final result sent, or failure seen)."""
        with self._lock:
            row = self._session()
            live = self.store.live_node_ids()
            if row.state == SessionState.COMPLETED and row.current_round is not None:
                return live <= self.store.deliveries(row.current_round)
            if row.state == SessionState.FAILED:
                return live <= self._notified
            return False
