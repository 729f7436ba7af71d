"""What the clock decides: the join deadline, a round's deadline, an unmask request's deadline.

:meth:`Deadlines.tick` runs whenever the server's ticker fires (and in tests
with a fake clock) and applies every deadline that has passed:

* join deadline: the roster becomes final (coordinator/steps/joining.py);
* round deadline, or a round in which every participant without an upload
  withdrew (nobody is awaited any more): the missing participants still live
  are dropped for the rest of the session, their partial streams leave the
  running sum, and the round closes. With fewer than ``min_nodes`` survivors
  the session fails; in a CAPE model round the CAPE sum is rerun among the
  survivors (their CAPE noise would not cancel otherwise); else the survivors
  are asked to unmask: reveal their self-mask seeds and their pair terms with
  the dropped nodes;
* unmask deadline: the survivors that did not answer are dropped and the
  round is superseded: it is rerun under the next index among those that
  answered (a CAPE model round from its CAPE sum), or the session fails when
  fewer than ``min_nodes`` remain or the plan round was superseded
  ``max_reruns`` times already (each attempt is another release of the same
  data; the reason names the silent nodes and the earlier attempts). The
  unmask request of a round index is never changed (see :meth:`Deadlines._unmask_deadline`).

Each of these is one transition: the dropped nodes and the status change
commit together.
"""

from __future__ import annotations

from coordinator.context import CoordinatorContext, node_list
from coordinator.events import (
    CapeModelDropout,
    NobodyAwaited,
    RoundDeadlinePassed,
    TooFewAnswered,
    TooFewUploaded,
    UnmaskStalled,
)
from coordinator.steps.joining import Joining
from coordinator.steps.streams import Streams
from coordinator.store import RoundRow, Store, UnmaskRow
from coordinator.transitions import StatusChanges
from proto.messages import (
    RoundState,
    SessionState,
)
from proto.rounds import RoundRef

__all__ = ["Deadlines", "nobody_awaited", "withdrawal_notes"]


def withdrawal_notes(store: Store, round_row: RoundRow) -> str:
    """ "node 'c' withdrew from round r (name): …" for each node that withdrew from it.

    While a round is open, a participant can only be dropped by its own
    withdrawal (the deadline closes the round as it drops).
    """
    return "; ".join(
        f"node {m.node_id!r} {m.dropped_reason}"
        for m in store.members()
        if m.status == "dropped"
        and m.dropped_round == round_row.round_index
        and m.node_id in round_row.participants
    )


def nobody_awaited(store: Store, round_row: RoundRow) -> bool:
    """True when the open round awaits nobody: every participant without an upload withdrew."""
    if round_row.status != RoundState.OPEN:
        return False
    uploaded = {u.node_id for u in store.uploads(round_row.round_index)}
    missing = set(round_row.participants) - uploaded
    live = store.live_node_ids()
    return bool(missing) and not (missing & live)


class Deadlines:
    """Applies the deadlines that have passed."""

    def __init__(
        self,
        ctx: CoordinatorContext,
        streams: Streams,
        changes: StatusChanges,
        joining: Joining,
    ) -> None:
        self.ctx = ctx
        self.streams = streams
        self.changes = changes
        self.joining = joining

    def tick(self, now: int | None = None) -> None:
        """Apply every deadline that has passed at ``now`` (default: the clock)."""
        ctx = self.ctx
        with ctx.lock:
            now = ctx.clock() if now is None else now
            row = ctx.session()
            if row.state == SessionState.JOINING:
                if now >= row.join_deadline_ms:
                    with ctx.transition():
                        self.joining.close_roster(now, everyone=False)
                return
            if row.state != SessionState.RUNNING or row.current_round is None:
                return
            current = ctx.round_row(row.current_round)
            if current.status == RoundState.OPEN:
                if now >= current.deadline_ms:
                    self.close_round(current, now, deadline=True)
                elif nobody_awaited(ctx.store, current):
                    self.close_round(current, now, deadline=False)
            elif current.status == RoundState.AWAITING_UNMASK:
                request = ctx.unmask_row(current)
                if now >= request.deadline_ms:
                    self._unmask_deadline(current, request, now)

    def close_round(self, round_row: RoundRow, now: int, *, deadline: bool) -> None:
        """Close an open round without every upload: drop the late, then fail, rerun or unmask.

        ``deadline``: the round's deadline passed; otherwise nobody is awaited
        (every participant without an upload withdrew).
        """
        ctx, index, name = self.ctx, round_row.round_index, round_row.name
        uploaded = {u.node_id for u in ctx.store.uploads(index)}
        participants = set(round_row.participants)
        missing = participants - uploaded
        survivors = tuple(sorted(participants & uploaded))
        # Nodes that withdrew are dropped already, with their own reason.
        late = sorted(missing & ctx.store.live_node_ids())
        self.streams.cancel("upload", index, missing)
        why = f"missed the deadline of round {index} ({name!r})"
        if len(survivors) < ctx.config.min_nodes:
            withdrawals = withdrawal_notes(ctx.store, round_row)
            reason = (
                f"only {len(survivors)} of {len(participants)} nodes submitted round "
                f"{name!r} ({node_list(missing)} dropped); the federation requires at "
                f"least {ctx.config.min_nodes}" + (f"; {withdrawals}" if withdrawals else "")
            )
            with ctx.transition():
                for node_id in late:
                    ctx.store.drop_member(node_id, index, why)
                self.changes.apply_to_round(index, TooFewUploaded(reason), now=now)
            ctx.forget_sum()
            return
        if ctx.config.construction == "cape" and not RoundRef.parse(name).is_cape_sum:
            rerun = ctx.config.next_round_name(name, superseded=True)
            assert rerun is not None
            capped = self._rerun_cap(index, name, f"{node_list(missing)} dropped")
            if capped is not None:
                with ctx.transition():
                    for node_id in late:
                        ctx.store.drop_member(node_id, index, why)
                    self.changes.apply_to_round(index, TooFewUploaded(capped), now=now)
                ctx.forget_sum()
                return
            reason = (
                f"{node_list(missing)} dropped after the CAPE sum of round {name!r}; "
                f"their CAPE noise would not cancel, so {rerun!r} and {name!r} are "
                f"rerun among the {len(survivors)} survivors from round {index + 1}"
                f"{self._attempt(name)}"
            )
            with ctx.transition():
                for node_id in late:
                    ctx.store.drop_member(node_id, index, why)
                event = CapeModelDropout(survivors, rerun, reason)
                self.changes.apply_to_round(index, event, now=now)
            ctx.forget_sum()
            return
        dropped = tuple(sorted(missing))
        with ctx.transition():
            for node_id in late:
                ctx.store.drop_member(node_id, index, why)
            self.changes.apply_to_round(
                index,
                RoundDeadlinePassed(survivors, dropped)
                if deadline
                else NobodyAwaited(survivors, dropped),
                now=now,
            )

    def _superseded(self, name: str) -> list[RoundRow]:
        """The superseded attempts so far of ``name``'s plan round (CAPE sums included)."""
        base = RoundRef.parse(name).model_round
        return [
            r
            for r in self.ctx.store.rounds()
            if r.status == RoundState.SUPERSEDED and RoundRef.parse(r.name).model_round == base
        ]

    def _attempt(self, name: str) -> str:
        """ "; attempt 2 of plan round 'sums' (at most 3)": the rerun about to open."""
        rerun = len(self._superseded(name)) + 2
        base, most = RoundRef.parse(name).model_round, self.ctx.config.max_reruns + 1
        return f"; attempt {rerun} of plan round {base!r} (at most {most})"

    def _rerun_cap(self, index: int, name: str, why: str) -> str | None:
        """The session's failure reason when ``name``'s plan round has no rerun left, else None.

        Every attempt is another release of the same data by each node
        (session.max_reruns, docs/design.md §4.6); the nodes stop there too.
        """
        earlier = self._superseded(name)
        if len(earlier) < self.ctx.config.max_reruns:
            return None
        base = RoundRef.parse(name).model_round
        rounds = ", ".join(str(r.round_index) for r in earlier) or "none"
        return (
            f"round {index} ({name!r}) would need another rerun ({why}), but plan round "
            f"{base!r} was superseded {len(earlier)} time{'s' if len(earlier) != 1 else ''} "
            f"already (rounds {rounds}), the most session.max_reruns = "
            f"{self.ctx.config.max_reruns} allows: each attempt is another release of the "
            "same data by every node"
        )

    def _unmask_deadline(self, round_row: RoundRow, request: UnmaskRow, now: int) -> None:
        """Survivors were silent: rerun the round among those that spoke, or fail.

        The request is never changed once issued: every survivor signs its
        survivor set once per round index, so a smaller set for the same
        index would let a coordinator show one node's upload as both survived
        (its self-mask seed revealed) and dropped (its pair terms revealed).
        While attestations are missing, the nodes that attested spoke; after
        that, those that answered. Nothing of this round index is ever
        completed: the uploads that were not unmasked stay one-time-padded.
        """
        ctx, index, name = self.ctx, round_row.round_index, round_row.name
        attested = {a.node_id for a in ctx.store.attestations(index, request.attempt)}
        if set(request.survivors) - attested:
            spoke = attested
        else:
            spoke = {c.node_id for c in ctx.store.corrections(index, request.attempt)}
        laggards = set(request.survivors) - spoke
        survivors = tuple(sorted(spoke))
        self.streams.cancel("correction", index, laggards)
        why = f"did not answer the unmask request for round {index} ({name!r}) before its deadline"
        if len(survivors) < ctx.config.min_nodes:
            reason = (
                f"only {len(survivors)} of {len(request.survivors)} survivors answered the "
                f"unmask request for round {name!r} ({node_list(laggards)} silent); "
                f"the federation requires at least {ctx.config.min_nodes}"
            )
            with ctx.transition():
                for node_id in sorted(laggards):
                    ctx.store.drop_member(node_id, index, why)
                self.changes.apply_to_round(index, TooFewAnswered(reason), now=now)
            ctx.forget_sum()
            return
        cape_model = ctx.config.construction == "cape" and not RoundRef.parse(name).is_cape_sum
        rerun = ctx.config.next_round_name(name, superseded=True) if cape_model else name
        assert rerun is not None
        capped = self._rerun_cap(index, name, f"{node_list(laggards)} silent")
        if capped is not None:
            with ctx.transition():
                for node_id in sorted(laggards):
                    ctx.store.drop_member(node_id, index, why)
                self.changes.apply_to_round(index, TooFewAnswered(capped), now=now)
            ctx.forget_sum()
            return
        reason = (
            f"{node_list(laggards)} did not answer the unmask request of round {index} "
            f"({name!r}); the round is rerun as {rerun!r} among {node_list(list(survivors))} "
            f"from round {index + 1}, with fresh keys{self._attempt(name)}"
        )
        with ctx.transition():
            for node_id in sorted(laggards):
                ctx.store.drop_member(node_id, index, why)
            self.changes.apply_to_round(index, UnmaskStalled(survivors, rerun, reason), now=now)
        ctx.forget_sum()
