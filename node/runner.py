"""NodeRunner: one TRE node's whole session, from local data to the global model.

1. **Prepare, before any contact** (``node.session.setup``): the federation
   config, the installation's streams, the identity key, the TLS files and
   the cohort; bad local input stops here (:class:`~node.errors.SetupError`).
2. **Join** (``node.session.joining``): save a session key, post it signed,
   verify the roster, derive the pairwise seeds.
3. **Rounds**, as the coordinator opens them — it names each round and its
   index; under CAPE a dropout makes it rerun a CAPE sum and its model round.
   The runner dispatches on the kind of round: a CAPE secure sum
   (``node.session.cape_round``) or a model round of the plan
   (``node.session.model_round``); unmask requests are answered while a round
   is awaited (``node.session.unmask_answers``). After a restart it first
   takes in what was aggregated meanwhile (``node.session.resume``).
4. **Finish** (``node.session.outputs``): ``OUT/model.json``,
   ``OUT/predictions.csv``; the session is recorded completed in the state
   folder, whose ledger ``STATE/ledger.json`` holds every release of every
   session (``OUT/ledger.json`` is its copy, rewritten after each entry).

**Budget.** Before this node's first release or CAPE share of the session
(and again after a restart) the whole session's cost, every plan round not
yet released among the round's participants composed with the ledger, is
checked against ``privacy.epsilon_budget`` for every observer class the
policy bounds (``node.egress.budget``); a session that would pass it is refused with
a withdrawal, nothing of its data sent.

**Withdrawal.** A node that stops on purpose before uploading the current
round tells the coordinator at once, so the other TREs need not wait for the
round deadline. Only deliberate refusals withdraw, those a restart would
repeat: :class:`~node.errors.NodeRefused` (the ε budget or the noise floor
would be broken), :class:`~noise.errors.InfeasibleDesignError` (no pair
weights keep this node's noise floor among the round's participants) and
:class:`~node.errors.ApprovalRejected` (the output checker signed a rejection
of this exact bundle). A crash, kill, Ctrl-C, an unreachable coordinator or a
local fault the operator can repair never withdraws: the node may be run
again and resume the round before its deadline. The reason sent is a sentence
without data; a reviewer's comment stays in the TRE. Withdrawing is best
effort: an error is printed, never raised. Only one process at a time runs a
node on OUT (``OUT/node.lock``) and on its state folder (``STATE/node.lock``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from node.egress.approval import check_checker_keys
from node.errors import (
    ApprovalError,
    ApprovalRejected,
    CoordinatorUnreachable,
    GatewayError,
    NodeError,
    NodeRefused,
    SessionFailed,
    SessionStateError,
)
from node.protocol.client import GrpcGateway
from node.protocol.gateway import CoordinatorGateway
from node.protocol.masking import MaskPrefetch
from node.records.session_state import SessionStore
from node.records.state_folder import NodeState
from node.session.cape_round import run_cape_sum_round
from node.session.context import NodeOptions, SessionContext
from node.session.egress_steps import check_session_budget
from node.session.joining import join
from node.session.model_round import prefetch_mask, run_model_round
from node.session.outputs import write_results
from node.session.progress import RoundProgress
from node.session.reruns import attempts_note, check_rerun_cap
from node.session.resume import catch_up, take_aggregated
from node.session.setup import LocalSetup, prepare
from noise.errors import InfeasibleDesignError
from proto.messages import SessionState, SessionStatus
from proto.rounds import RoundRef

__all__ = [
    "GatewayFactory",
    "NodeOptions",
    "NodeRefused",
    "NodeRunner",
    "RunOutcome",
    "SessionFailed",
    "grpc_gateway",
]

# Makes the node's gateway to the coordinator from its setup, options and progress sink.
GatewayFactory = Callable[[LocalSetup, NodeOptions, Callable[[str], None]], CoordinatorGateway]


def grpc_gateway(
    setup: LocalSetup, options: NodeOptions, say: Callable[[str], None]
) -> CoordinatorGateway:
    """The real gateway: mutual TLS to the configured (or overridden) coordinator address."""
    ca, cert, key = setup.tls
    return GrpcGateway.from_files(
        options.address or setup.config.coordinator_address,
        node_id=setup.node_id,
        ca_certificate=ca,
        client_certificate=cert,
        client_key=key,
        retry=options.retry,
        progress=say,
        revoked=setup.config.revoked,
    )


@dataclass(frozen=True)
class RunOutcome:
    """Where the results of a completed session were written."""

    session_id: str
    model: Path
    predictions: Path
    ledger: Path  # the node's ledger across sessions, STATE/ledger.json (a copy in OUT)
    masks_drawn_ahead: int = 0  # pairwise masks drawn before their round opened
    masks_drawn_in_round: int = 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _names(nodes: tuple[str, ...]) -> str:
    return "{" + ", ".join(sorted(nodes)) + "}"


@contextmanager
def _who_is_missing(
    ctx: SessionContext, index: int, name: str, participants: tuple[str, ...]
) -> Iterator[None]:
    """Say who is missing when a round has too few nodes for the noise design.

    With collusion threshold T every node needs at least T + 1 partners the
    coalition does not know, so a round of the complete design needs T + 2
    nodes. When nodes that did not join (or were dropped) leave fewer, the
    design's "no pair left" becomes a refusal naming them and the number
    needed; it withdraws like any refusal, nothing released.
    """
    try:
        yield
    except InfeasibleDesignError:
        threshold = ctx.config.privacy.collusion_threshold
        needed = threshold + 2
        if len(participants) >= needed:
            raise
        joined = set(ctx.roster.node_ids)
        absent = [n for n in ctx.config.node_ids if n not in joined]
        dropped = [n for n in ctx.roster.node_ids if n not in participants]
        missing = []
        if absent:
            missing.append(f"{_list(absent)} did not join before the join deadline")
        if dropped:
            missing.append(f"{_list(dropped)} {'was' if len(dropped) == 1 else 'were'} dropped")
        who = " and ".join(missing) or "too few nodes take part"
        raise NodeRefused(
            f"{who}, so round {index} ({name!r}) has {len(participants)} node"
            f"{'s' if len(participants) != 1 else ''} ({', '.join(participants)}); with "
            f"collusion threshold {threshold} the noise design needs at least {needed} (each "
            f"node paired with at least {threshold + 1} others the coalition does not know), so "
            "this node releases nothing; start the session again when every node can join, "
            "or lower privacy.collusion_threshold"
        ) from None


def _list(nodes: list[str]) -> str:
    return ", ".join(nodes)


class NodeRunner:
    """Runs one node of a federation session (see the module docstring)."""

    def __init__(
        self,
        federation: Path,
        node_id: str,
        *,
        data: Path | None = None,
        out: Path | None = None,
        state: Path | None = None,
        options: NodeOptions | None = None,
        progress: Callable[[str], None] = _stderr,
        gateway: GatewayFactory = grpc_gateway,
    ) -> None:
        self.federation = Path(federation)
        self.node_id = node_id
        self.data = data
        self.out = out
        self.state = state
        self.options = options or NodeOptions()
        self._progress = progress
        self._gateway = gateway
        self.setup: LocalSetup | None = None
        self._session_id = ""  # once joined, for the record of a failure

    def say(self, message: str) -> None:
        self._progress(f"zerosum node {self.node_id}: {message}")

    def prepare(self, *, verbose: bool = False) -> LocalSetup:
        """Load and check everything local; raises SetupError before any network contact.

        The cohort's pre-flight report is said line by line (every column with
        ``verbose``, else the clipped ones).
        """
        if self.setup is None:
            setup = prepare(
                self.federation,
                self.node_id,
                data=self.data,
                out=self.out,
                state=self.state,
                say=self.say,
                verbose=verbose,
            )
            check_checker_keys(setup.config, self.node_id, self.options.approve)
            self.setup = setup
        return self.setup

    def _sleep(self) -> None:
        time.sleep(self.options.poll_seconds)

    def run(self) -> RunOutcome:
        """Prepare (if not done), take part in the session, write the results."""
        setup = self.prepare()
        gateway = self._gateway(setup, self.options, self.say)
        try:
            with self._hold(setup.state, setup.out), self._noting_failure(setup):
                ctx = join(setup, gateway, self.options, self.say, self._sleep)
                self._session_id = ctx.session_id
                progress = RoundProgress.from_ledger(ctx.ledger, ctx.session_id)
                with self._recording(ctx), MaskPrefetch(ctx.seeds, ctx.codec) as masks:
                    try:
                        if not ctx.resuming:
                            prefetch_mask(ctx, masks, 0, ctx.roster.node_ids)
                        self._rounds(ctx, progress, masks)
                    except (
                        NodeRefused,
                        InfeasibleDesignError,
                        ApprovalRejected,
                        ApprovalError,
                    ) as error:
                        self._withdraw(ctx, progress, error)
                        raise
                    model, predictions = write_results(ctx.out, ctx.plan)
                ctx.state.record_end(ctx.session_id, "completed")
                self.say(f"model written to {model}; predictions to {predictions}")
                if ctx.plan.prediction_note is not None:
                    self.say(f"note: {ctx.plan.prediction_note}")
                after = ctx.plan.post_model_release()
                if after is not None:
                    after.release(ctx, model)
                return RunOutcome(
                    ctx.session_id,
                    model,
                    predictions,
                    ctx.ledger.path,
                    masks_drawn_ahead=masks.hits,
                    masks_drawn_in_round=masks.misses,
                )
        except CoordinatorUnreachable as error:
            raise SessionFailed(str(error)) from None
        except GatewayError as error:
            raise SessionFailed(f"the coordinator refused a request: {error}") from None
        finally:
            gateway.close()

    @contextmanager
    def _hold(self, state: Path, out: Path) -> Iterator[None]:
        """This process's exclusive hold on STATE, then OUT, for the session.

        Taken before the ledger and the saved key are read: a second process
        on the same state folder would rewrite the ledger from its own memory
        and lose entries; one on the same OUT would replace the key and
        release the round again with other residual noise.
        """
        try:
            with NodeState(state, self.node_id).exclusive(), SessionStore(out).exclusive():
                yield
        except SessionStateError as error:
            raise SessionFailed(str(error)) from None

    @contextmanager
    def _noting_failure(self, setup: LocalSetup) -> Iterator[None]:
        """Keep in STATE/last-failure.json why the node stopped (``zerosum node --status``)."""
        self._session_id = ""
        try:
            yield
        except (NodeError, InfeasibleDesignError) as error:
            reason = str(error)
            if isinstance(error, GatewayError) and not isinstance(error, CoordinatorUnreachable):
                reason = f"the coordinator refused a request: {error}"
            try:
                NodeState(setup.state, self.node_id).record_failure(reason, self._session_id)
            except (NodeError, OSError) as failure:
                self.say(f"could not record the failure in {setup.state}: {failure}")
            raise

    @contextmanager
    def _recording(self, ctx: SessionContext) -> Iterator[None]:
        """Record in the state folder why the session stopped at this node, if it did."""
        try:
            yield
        except (NodeError, InfeasibleDesignError) as error:
            try:
                ctx.state.record_end(ctx.session_id, "failed", str(error))
            except (NodeError, OSError) as failure:
                self.say(f"could not record the failure in {ctx.state.sessions_path}: {failure}")
            raise

    def _rounds(self, ctx: SessionContext, progress: RoundProgress, masks: MaskPrefetch) -> None:
        """Take part in every round the coordinator opens, until the plan has its model."""
        plan = ctx.plan
        if ctx.resuming:
            catch_up(ctx, progress)
        budget_checked = False
        while not plan.complete:
            status = ctx.gateway.status(ctx.session_id)
            if status.state == SessionState.ABORTED:
                raise SessionFailed(f"the session failed: {status.reason}")
            if ctx.resuming:
                # A round sent before the restart may be aggregated after the
                # catch-up looked; only the current round is handled below.
                take_aggregated(ctx, progress, status)
                if plan.complete:
                    break
            current = status.current
            if current is None or current.index in progress.done:
                if status.state == SessionState.COMPLETED:
                    raise SessionFailed(
                        "the session completed without this node receiving every round"
                    )
                self._sleep()
                continue
            index, name = current.index, current.name
            participants = status.participants(index, ctx.roster.node_ids)
            if ctx.node_id not in participants:
                raise SessionFailed(
                    f"the coordinator dropped this node before round {index} ({name!r})"
                )
            if not budget_checked:
                progress.unsent = index  # what a refusal withdraws from
                with _who_is_missing(ctx, index, name, participants):
                    check_session_budget(ctx, participants)
                budget_checked = True
            try:
                check_rerun_cap(ctx, status, index, name)
            except NodeRefused:
                progress.unsent = index
                raise
            self._round(ctx, progress, masks, status, participants)
            progress.done.add(index)

    def _round(
        self,
        ctx: SessionContext,
        progress: RoundProgress,
        masks: MaskPrefetch,
        status: SessionStatus,
        participants: tuple[str, ...],
    ) -> None:
        """Run the current round by its kind: a CAPE sum, or one of the plan's model rounds."""
        assert status.current is not None
        index, name = status.current.index, status.current.name
        if RoundRef.parse(name).is_cape_sum:
            with _who_is_missing(ctx, index, name, participants):
                run_cape_sum_round(ctx, progress, index=index, name=name, participants=participants)
        elif name in ctx.plan.round_names:
            with _who_is_missing(ctx, index, name, participants):
                outcome = run_model_round(
                    ctx, progress, masks, index=index, name=name, participants=participants
                )
            if outcome is not None:
                prefetch_mask(ctx, masks, index + 1, outcome.survivors)
                if note := attempts_note(ctx, status, index, name):
                    self.say(f"round {index} ({name!r}): {note}")
        else:
            raise SessionFailed(
                f"the coordinator opened round {index} named {name!r}, which is not part of "
                f"this node's plan {list(ctx.plan.round_names)}"
            )

    def _withdraw(self, ctx: SessionContext, progress: RoundProgress, error: Exception) -> None:
        """Best effort: tell the coordinator this node stops before uploading its round."""
        index = progress.unsent
        if index is None:
            return
        if isinstance(error, ApprovalRejected):
            # Only the decision leaves the TRE: the reviewer's comment may speak of the data.
            reason = "the TRE's output checker rejected this node's egress"
        elif isinstance(error, ApprovalError):
            # The local message names folders and reviewers; only the fact leaves.
            reason = "this node holds no valid output checker decision on its egress"
        else:
            reason = str(error)
        reason = reason[:1000]  # the coordinator's bound on WithdrawRequest.reason
        try:
            receipt = ctx.gateway.withdraw(ctx.session_id, index, reason)
        except NodeError as failure:
            self.say(
                f"could not withdraw from round {index} ({failure}); the coordinator will drop "
                "this node at the round deadline"
            )
            return
        self.say(
            f"withdrew from round {index}: {reason} (dropped from the round: "
            f"{_names(receipt.dropped)})"
        )
