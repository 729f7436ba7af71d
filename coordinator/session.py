"""The coordinator's session: one facade over the steps of joins, rounds, dropouts, unmasking.

Plain Python over the SQLite store (coordinator/store/); no gRPC. Every
method either raises a :class:`~coordinator.errors.CoordinatorError` *before*
writing anything, or performs its transition in one store transaction, so a
refused message leaves the state exactly as it was and a crash at any instant
leaves a state the next start resumes from.

Lifecycle of the session protocol:

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

A node that stops on purpose before uploading withdraws at once instead of
leaving everyone to wait for the deadline: it is dropped with its reason, and
the round takes the deadline's path as soon as every participant still live
has uploaded.

Where things are: every status change, in one table, is in
coordinator/transitions.py (the events in coordinator/events.py); the steps
that check messages and decide which event happened are in
coordinator/steps/ (joining, uploads, unmask, withdraw, deadlines, views,
streams), each a small object over the shared
:class:`~coordinator.context.CoordinatorContext`. :class:`Session` composes them
and keeps the methods the server and the command call.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from coordinator.config import SessionConfig
from coordinator.context import CoordinatorContext, wall_clock_ms
from coordinator.messages import ResultView
from coordinator.steps.checks import check_caller, check_in_roster
from coordinator.steps.deadlines import Deadlines
from coordinator.steps.joining import Joining
from coordinator.steps.streams import MAX_CHUNK_BYTES, EncodedResult, Streams, Ticket
from coordinator.steps.unmask import Unmasking
from coordinator.steps.uploads import Uploads
from coordinator.steps.views import Views
from coordinator.steps.withdraw import Withdrawals
from coordinator.store import Store
from coordinator.transitions import StatusChanges
from noise.keys import KeyBundle
from proto.messages import (
    Attestation,
    AttestationReceipt,
    JoinReceipt,
    RosterView,
    SessionStatus,
    UnmaskHeader,
    UnmaskReceipt,
    UnmaskRefusal,
    UnmaskRequest,
    UploadHeader,
    UploadReceipt,
    WithdrawReceipt,
    WithdrawRequest,
)

__all__ = ["MAX_CHUNK_BYTES", "Session", "Ticket", "wall_clock_ms"]


class Session:
    """One federation session, resumed from (or created in) ``store``.

    ``clock`` returns Unix milliseconds; tests pass a fake one. ``log``
    receives one line per transition (a node joined, a round is ready, a node
    was dropped), after the transition has been committed. All public
    methods are thread-safe; payload chunks are received without holding the
    session lock.

    ``store`` and ``config`` are the ones given; ``context`` is what the
    steps share and ``changes`` the table of status changes over it;
    ``resumed`` tells whether the state file already held this session.
    """

    def __init__(
        self,
        store: Store,
        config: SessionConfig,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.context = CoordinatorContext(store, config, clock=clock, log=log)
        self.changes = StatusChanges(self.context)
        self._streams = Streams(self.context)
        self._joining = Joining(self.context, self.changes)
        self._uploads = Uploads(self.context, self._streams, self.changes)
        self._unmasking = Unmasking(self.context, self._streams, self.changes)
        self._deadlines = Deadlines(self.context, self._streams, self.changes, self._joining)
        self._withdrawals = Withdrawals(self.context, self._streams, self.changes, self._deadlines)
        self._views = Views(self.context)
        self.resumed = self._joining.start_or_resume()

    # ------------------------------------------------------------ who and where

    @property
    def session_id(self) -> str:
        """The session id (random 128-bit hex, chosen at the first start)."""
        return self.context.session().session_id

    def state(self) -> str:
        """'joining', 'running', 'completed' or 'failed'."""
        return self.context.session().state

    def reason(self) -> str:
        """Why the session ended ('' while it runs or after it completed)."""
        return self.context.session().reason

    def check_caller(self, caller: str, claimed: str) -> None:
        """Refuse (PERMISSION_DENIED) unless ``caller`` (from its certificate) is ``claimed``.

        Also refuses a node outside the federation.
        """
        check_caller(self.context, caller, claimed)

    def check_in_roster(self, caller: str, *, while_joining: bool = False) -> None:
        """Refuse (PERMISSION_DENIED) a caller outside the federation or the session's roster.

        ``while_joining``: a federation node that has not joined passes while
        the join phase is open.
        """
        with self.context.lock:
            check_in_roster(self.context, caller, caller, while_joining=while_joining)

    def check_may_join(self, caller: str) -> None:
        """Refuse (PERMISSION_DENIED) a join from outside the federation or after the join phase."""
        self._joining.check_may_join(caller)

    # ------------------------------------------------------------ joining

    def join(self, bundle: KeyBundle, *, caller: str) -> JoinReceipt:
        """Record a node's signed ephemeral key (idempotent for the same bundle)."""
        return self._joining.join(bundle, caller=caller)

    def roster(self, session_id: str, *, caller: str) -> RosterView:
        """Every joined node's signed bundle and whether the roster is final."""
        return self._views.roster(session_id, caller=caller)

    # ------------------------------------------------------------ payload streams

    def begin_upload(self, header: UploadHeader, *, caller: str) -> Ticket | UploadReceipt:
        """Check an upload header; a duplicate is answered at once, else a ticket is returned."""
        return self._uploads.begin_upload(header, caller=caller)

    def begin_unmask(self, header: UnmaskHeader, *, caller: str) -> Ticket | UnmaskReceipt:
        """Check a correction header; a duplicate is answered at once, else a ticket is returned."""
        return self._unmasking.begin_unmask(header, caller=caller)

    def receive(self, ticket: Ticket, offset: int, data: bytes | memoryview) -> None:
        """Take one chunk of a stream (uploads go straight into the running sum)."""
        self._streams.receive(ticket, offset, data)

    def finish(self, ticket: Ticket) -> UploadReceipt | UnmaskReceipt:
        """Verify size and checksum, store the payload and advance the round if complete."""
        return self._streams.finish(ticket)

    def abandon(self, ticket: Ticket) -> None:
        """Discard a stream that failed or was cancelled; undo its partial sum. Idempotent."""
        self._streams.abandon(ticket)

    # ------------------------------------------------------------ unmasking and withdrawal

    def attest(self, attestation: Attestation, *, caller: str) -> AttestationReceipt:
        """Record a survivor's signature over the current survivor set."""
        return self._unmasking.attest(attestation, caller=caller)

    def refuse_unmask(self, refusal: UnmaskRefusal, *, caller: str) -> UnmaskReceipt:
        """Record a survivor's refusal; the round cannot be completed and the session fails."""
        return self._unmasking.refuse_unmask(refusal, caller=caller)

    def unmask_request(self, session_id: str, round_index: int, *, caller: str) -> UnmaskRequest:
        """What the coordinator asks of ``caller`` for a round (``pending`` False: nothing)."""
        return self._views.unmask_request(session_id, round_index, caller=caller)

    def withdraw(self, request: WithdrawRequest, *, caller: str) -> WithdrawReceipt:
        """Drop ``request.node_id`` from the open current round it has not uploaded."""
        return self._withdrawals.withdraw(request, caller=caller)

    # ------------------------------------------------------------ time and views

    def tick(self, now: int | None = None) -> None:
        """Apply every deadline that has passed at ``now`` (default: the clock)."""
        self._deadlines.tick(now)

    def result(
        self, session_id: str, round_index: int, *, caller: str, hold_seconds: float = 0.0
    ) -> ResultView:
        """A round's status and, when ready, where its aggregate is stored.

        ``hold_seconds``: how long a repeated poll that would see nothing new
        waits for a change (a long poll; Views.result).
        """
        return self._views.result(session_id, round_index, caller=caller, hold_seconds=hold_seconds)

    def encoded_result(self, round_index: int, path: Path, digest: bytes) -> EncodedResult | None:
        """The aggregate stored at ``path`` as encoded chunks, if this process wrote it.

        Only the newest aggregate written since the process started is kept;
        for any other the caller reads the file.
        """
        found = self._streams.encoded_result
        if (
            found is None
            or found.round_index != round_index
            or found.name != path.name
            or found.digest != digest
        ):
            return None
        return found

    def record_delivery(self, round_index: int, node_id: str) -> None:
        """Note that ``node_id`` was sent the whole result of a round."""
        self._views.record_delivery(round_index, node_id)

    def status(self, session_id: str = "", *, caller: str | None = None) -> SessionStatus:
        """Where the session is. ``session_id`` may be empty (a node learning the id)."""
        return self._views.status(session_id, caller=caller)

    def ended(self) -> bool:
        """True once the session completed or failed."""
        return self._views.ended()

    def sync(self) -> None:
        """Make every state change committed so far durable (one shared flush; Store.sync)."""
        self.store.sync()

    def everyone_informed(self) -> bool:
        """True when every live node has learnt the outcome (final result sent, or failure seen)."""
        return self._views.everyone_informed()
