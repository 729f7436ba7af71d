"""Withdrawal: a node that stops on purpose says so at once instead of going silent.

A node stops deliberately when its TRE's output checker signs a rejection of
its egress, when the release would exceed its ε budget, or when its noise
floor cannot be kept. Silent, it would be dropped only at the round deadline
(ten minutes by default) while every other TRE waits. With ``Withdraw`` it
tells the coordinator, which drops it *exactly as the deadline would have*:
the node's row in the roster becomes dropped for this round with its reason,
and once every participant still live has uploaded, the round goes down the
deadline's own path (coordinator/steps/deadlines.py): survivors unmask their
pair terms with the dropped nodes (Bonawitz et al. 2017, ACM CCS, §4), a CAPE
model round is rerun, or the session fails when fewer than ``min_nodes``
remain. Nothing about the mathematics changes: a withdrawn node is a dropout
that arrives early and says why.

Only a live participant of the open current round that has **not uploaded**
it may withdraw. Its masked payload y_k = x_k + m_k with
m_k = Σ_j ±c_kj·q(z_kj) would otherwise stay stored while the survivors,
told that k dropped, send their pair terms with k; those terms are exactly the
summands of m_k, so the coordinator could compute y_k − m_k = x_k and strip
k's noise. The round deadline never drops an uploaded node for the same
reason; a withdrawal after the upload is refused (FAILED_PRECONDITION) and the
upload stays in the round. A survivor that will not go on during the unmask
phase refuses the unmask request instead (coordinator/steps/unmask.py), which
already ends the session with its reason.

Like every step, a withdrawal is checked completely before anything is
written and applied in one store transaction (kill -9 safe); the deadline's
path runs in its own transaction afterwards, and the next tick applies it
again after a crash in between. The same withdrawal sent again (a lost
receipt) is answered with the receipt of the state now.
"""

from __future__ import annotations

from coordinator.context import CoordinatorContext, node_list
from coordinator.errors import FailedPrecondition, InvalidArgument
from coordinator.events import NodeWithdrew, WithdrawalLeftTooFew
from coordinator.steps.checks import (
    check_in_roster,
    check_live,
    check_round,
    check_running,
    check_session_id,
    find_member,
)
from coordinator.steps.deadlines import Deadlines, nobody_awaited, withdrawal_notes
from coordinator.steps.streams import Streams
from coordinator.store import RoundRow, SessionRow
from coordinator.transitions import StatusChanges
from proto.messages import (
    RoundState,
    SessionState,
    WithdrawReceipt,
    WithdrawRequest,
)
from proto.text import sanitise_text

__all__ = ["MAX_WITHDRAW_REASON_CHARS", "Withdrawals", "withdrawal_reason"]

# A sentence for people, shown to every node in the status; never a document.
MAX_WITHDRAW_REASON_CHARS = 1000


def withdrawal_reason(round_row: RoundRow, text: str) -> str:
    """The dropped reason stored for a node withdrawing from ``round_row`` with ``text``.

    Phrased like the deadline's "missed the deadline of round r (name)", so
    that "node 'c' <reason>" reads as a sentence wherever it is shown.
    """
    # Peer text reaches logs, --status and every node: control characters are
    # escaped before it is stored (proto.text).
    clean = sanitise_text(text, MAX_WITHDRAW_REASON_CHARS)
    return f"withdrew from round {round_row.round_index} ({round_row.name!r}): {clean}"


class Withdrawals:
    """Withdrawals of nodes that stop on purpose."""

    def __init__(
        self,
        ctx: CoordinatorContext,
        streams: Streams,
        changes: StatusChanges,
        deadlines: Deadlines,
    ) -> None:
        self.ctx = ctx
        self.streams = streams
        self.changes = changes
        self.deadlines = deadlines

    def withdraw(self, request: WithdrawRequest, *, caller: str) -> WithdrawReceipt:
        """Drop ``request.node_id`` from the open current round it has not uploaded.

        Raises PermissionDenied (certificate of another node, or a node
        outside the federation), InvalidArgument (no reason, a reason longer
        than :data:`MAX_WITHDRAW_REASON_CHARS`, another session) or
        FailedPrecondition (a round that is not open and current, a node that
        is not a live participant, an uploaded round, an ended session), each
        before anything is written.
        """
        ctx = self.ctx
        with ctx.lock:
            check_in_roster(ctx, caller, request.node_id)
            what = f"withdrawal of node {request.node_id!r} from round {request.round_index}"
            if len(request.reason) > MAX_WITHDRAW_REASON_CHARS:
                raise InvalidArgument(
                    f"{what}: the reason is {len(request.reason)} characters long; at most "
                    f"{MAX_WITHDRAW_REASON_CHARS} are accepted (one sentence)."
                )
            text = " ".join(request.reason.split())
            if not text:
                raise InvalidArgument(f"{what}: the withdrawal gives no reason.")
            row = ctx.session()
            check_session_id(request.session_id, row)
            round_row = check_round(ctx, request.round_index, row)
            why = withdrawal_reason(round_row, text)
            member = find_member(ctx.store, request.node_id)
            if (
                member is not None
                and member.status == "dropped"
                and member.dropped_round == round_row.round_index
                and member.dropped_reason == why
            ):
                return self._receipt(row, round_row, request.node_id)
            check_live(ctx, request.node_id, row)
            check_running(row)
            self._check_withdrawable(round_row, request.node_id, what)
            self._apply_withdrawal(round_row, request.node_id, why, ctx.clock())
            return self._receipt(ctx.session(), round_row, request.node_id)

    def _check_withdrawable(self, round_row: RoundRow, node_id: str, what: str) -> None:
        label = f"round {round_row.round_index} ({round_row.name!r})"
        if node_id not in round_row.participants:
            raise FailedPrecondition(
                f"{what}: node {node_id!r} is not a participant of {label} "
                f"(participants: {node_list(list(round_row.participants))})."
            )
        if round_row.status == RoundState.AWAITING_UNMASK:
            raise FailedPrecondition(
                f"{what}: {label} is awaiting unmask corrections; a survivor that will not go "
                "on answers the unmask request with a refusal instead."
            )
        if round_row.status != RoundState.OPEN:
            raise FailedPrecondition(
                f"{what}: {label} is {round_row.status}; only the open current round can be "
                "withdrawn from."
            )
        if self.ctx.store.upload(round_row.round_index, node_id) is not None:
            raise FailedPrecondition(
                f"{what}: node {node_id!r} has already uploaded {label}; its upload stays in "
                "the round, because withdrawing now would let its pair terms be revealed next "
                "to its payload."
            )

    def _apply_withdrawal(self, round_row: RoundRow, node_id: str, why: str, now: int) -> None:
        """Drop the node (one transaction), then settle the round if nobody live is awaited."""
        ctx = self.ctx
        index, name = round_row.round_index, round_row.name
        live = ctx.store.live_node_ids()
        remaining = sorted((set(round_row.participants) & live) - {node_id})
        failed = len(remaining) < ctx.config.min_nodes
        with ctx.transition():
            ctx.store.drop_member(node_id, index, why)
            ctx.note(
                f"round {index} ({name!r}): node {node_id!r} {why}",
                event="node-withdrew",
                node=node_id,
            )
            notes = withdrawal_notes(ctx.store, round_row)
            if failed:
                reason = (
                    f"only {len(remaining)} of {len(round_row.participants)} nodes remain in "
                    f"round {name!r} ({node_list(remaining)}); the federation requires at "
                    f"least {ctx.config.min_nodes}; {notes}"
                )
                self.changes.apply_to_round(index, WithdrawalLeftTooFew(reason), now=now)
            else:
                self.changes.apply_to_round(index, NodeWithdrew(notes), now=now)
        # The node's partial upload, if one is streaming, leaves the running sum.
        self.streams.cancel("upload", index, {node_id})
        if failed:
            ctx.forget_sum()
            return
        current = ctx.round_row(index)
        if nobody_awaited(ctx.store, current):
            self.deadlines.close_round(current, now, deadline=False)

    def _receipt(self, row: SessionRow, round_row: RoundRow, node_id: str) -> WithdrawReceipt:
        dropped = tuple(
            m.node_id for m in self.ctx.store.members() if m.dropped_round == round_row.round_index
        )
        return WithdrawReceipt(
            session_id=row.session_id,
            round_index=round_row.round_index,
            node_id=node_id,
            dropped=dropped,
            state=SessionState(row.state),
        )
