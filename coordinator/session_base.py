"""Shared machinery of the coordinator's session state machine.

:class:`SessionBase` holds what every step of a session needs: the store and
config, the lock, one-transaction transitions with their log lines, the
checks every message goes through (caller, session id, round, liveness), the
round's running sum, and payload streams (:class:`Ticket`) from the first
chunk to a stored file. The steps themselves live in coordinator/uploads.py,
coordinator/unmask.py and coordinator/session.py.

A check raises a :class:`~coordinator.errors.CoordinatorError` before
anything is written; a transition is one store transaction; so a refused
message never changes the state.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from coordinator.aggregate import Contribution, ContributionWithdrawn, RoundSum
from coordinator.config import SessionConfig
from coordinator.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
)
from coordinator.layout import PayloadSpec
from coordinator.messages import (
    RoundStatus,
    SessionState,
    UnmaskReceipt,
    UploadReceipt,
)
from coordinator.store import (
    PayloadWriter,
    ResultRow,
    RoundRow,
    SessionRow,
    Store,
    UnmaskRow,
)
from noise.layout import Layout
from noise.transcript import roster_hash

__all__ = [
    "MAX_CHUNK_BYTES",
    "SessionBase",
    "Ticket",
    "clock_text",
    "node_list",
    "short_digest",
    "verify_ed25519",
    "wall_clock_ms",
]

MAX_CHUNK_BYTES = 1 << 20


def wall_clock_ms() -> int:
    """Unix time in milliseconds."""
    return int(time.time() * 1000)


def node_list(ids: tuple[str, ...] | list[str] | set[str]) -> str:
    """Node ids for a sentence: sorted and comma-separated, or "none"."""
    return ", ".join(sorted(ids)) if ids else "none"


def short_digest(digest: bytes) -> str:
    """The first 16 hex digits of a digest, for a sentence."""
    return digest.hex()[:16] + "…"


def clock_text(ms: int) -> str:
    """A Unix-millisecond time as HH:MM:SS UTC, for log lines."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%H:%M:%S UTC")


def verify_ed25519(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when ``signature`` is ``public_key``'s Ed25519 signature of ``message``."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(eq=False)
class Ticket:
    """A payload stream in progress: an upload (``attempt`` 0) or an unmask correction."""

    kind: str  # "upload" | "correction"
    round_index: int
    node_id: str
    spec: PayloadSpec
    writer: PayloadWriter
    running: RoundSum | None = None
    contribution: Contribution | None = None
    attempt: int = 0
    statement_signature: bytes = b""  # uploads only: the node's signed upload statement
    layout: Layout | None = None  # the payload's layout, checked when the stream began
    received: int = 0
    # cancelled: the session gave up on the stream (its node was dropped);
    # closed: the stream's owner has finished with it (stored or abandoned).
    cancelled: bool = False
    closed: bool = False
    committed: bool = False

    @property
    def what(self) -> str:
        noun = "upload" if self.kind == "upload" else "unmask correction"
        return f"{noun} of node {self.node_id!r} for round {self.round_index}"


class SessionBase:
    """State and helpers shared by the steps of a session (see coordinator/session.py)."""

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
        self._clock = clock
        self._log = log
        self._events: list[str] = []
        self._lock = threading.RLock()
        self._sum: RoundSum | None = None
        self._sum_round = -1
        self._tickets: dict[tuple[str, int, str], Ticket] = {}
        self._notified: set[str] = set()
        self.resumed = False

    @contextmanager
    def _transition(self) -> Iterator[None]:
        """One store transaction; the log lines noted inside are emitted once it commits."""
        self._events = []
        with self.store.transaction():
            yield
        events, self._events = self._events, []
        if self._log is not None:
            for line in events:
                self._log(line)

    def _note(self, line: str) -> None:
        self._events.append(line)

    @property
    def session_id(self) -> str:
        """The session id (random 128-bit hex, chosen at the first start)."""
        return self._session().session_id

    def _session(self) -> SessionRow:
        row = self.store.session()
        if row is None:  # pragma: no cover - created in __init__
            raise RuntimeError("the state file has no session.")
        return row

    def _round_row(self, round_index: int) -> RoundRow:
        row = self.store.round(round_index)
        if row is None:  # pragma: no cover - callers check first
            raise RuntimeError(f"round {round_index} is missing from the state file.")
        return row

    def _unmask_row(self, round_row: RoundRow) -> UnmaskRow:
        row = self.store.unmask_request(round_row.round_index, round_row.unmask_attempt)
        if row is None:  # pragma: no cover - written with the status
            raise RuntimeError(f"round {round_row.round_index} has no unmask request.")
        return row

    def _roster_hash(self, row: SessionRow) -> bytes:
        """``noise.transcript.roster_hash`` of the joined nodes' keys (final once running)."""
        return roster_hash(row.config_hash, row.session_id, self.store.members())

    def state(self) -> str:
        """'joining', 'running', 'completed' or 'failed'."""
        return self._session().state

    def reason(self) -> str:
        """Why the session ended ('' while it runs or after it completed)."""
        return self._session().reason

    def check_caller(self, caller: str, claimed: str) -> None:
        """Refuse (PERMISSION_DENIED) unless ``caller`` (from its certificate) is ``claimed``.

        Also refuses a node outside the federation.
        """
        if caller != claimed:
            raise PermissionDenied(
                f"the client certificate belongs to node {caller!r} but the message claims "
                f"node_id {claimed!r}; a node may only speak for itself."
            )
        if claimed not in self.config.identity_keys:
            raise PermissionDenied(
                f"node_id {claimed!r} is not a member of federation "
                f"{self.config.federation_id!r} (members: {node_list(list(self.config.node_ids))})."
            )

    def _check_session_id(self, session_id: str, row: SessionRow) -> None:
        if session_id != row.session_id:
            raise InvalidArgument(
                f"session_id {session_id!r} is not this coordinator's session "
                f"{row.session_id!r}; ask GetStatus for the current session."
            )

    def _check_round(self, round_index: int, row: SessionRow) -> RoundRow:
        found = self.store.round(round_index)
        if found is None:
            if row.current_round is None:
                raise FailedPrecondition(
                    f"round_index {round_index} has not opened: the session is still "
                    f"{row.state} and no round has opened yet."
                )
            current = self._round_row(row.current_round)
            raise FailedPrecondition(
                f"round_index {round_index} has not opened; the current round is "
                f"{current.round_index} ({current.name!r})."
            )
        return found

    def _check_round_name(self, round_row: RoundRow, round_name: str) -> None:
        if round_name != round_row.name:
            raise InvalidArgument(
                f"round_name {round_name!r} does not match round {round_row.round_index}, "
                f"which is {round_row.name!r}."
            )

    def _check_live(self, node_id: str, row: SessionRow) -> None:
        member = next((m for m in self.store.members() if m.node_id == node_id), None)
        if member is None:
            closed = (
                "did not join before the join deadline" if row.roster_final else "has not joined"
            )
            raise FailedPrecondition(f"node {node_id!r} {closed} and is not part of this session.")
        if member.status == "dropped":
            raise FailedPrecondition(
                f"node {node_id!r} was dropped from this session in round "
                f"{member.dropped_round}: {member.dropped_reason}."
            )

    def _check_running(self, row: SessionRow) -> None:
        if row.state in (SessionState.COMPLETED, SessionState.FAILED):
            ended = "completed" if row.state == SessionState.COMPLETED else f"failed: {row.reason}"
            raise FailedPrecondition(f"session {row.session_id!r} has ended ({ended}).")

    def _check_bits(self, spec: PayloadSpec, what: str) -> None:
        expected = self.config.fixed_point_bits
        if spec.fixed_point_bits != expected:
            raise InvalidArgument(
                f"{what}: fixed_point_bits is {spec.fixed_point_bits}; the federation "
                f"uses {expected}."
            )

    def _open_round(self, round_index: int, name: str, participants: list[str], now: int) -> None:
        deadline = now + self.config.round_timeout_ms
        self.store.open_round(round_index, name, participants, now, deadline)
        # The round's layout is public (the plan's, from the federation config):
        # every payload of the round must have exactly this one.
        self.store.update_round(
            round_index,
            layout=self.config.layout(name),
            fixed_point_bits=self.config.fixed_point_bits,
        )
        self.store.update_session(current_round=round_index)
        self._note(
            f"round {round_index} ({name!r}) open for {node_list(participants)} until "
            f"{clock_text(deadline)}"
        )

    def _sum_for(self, round_row: RoundRow) -> RoundSum:
        """The running sum of ``round_row``, rebuilt from the stored files if needed."""
        if self._sum is not None and self._sum_round == round_row.round_index:
            return self._sum
        self._sum = None
        self._sum_round = round_row.round_index
        rebuilt = RoundSum(self.config.layout(round_row.name).size)
        included = set(round_row.participants)
        if round_row.status == RoundStatus.UNMASK:
            included = set(self._unmask_row(round_row).survivors)
        for upload in self.store.uploads(round_row.round_index):
            if upload.node_id in included:
                rebuilt.add_file(self.store.payload_path(upload.path))
        self._sum = rebuilt
        return rebuilt

    def _forget_sum(self) -> None:
        self._sum = None
        self._sum_round = -1

    def receive(self, ticket: Ticket, offset: int, data: bytes) -> None:
        """Take one chunk of a stream (uploads go straight into the running sum)."""
        if ticket.closed:
            raise FailedPrecondition(f"{ticket.what}: the stream has already ended.")
        if ticket.cancelled:
            raise FailedPrecondition(self._cancelled_sentence(ticket))
        if offset != ticket.received:
            raise InvalidArgument(
                f"{ticket.what}: chunk offset {offset}; expected {ticket.received} "
                "(chunks must be contiguous and in order)."
            )
        if len(data) > MAX_CHUNK_BYTES:
            raise InvalidArgument(
                f"{ticket.what}: a chunk of {len(data)} bytes exceeds the limit of "
                f"{MAX_CHUNK_BYTES} bytes."
            )
        if ticket.received + len(data) > ticket.spec.total_bytes:
            raise InvalidArgument(
                f"{ticket.what}: the payload runs past the {ticket.spec.total_bytes} bytes "
                "its header announced (wrong size)."
            )
        # Bytes reach the file before the sum, so a withdrawal can read them back.
        ticket.writer.write(data)
        if ticket.running is not None and ticket.contribution is not None:
            try:
                ticket.running.feed(ticket.contribution, data)
            except ContributionWithdrawn:
                raise FailedPrecondition(self._cancelled_sentence(ticket)) from None
        ticket.received += len(data)

    @staticmethod
    def _cancelled_sentence(ticket: Ticket) -> str:
        deadline = "round's" if ticket.kind == "upload" else "unmask request's"
        return (
            f"{ticket.what}: the {deadline} deadline passed and node {ticket.node_id!r} was "
            "dropped while the stream was in progress."
        )

    def _release(self, ticket: Ticket) -> None:
        """Undo a stream's partial sum and delete its file, unless it was stored."""
        if ticket.running is not None and ticket.contribution is not None:
            ticket.running.withdraw(ticket.contribution)
        ticket.writer.discard()
        if not ticket.committed:
            self._unlink_placed(ticket.writer.placed)

    def abandon(self, ticket: Ticket) -> None:
        """Discard a stream that failed or was cancelled; undo its partial sum. Idempotent."""
        with self._lock:
            if ticket.closed:
                return
            ticket.closed = True
            key = (ticket.kind, ticket.round_index, ticket.node_id)
            if self._tickets.get(key) is ticket:
                del self._tickets[key]
            if ticket.committed:
                return
            self._release(ticket)

    def finish(self, ticket: Ticket) -> UploadReceipt | UnmaskReceipt:
        """Verify size and checksum, store the payload and advance the round if complete."""
        try:
            if ticket.received != ticket.spec.total_bytes:
                raise InvalidArgument(
                    f"{ticket.what}: the stream ended after {ticket.received} of "
                    f"{ticket.spec.total_bytes} bytes (wrong size)."
                )
            digest = ticket.writer.finish()
            if digest != ticket.spec.sha256:
                raise InvalidArgument(
                    f"{ticket.what}: the payload's sha256 is {short_digest(digest)} but the header "
                    f"announced {short_digest(ticket.spec.sha256)}."
                )
            with self._lock:
                if ticket.kind == "upload":
                    return self._commit_upload(ticket)
                return self._commit_correction(ticket)
        except BaseException:
            self.abandon(ticket)
            raise

    @staticmethod
    def _unlink_placed(path: Path | None) -> None:
        if path is not None:
            path.unlink(missing_ok=True)

    def _write_result(self, running: RoundSum, round_index: int) -> tuple[str, bytes]:
        writer = self.store.new_payload()
        try:
            for block in running.iter_bytes():
                writer.write(block)
            digest = writer.finish()
            name = self.store.result_name(round_index, digest)
            writer.place(name)
        except BaseException:
            writer.discard()
            raise
        return name, digest

    def _publish(
        self,
        round_row: RoundRow,
        survivors: list[str],
        dropped: list[str],
        result: tuple[str, bytes],
        now: int,
    ) -> None:
        """Inside a transaction: record the result, mark the round ready, open the next."""
        name, digest = result
        size = self.store.payload_path(name).stat().st_size
        self.store.add_result(
            ResultRow(
                round_index=round_row.round_index,
                survivors=tuple(sorted(survivors)),
                dropped=tuple(sorted(dropped)),
                sha256=digest,
                size=size,
                path=name,
                computed_ms=now,
            )
        )
        self.store.update_round(round_row.round_index, status=RoundStatus.READY, reason="")
        self._note(
            f"round {round_row.round_index} ({round_row.name!r}) ready: the sum over "
            f"{node_list(survivors)} (sha256 {short_digest(digest)})"
        )
        following = self.config.next_round_name(round_row.name)
        if following is None:
            self.store.update_session(state=SessionState.COMPLETED, ended_ms=now)
            self._note(f"session completed after {round_row.round_index + 1} rounds")
        else:
            self._open_round(round_row.round_index + 1, following, sorted(survivors), now)

    def _withdraw_streams(self, kind: str, round_index: int, nodes: set[str]) -> None:
        """Cancel streams of dropped nodes: their partial sums leave the round at once."""
        for (k, r, node_id), ticket in list(self._tickets.items()):
            if k == kind and r == round_index and node_id in nodes:
                ticket.cancelled = True
                if ticket.running is not None and ticket.contribution is not None:
                    ticket.running.withdraw(ticket.contribution)
                del self._tickets[(k, r, node_id)]

    def _fail(self, round_row: RoundRow, reason: str, now: int) -> None:
        """Inside a transaction: the round and the session fail with ``reason``."""
        self.store.update_round(round_row.round_index, status=RoundStatus.FAILED, reason=reason)
        self.store.update_session(state=SessionState.FAILED, reason=reason, ended_ms=now)
        self._note(f"session failed: {reason}")

    def _note_terminal(self, caller: str, row: SessionRow) -> None:
        if row.state == SessionState.FAILED:
            self._notified.add(caller)

    def _commit_upload(self, ticket: Ticket) -> UploadReceipt:
        raise NotImplementedError  # pragma: no cover - provided by UploadSteps

    def _commit_correction(self, ticket: Ticket) -> UnmaskReceipt:
        raise NotImplementedError  # pragma: no cover - provided by UnmaskSteps
