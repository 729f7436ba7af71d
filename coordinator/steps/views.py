"""What a node or an operator may read: the roster, a round's result, unmask requests, status.

Reading only: nothing here changes the session's state. The one thing a view
records is what the caller has learnt: a node that was sent a round's whole
result is noted in the store (its delivery), and a node that saw the
session's failure is noted in memory, so the coordinator knows when everyone
has been told the outcome and may stop (``zerosum coordinator`` lingers until
then, or until its linger time runs out).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.context import CoordinatorContext
from coordinator.errors import NotFound
from coordinator.layout import PayloadSpec
from coordinator.messages import ResultView
from coordinator.steps.checks import check_in_roster, check_round, check_session_id
from coordinator.store import AttestationRow, RoundRow, SessionRow, UploadRow
from noise.keys import KeyBundle
from noise.transcript import roster_hash, sealed_tree, survivor_set_hash
from proto.messages import (
    Attestation,
    DroppedNode,
    RosterView,
    RoundDeadline,
    RoundState,
    RoundSummary,
    Sealed,
    SessionState,
    SessionStatus,
    UnmaskRequest,
    UploadStatement,
)

__all__ = ["Views"]

# Rounds (or unmask attempts) whose relayed copies are kept indexed at once.
_RELAY_STATES = 2


_Copies = tuple[tuple[str, bytes, bytes], ...]  # (recipient, sealed, signature), as stored


def relayed_copies(sender: str, copies: _Copies) -> tuple[Sealed, ...]:
    """A sender's stored copies as relayed: each with its place and audit path in the
    sender's tree (``noise.transcript.sealed_tree``), what its recipient needs to check
    the sender's one signature."""
    if not copies:
        return ()
    tree = sealed_tree({recipient: sealed for recipient, sealed, _ in copies})
    place = {recipient: leaf for leaf, recipient in enumerate(tree.recipients)}
    return tuple(
        Sealed(
            sender,
            recipient,
            sealed,
            signature,
            place[recipient],
            tree.count,
            tree.paths[place[recipient]],
        )
        for recipient, sealed, signature in copies
        if recipient != sender
    )


class _RelayIndex:
    """One kind of relayed copy in one round (and unmask attempt), by recipient.

    Grown row by row: upload and attestation rows are only ever added, so
    when a round's rows are read again with one more, only the new row's
    copies are indexed (its tree built once), not the round's K^2 again. A
    row that is gone or changed (nothing the coordinator does, but cheap to
    notice) makes the index start again.
    """

    def __init__(self) -> None:
        self._rows: dict[str, object] = {}  # sender -> the row its copies came from
        self._by: dict[str, dict[str, Sealed]] = {}  # recipient -> sender -> copy
        self._sorted: dict[str, tuple[Sealed, ...]] = {}

    def update(self, rows: dict[str, tuple[object, _Copies]]) -> None:
        """Take ``rows`` (sender -> (row, its stored copies)): all rows of the round so far."""
        known = self._rows
        if len(rows) < len(known) or any(
            (now := rows.get(sender)) is None or (now[0] is not row and now[0] != row)
            for sender, row in known.items()
        ):
            known.clear()
            self._by.clear()
            self._sorted.clear()
        for sender, (row, copies) in rows.items():
            if sender in known:
                continue
            known[sender] = row
            for copy in relayed_copies(sender, copies):
                self._by.setdefault(copy.recipient, {})[sender] = copy
                self._sorted.pop(copy.recipient, None)

    def get(self, recipient: str) -> tuple[Sealed, ...]:
        """The copies sealed for ``recipient``, in sender order."""
        found = self._sorted.get(recipient)
        if found is None:
            by_sender = self._by.get(recipient, {})
            found = self._sorted[recipient] = tuple(by_sender[s] for s in sorted(by_sender))
        return found


@dataclass
class _Relays:
    """A round's uploads and attestations, and what they relay, indexed by recipient.

    Brought up to date when those rows change (an upload or an attestation
    added), so a poll costs O(K) instead of decoding every sealed message of
    the round. ``tags``/``challenge``: recipient -> the copies sealed for it,
    in sender order, each with its place and audit path in its sender's tree.
    """

    round_index: int
    attempt: int
    uploads: tuple[UploadRow, ...] = ()
    attestations: tuple[AttestationRow, ...] = ()
    tags: _RelayIndex = field(default_factory=_RelayIndex)
    challenge: _RelayIndex = field(default_factory=_RelayIndex)


class _HeldPolls:
    """The rounds held result polls wait on, and a count of the changes to them.

    After every commit (CoordinatorContext.listen, under the session lock)
    the progress of each round a poll waits on is computed once and compared
    with its value after the previous commit; only a change wakes the polls.
    A commit that changes nothing a node acts on (another node's upload, one
    more attestation) so costs one progress read, not a wake-up and a read
    for each of the K polls held, which at K nodes and 4K commits a round
    would be 4K^2 of them.

    No change is missed: a poll registers its round (which records the
    progress then) before it reads the count and the progress it decides
    on, and every commit after that read is followed, under the same lock,
    by a comparison that sees it (the progress only changes by commits).
    """

    def __init__(self, ctx: CoordinatorContext, progress: Callable[[int], tuple[object, ...]]):
        self._ctx = ctx
        self._progress = progress
        self._changed = threading.Condition(threading.Lock())
        self._waiting: Counter[int] = Counter()
        # Round -> its progress after the last commit.
        self._last: dict[int, tuple[object, ...]] = {}
        self.changes = 0
        ctx.listen(self._committed)

    def _committed(self) -> None:
        changed = False
        for round_index in tuple(self._waiting):
            now = self._progress(round_index)
            if self._last.get(round_index) != now:
                self._last[round_index] = now
                changed = True
        if changed:
            with self._changed:
                self.changes += 1
                self._changed.notify_all()

    def enter(self, round_index: int) -> None:
        """A poll starts waiting on ``round_index``."""
        with self._ctx.lock:
            if not self._waiting[round_index]:
                self._last[round_index] = self._progress(round_index)
            self._waiting[round_index] += 1

    def leave(self, round_index: int) -> None:
        """A poll of ``round_index`` is answered."""
        with self._ctx.lock:
            self._waiting[round_index] -= 1
            if not self._waiting[round_index]:
                del self._waiting[round_index]
                self._last.pop(round_index, None)

    def wait(self, seen: int, timeout: float) -> None:
        """Wait until the count of changes differs from ``seen``, or ``timeout`` seconds."""
        with self._changed:
            self._changed.wait_for(lambda: self.changes != seen, timeout)


class Views:
    """Roster, results, unmask requests and status as the nodes see them."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx
        # Nodes that have seen the session's failure (in memory: after a
        # restart they are told again, which is harmless). Only GetStatus
        # counts: a node that sees a round FAILED in GetResult asks GetStatus
        # next for the session's reason, so stopping the server as soon as
        # GetResult had answered would leave that call unanswered.
        self._notified: set[str] = set()
        # Per caller: the round, what of it the caller acts on (_progress) and
        # whether it was still under way, of the last result view it was sent
        # (held polls).
        self._sent: dict[str, tuple[int, tuple[object, ...], bool]] = {}
        self._relay_states: dict[tuple[int, int], _Relays] = {}
        self._held = _HeldPolls(ctx, self._progress)

    def _relays(self, round_index: int, attempt: int) -> _Relays:
        """The round's relayed messages by recipient, as of the last commit (under the lock).

        Brought up to date only when the round's uploads or the attempt's
        attestations changed: the store remembers those rows across commits to
        other tables, and the same row objects compare by identity, so checking
        costs O(K).
        """
        uploads = tuple(self.ctx.store.uploads(round_index))
        attestations = tuple(self.ctx.store.attestations(round_index, attempt))
        relays = self._relay_states.get((round_index, attempt))
        if relays is None:
            # A few at once: nodes still fetching the last round's result read its tags
            # while the others are in the unmask step of the next.
            while len(self._relay_states) >= _RELAY_STATES:
                del self._relay_states[min(self._relay_states)]
            relays = self._relay_states[(round_index, attempt)] = _Relays(round_index, attempt)
        if relays.uploads != uploads:
            relays.challenge.update({u.node_id: (u, u.challenge) for u in uploads})
            relays.uploads = uploads
        if relays.attestations != attestations:
            relays.tags.update({a.node_id: (a, a.tags) for a in attestations})
            relays.attestations = attestations
        return relays

    def _note_terminal(self, caller: str, row: SessionRow) -> None:
        if row.state == SessionState.ABORTED:
            self._notified.add(caller)

    def roster(self, session_id: str, *, caller: str) -> RosterView:
        """Every joined node's signed bundle and whether the roster is final."""
        ctx = self.ctx
        with ctx.lock:
            check_in_roster(ctx, caller, caller, while_joining=True)
            row = ctx.session()
            check_session_id(session_id, row)
            members = ctx.store.members()
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
                tuple(n for n in ctx.config.node_ids if n not in joined) if row.roster_final else ()
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
                round_deadline_seconds=ctx.config.round_timeout_ms / 1000.0,
                round_deadlines=tuple(
                    RoundDeadline(r.round_index, r.name, r.deadline_ms) for r in ctx.store.rounds()
                ),
            )

    def result(
        self, session_id: str, round_index: int, *, caller: str, hold_seconds: float = 0.0
    ) -> ResultView:
        """A round's status and, when ready, where its aggregate is stored.

        ``hold_seconds`` > 0 makes a repeated poll a long poll: when the
        caller was last sent this round, still open or awaiting unmask, and
        nothing it acts on has changed since (:meth:`_progress`: the status,
        the reason, the unmask attempt and its survivor set, whether every
        survivor has attested), the answer waits (without the session lock) until a
        transition changes one of them or ``hold_seconds`` pass. A node that
        polls in a loop so hears of each step of its round as it commits, and
        neither it nor the coordinator spends anything on the commits between
        (another node's upload, one more attestation): the held polls are
        woken only by a change to what they wait on (:class:`_HeldPolls`).
        """
        sent = self._sent.get(caller)
        give_up = time.monotonic() + hold_seconds
        held = self._held
        entered = False
        try:
            while True:
                seen = held.changes
                # Read before the view, so a change while the view is built is
                # answered at once next time.
                progress = self._progress(round_index)
                remaining = give_up - time.monotonic()
                if sent != (round_index, progress, True) or remaining <= 0:
                    break
                if not entered:
                    # Registered first, then read again: a commit after that
                    # read is compared against what it read (_HeldPolls).
                    held.enter(round_index)
                    entered = True
                    continue
                held.wait(seen, remaining)
        finally:
            if entered:
                held.leave(round_index)
        view = self._result(session_id, round_index, caller=caller)
        under_way = view.status in (RoundState.OPEN, RoundState.AWAITING_UNMASK)
        self._sent[caller] = (round_index, progress, under_way)
        return view

    def _progress(self, round_index: int) -> tuple[object, ...]:
        """What of a round its nodes act on: a long poll is held until it changes.

        The session's state and reason, the round's status, reason and unmask
        attempt, and during the unmask step its survivor set and whether every
        survivor has attested (``None`` for a round not opened: the view says so).
        """
        ctx = self.ctx
        with ctx.lock:
            row = ctx.store.session()
            round_row = ctx.store.round(round_index)
            if row is None or round_row is None:
                return (None,)
            asked: tuple[object, ...] = ()
            if round_row.status == RoundState.AWAITING_UNMASK:
                request = ctx.unmask_row(round_row)
                signed = len(ctx.store.attestations(round_index, request.attempt))
                asked = (request.survivor_hash, signed >= len(request.survivors))
            return (
                row.state,
                row.reason,
                round_row.status,
                round_row.reason,
                round_row.unmask_attempt,
                *asked,
            )

    def _result(self, session_id: str, round_index: int, *, caller: str) -> ResultView:
        ctx = self.ctx
        with ctx.lock:
            check_in_roster(ctx, caller, caller)
            row = ctx.session()
            check_session_id(session_id, row)
            round_row = ctx.store.round(round_index)
            if round_row is None:
                current = (
                    "no round has opened yet"
                    if row.current_round is None
                    else (f"the current round is {row.current_round}")
                )
                raise NotFound(f"round_index {round_index} has not opened; {current}.")
            survivors: tuple[str, ...] = ()
            dropped: tuple[str, ...] = ()
            digest = b""
            payload: PayloadSpec | None = None
            path: Path | None = None
            statements: tuple[UploadStatement, ...] = ()
            tags: tuple[Sealed, ...] = ()
            deadline = round_row.deadline_ms
            status = round_row.status
            if status == RoundState.READY:
                stored = ctx.store.result(round_index)
                assert stored is not None and round_row.layout is not None
                survivors, dropped = stored.survivors, stored.dropped
                digest = survivor_set_hash(
                    row.config_hash, row.session_id, round_index, survivors, dropped
                )
                payload = PayloadSpec(
                    total_bytes=stored.size,
                    total_elements=stored.size // 8,
                    digest=stored.digest,
                    fixed_point_bits=int(round_row.fixed_point_bits or 0),
                    tensors=tuple(round_row.layout),
                )
                path = ctx.store.payload_path(stored.path)
                statements = self._statements(row, round_row, survivors)
                tags = self._tags_for(round_index, round_row.unmask_attempt, caller)
            elif status == RoundState.AWAITING_UNMASK:
                request = ctx.unmask_row(round_row)
                survivors, dropped, digest = (
                    request.survivors,
                    request.dropped,
                    request.survivor_hash,
                )
                deadline = request.deadline_ms
            elif status == RoundState.OPEN:
                survivors = round_row.participants
            else:
                dropped = tuple(
                    m.node_id for m in ctx.store.members() if m.dropped_round == round_index
                )
                survivors = tuple(sorted(set(round_row.participants) - set(dropped)))
            reason = round_row.reason
            if row.state == SessionState.ABORTED and status != RoundState.READY:
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
                tags=tags,
            )

    def _tags_for(self, round_index: int, attempt: int, caller: str) -> tuple[Sealed, ...]:
        """The aggregate-check tags each attested survivor sealed for ``caller``."""
        return self._relays(round_index, attempt).tags.get(caller)

    def _statements(
        self, row: SessionRow, round_row: RoundRow, survivors: tuple[str, ...]
    ) -> tuple[UploadStatement, ...]:
        """The stored upload statement of every survivor (the uploads in the aggregate)."""
        ctx = self.ctx
        final = ctx.roster_hash(row)
        counted = set(survivors)
        return tuple(
            UploadStatement(
                node_id=upload.node_id,
                round_name=round_row.name,
                roster_hash=final,
                payload_digest=upload.digest,
                signature=upload.statement_signature,
            )
            for upload in ctx.store.uploads(round_row.round_index)
            if upload.node_id in counted
        )

    def unmask_request(self, session_id: str, round_index: int, *, caller: str) -> UnmaskRequest:
        """What the coordinator asks of ``caller`` for a round (``pending`` False: nothing)."""
        ctx = self.ctx
        with ctx.lock:
            check_in_roster(ctx, caller, caller)
            row = ctx.session()
            check_session_id(session_id, row)
            round_row = check_round(ctx, round_index, row)
            return self._request_view(row, round_row, caller)

    def _request_view(self, row: SessionRow, round_row: RoundRow, caller: str) -> UnmaskRequest:
        """The unmask request pending for ``caller`` in ``round_row`` (``pending`` False: none)."""
        ctx = self.ctx
        idle = UnmaskRequest(
            session_id=row.session_id,
            round_index=round_row.round_index,
            round_name=round_row.name,
            pending=False,
        )
        if round_row.status != RoundState.AWAITING_UNMASK or row.state != SessionState.RUNNING:
            return idle
        request = ctx.unmask_row(round_row)
        answered = {
            c.node_id for c in ctx.store.corrections(round_row.round_index, request.attempt)
        }
        if caller not in request.survivors or caller in answered:
            return idle
        relays = self._relays(round_row.round_index, request.attempt)
        attestations = tuple(
            Attestation(
                session_id=row.session_id,
                round_index=a.round_index,
                node_id=a.node_id,
                survivor_hash=request.survivor_hash,
                signature=a.signature,
            )
            for a in relays.attestations
        )
        survivors = set(request.survivors)
        return UnmaskRequest(
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
            min_survivors=ctx.config.min_nodes,
            attempt=request.attempt,
            challenge=tuple(
                item for item in relays.challenge.get(caller) if item.sender in survivors
            ),
            tags=self._tags_for(round_row.round_index, request.attempt, caller),
        )

    def record_delivery(self, round_index: int, node_id: str) -> None:
        """Note that ``node_id`` was sent the whole result of a round."""
        ctx = self.ctx
        with ctx.lock, ctx.store.transaction():
            ctx.store.add_delivery(round_index, node_id, ctx.clock())

    def status(self, session_id: str = "", *, caller: str | None = None) -> SessionStatus:
        """Where the session is. ``session_id`` may be empty (a node learning the id)."""
        ctx = self.ctx
        with ctx.lock:
            if caller is not None:
                check_in_roster(ctx, caller, caller, while_joining=True)
            row = ctx.session()
            if session_id:
                check_session_id(session_id, row)
            if caller is not None:
                self._note_terminal(caller, row)
            members = ctx.store.members()
            joined = tuple(m.node_id for m in members)
            rounds = ctx.store.rounds()
            summaries = []
            for r in rounds:
                dropped = tuple(m.node_id for m in members if m.dropped_round == r.round_index)
                deadline = r.deadline_ms
                if r.status == RoundState.AWAITING_UNMASK:
                    deadline = ctx.unmask_row(r).deadline_ms
                summaries.append(
                    RoundSummary(
                        index=r.round_index,
                        name=r.name,
                        state=RoundState(r.status),
                        submitted=tuple(u.node_id for u in ctx.store.uploads(r.round_index)),
                        dropped=dropped,
                        deadline_ms=deadline,
                        reason=r.reason,
                    )
                )
            current = rounds[-1] if rounds else None
            return SessionStatus(
                session_id=row.session_id,
                state=SessionState(row.state),
                config_hash=row.config_hash,
                federation_id=row.federation_id,
                current_round_index=current.round_index if current else 0,
                current_round_name=current.name if current else "",
                joined=joined,
                submitted=summaries[-1].submitted if summaries else (),
                excluded=(
                    tuple(n for n in ctx.config.node_ids if n not in set(joined))
                    if row.roster_final
                    else ()
                ),
                reason=row.reason,
                join_deadline_ms=row.join_deadline_ms,
                min_nodes=ctx.config.min_nodes,
                rounds=tuple(summaries),
                dropped=tuple(
                    DroppedNode(m.node_id, int(m.dropped_round or 0), m.dropped_reason)
                    for m in members
                    if m.status == "dropped"
                ),
            )

    def ended(self) -> bool:
        """True once the session completed or failed."""
        return self.ctx.session().state in (SessionState.COMPLETED, SessionState.ABORTED)

    def everyone_informed(self) -> bool:
        """True when every live node has learnt the outcome (final result sent, or failure seen)."""
        ctx = self.ctx
        with ctx.lock:
            row = ctx.session()
            live = ctx.store.live_node_ids()
            if row.state == SessionState.COMPLETED and row.current_round is not None:
                return live <= ctx.store.deliveries(row.current_round)
            if row.state == SessionState.ABORTED:
                return live <= self._notified
            return False
