"""What every step of a session shares: store, config, clock, log, lock and the running sum.

A session is a few step objects (coordinator/steps/) over one
:class:`CoordinatorContext`; the context is the only state they share. It holds

* the store and the federation's :class:`~coordinator.config.SessionConfig`;
* the clock (Unix milliseconds; tests pass a fake one) and the session lock,
  a re-entrant lock every step takes before it reads or writes state, so a
  check and the write that depends on it see the same state;
* :meth:`CoordinatorContext.transition`, one store transaction whose log lines
  (:meth:`CoordinatorContext.note`) are emitted only once it has committed, so
  the log never tells of a change a crash undid; after each commit, still
  under the session lock, it calls whoever listens for commits
  (:meth:`CoordinatorContext.listen`: the held result polls, which wake only
  when what they wait on has changed);
* the current round's running sum, rebuilt from the stored payload files
  whenever it is not in memory (after a restart, or after a step dropped it
  because it may be stale).

* the Ed25519 verdicts of the session (:class:`SignatureChecks`): a step
  verifies the signatures a request carries before it takes the session lock
  (verification releases the GIL and needs no state), and the checks under the
  lock, in their usual order, find the verdict already made.

It also has the small phrase helpers every refusal sentence uses.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from coordinator.aggregate import RoundSum
from coordinator.config import SessionConfig
from coordinator.logs import Note
from coordinator.store import RoundRow, SessionRow, Store, UnmaskRow
from noise.transcript import roster_hash
from proto.messages import (
    RoundState,
)

__all__ = [
    "CoordinatorContext",
    "SignatureChecks",
    "Signed",
    "clock_text",
    "node_list",
    "short_digest",
    "verify_ed25519",
    "wall_clock_ms",
]


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


Signed = tuple[bytes, bytes, bytes]  # (public key, signature, message)


class SignatureChecks:
    """Ed25519 verdicts, each computed once: ahead of the session lock, or when first asked.

    A verdict is a pure function of (key, signature, message), so one made
    before the lock is the one the check under the lock would make; only
    where the work happens changes. At most :attr:`LIMIT` verdicts are kept
    (the oldest go first): a round needs about 2·K².
    """

    LIMIT = 1 << 14

    def __init__(self) -> None:
        self._verdicts: dict[Signed, bool] = {}
        self._lock = threading.Lock()

    def verify(self, public_key: bytes, signature: bytes, message: bytes) -> bool:
        """True when ``signature`` is ``public_key``'s signature of ``message``."""
        item = (public_key, signature, message)
        verdict = self._verdicts.get(item)
        if verdict is None:
            verdict = verify_ed25519(public_key, signature, message)
            with self._lock:
                if len(self._verdicts) >= self.LIMIT:
                    del self._verdicts[next(iter(self._verdicts))]
                self._verdicts[item] = verdict
        return verdict

    def verify_ahead(self, items: Iterator[Signed] | list[Signed]) -> None:
        """Make the verdicts of ``items`` now (the caller holds no session lock)."""
        for public_key, signature, message in items:
            self.verify(public_key, signature, message)


class CoordinatorContext:
    """The state the steps of one session share (see the module docstring)."""

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
        self.clock = clock
        self.lock = threading.RLock()
        self._log = log
        self._notes: list[str] = []
        self._sum: RoundSum | None = None
        self._sum_round = -1
        # Called after each commit, under the session lock (listen).
        self._listeners: list[Callable[[], None]] = []
        self.signatures = SignatureChecks()

    # ------------------------------------------------------------ transitions and log

    @contextmanager
    def transition(self) -> Iterator[None]:
        """One store transaction; the log lines noted inside are emitted once it commits."""
        with self.lock:
            self._notes = []
            with self.store.transaction():
                yield
            for listener in self._listeners:
                listener()
            notes, self._notes = self._notes, []
        if self._log is not None:
            for line in notes:
                self._log(line)

    def note(self, line: str, *, event: str = "transition", node: str = "") -> None:
        """A log line for the transition in progress (dropped if it rolls back).

        ``event`` names what happened and ``node`` whom it concerns, for the
        structured log (coordinator/logs.py).
        """
        self._notes.append(Note(line, event=event, node=node))

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every commit, under the session lock, before the log lines.

        A listener reads state (it must not start a transition) and should be
        cheap: every commit waits for it.
        """
        self._listeners.append(listener)

    # ------------------------------------------------------------ rows every step reads

    def session(self) -> SessionRow:
        """The session row (the state file always has one once the session started)."""
        row = self.store.session()
        if row is None:  # pragma: no cover - created when the session starts
            raise RuntimeError("the state file has no session.")
        return row

    def round_row(self, round_index: int) -> RoundRow:
        """A round known to exist."""
        row = self.store.round(round_index)
        if row is None:  # pragma: no cover - callers check first
            raise RuntimeError(f"round {round_index} is missing from the state file.")
        return row

    def unmask_row(self, round_row: RoundRow) -> UnmaskRow:
        """The unmask attempt ``round_row`` is waiting for."""
        row = self.store.unmask_request(round_row.round_index, round_row.unmask_attempt)
        if row is None:  # pragma: no cover - written with the status
            raise RuntimeError(f"round {round_row.round_index} has no unmask request.")
        return row

    def roster_hash(self, row: SessionRow) -> bytes:
        """``noise.transcript.roster_hash`` of the joined nodes' keys (final once running)."""
        return roster_hash(row.config_hash, row.session_id, self.store.members())

    # ------------------------------------------------------------ the running sum

    @property
    def current_sum(self) -> RoundSum | None:
        """The running sum in memory, if any."""
        return self._sum

    def sum_for(self, round_row: RoundRow) -> RoundSum:
        """The running sum of ``round_row``, rebuilt from the stored files if needed.

        While the round is open it is the sum of its stored uploads; while it
        awaits unmasking, of the uploads of the current survivors.
        """
        if self._sum is not None and self._sum_round == round_row.round_index:
            return self._sum
        self._sum = None
        self._sum_round = round_row.round_index
        rebuilt = RoundSum(self.config.layout(round_row.name).size)
        included = set(round_row.participants)
        if round_row.status == RoundState.AWAITING_UNMASK:
            included = set(self.unmask_row(round_row).survivors)
        for upload in self.store.uploads(round_row.round_index):
            if upload.node_id in included:
                rebuilt.add_file(self.store.payload_path(upload.path))
        self._sum = rebuilt
        return rebuilt

    def forget_sum(self) -> None:
        """Drop the running sum; the next :meth:`sum_for` rebuilds it from the files."""
        self._sum = None
        self._sum_round = -1
