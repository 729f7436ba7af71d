"""What one caller may take from the coordinator's server: calls at once, and time to speak.

A gRPC Python server runs each call in a worker thread until the call ends,
and a stream that never sends its first message would hold its thread
forever. So the server bounds three things (coordinator/guard.py applies
them to every call of every service):

* **calls at once per caller**: each node, identified by its client
  certificate, has at most ``calls_per_node`` calls in progress; one more is
  refused at once with RESOURCE_EXHAUSTED. Callers outside the federation
  (an operator's health probe with its own certificate) share one such
  allowance between them;
* **calls at once in total**: ``max_concurrent_rpcs`` (gRPC's own limit,
  RESOURCE_EXHAUSTED beyond it) and as many worker threads, so an admitted
  call never waits for a thread. Its default,
  ``calls_per_node · (K + 1)`` for K nodes plus a margin of
  :data:`TOTAL_MARGIN`, is more than every caller's allowance together: a
  member at its own limit cannot starve anyone else;
* **time to speak**: a stream's first message must arrive within
  ``first_message_seconds`` of the call starting, and each later message
  within ``message_gap_seconds`` of the server asking for it; otherwise the
  call ends with DEADLINE_EXCEEDED and its thread and allowance are free
  again. The server asks for a message only when it is ready for one (an
  upload waiting for a payload slot is not timed).

:class:`Watchdog` is one thread that fires the deadlines of every stream.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.errors import CoordinatorFailure

__all__ = [
    "DEFAULT_CALLS_PER_NODE",
    "DEFAULT_FIRST_MESSAGE_SECONDS",
    "DEFAULT_MESSAGE_GAP_SECONDS",
    "TOTAL_MARGIN",
    "CallSlots",
    "LimitsError",
    "ServerLimits",
    "Watchdog",
]

# An honest node makes one call at a time (node/protocol/client.py); four leave room for
# a retry that overlaps a call the node already gave up on.
DEFAULT_CALLS_PER_NODE = 4
# A node sends its first message as the call opens (the header is computed before).
DEFAULT_FIRST_MESSAGE_SECONDS = 5.0
# Chunks are at most 1 MiB: 30 s allows a link of about 35 KB/s.
DEFAULT_MESSAGE_GAP_SECONDS = 30.0
# Calls beyond the members' allowances: the deadline ticker's peers, a late
# status call while a call of the same node is being torn down.
TOTAL_MARGIN = 8
# Upper bounds of the settings: beyond them a value is a typo, not a policy.
_MAX_CALLS_PER_NODE = 1024
_MAX_TOTAL = 65_536
_MAX_SECONDS = 86_400.0


class LimitsError(CoordinatorFailure, ValueError):
    """A server limit outside its range (the sentence names the setting and the value)."""


def _check_seconds(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value)):
        raise LimitsError(f"{name} = {value!r}: must be a finite number of seconds.")
    if not 0.05 <= value <= _MAX_SECONDS:
        raise LimitsError(
            f"{name} = {value!r}: must be between 0.05 and {_MAX_SECONDS:.0f} seconds."
        )


@dataclass(frozen=True)
class ServerLimits:
    """The coordinator server's per-caller and total limits (see the module docstring).

    ``max_concurrent_rpcs`` None: ``calls_per_node · (K + 1) + TOTAL_MARGIN``
    for a federation of K nodes (:meth:`total_calls`).
    """

    calls_per_node: int = DEFAULT_CALLS_PER_NODE
    max_concurrent_rpcs: int | None = None
    first_message_seconds: float = DEFAULT_FIRST_MESSAGE_SECONDS
    message_gap_seconds: float = DEFAULT_MESSAGE_GAP_SECONDS

    def __post_init__(self) -> None:
        if isinstance(self.calls_per_node, bool) or not isinstance(self.calls_per_node, int):
            raise LimitsError(f"calls_per_node = {self.calls_per_node!r}: must be an integer.")
        if not 1 <= self.calls_per_node <= _MAX_CALLS_PER_NODE:
            raise LimitsError(
                f"calls_per_node = {self.calls_per_node}: must be between 1 and "
                f"{_MAX_CALLS_PER_NODE}."
            )
        total = self.max_concurrent_rpcs
        if total is not None and (
            isinstance(total, bool) or not isinstance(total, int) or not 1 <= total <= _MAX_TOTAL
        ):
            raise LimitsError(
                f"max_concurrent_rpcs = {total!r}: must be an integer between 1 and {_MAX_TOTAL}."
            )
        _check_seconds("first_message_seconds", self.first_message_seconds)
        _check_seconds("message_gap_seconds", self.message_gap_seconds)

    def total_calls(self, node_count: int) -> int:
        """Calls in progress at once over all callers (gRPC's ``maximum_concurrent_rpcs``)."""
        if self.max_concurrent_rpcs is not None:
            return self.max_concurrent_rpcs
        return self.calls_per_node * (node_count + 1) + TOTAL_MARGIN


class CallSlots:
    """How many calls each caller has in progress, against a per-caller limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def try_take(self, caller: str) -> bool:
        """Take one of ``caller``'s slots; False when it already holds ``limit``."""
        with self._lock:
            held = self._held.get(caller, 0)
            if held >= self.limit:
                return False
            self._held[caller] = held + 1
            return True

    def give_back(self, caller: str) -> None:
        """Return a slot taken by :meth:`try_take`."""
        with self._lock:
            held = self._held.get(caller, 0) - 1
            if held > 0:
                self._held[caller] = held
            else:
                self._held.pop(caller, None)

    def held(self, caller: str) -> int:
        """Slots ``caller`` holds now."""
        with self._lock:
            return self._held.get(caller, 0)


class Watchdog:
    """One daemon thread that runs each armed callback once its deadline passes.

    :meth:`arm` returns a token; :meth:`disarm` cancels it and tells whether
    the callback had already run (then the call it guards has been ended).
    Callbacks run on the watchdog's thread and must not block.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._condition = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="zerosum-watchdog", daemon=True)
        self._thread.start()

    def arm(self, seconds: float, callback: Callable[[], None]) -> int:
        """Run ``callback`` in ``seconds`` unless disarmed first."""
        with self._condition:
            token = next(self._tokens)
            self._callbacks[token] = callback
            due = self._clock() + seconds
            # The thread sleeps until the earliest deadline; it need only be
            # woken when this one comes sooner (a stream's next message
            # arms a later deadline than the ones already waiting).
            sooner = not self._heap or due < self._heap[0][0]
            heapq.heappush(self._heap, (due, token))
            if sooner:
                self._condition.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Cancel ``token``; True when its callback had already run."""
        with self._condition:
            self._callbacks.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def stop(self) -> None:
        """End the thread; callbacks not yet due never run."""
        with self._condition:
            self._stopped = True
            self._condition.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._stopped:
                    # Disarmed tokens stay in the heap until their time; skip them.
                    while self._heap and self._heap[0][1] not in self._callbacks:
                        heapq.heappop(self._heap)
                    if self._heap and self._heap[0][0] <= self._clock():
                        break
                    timeout = self._heap[0][0] - self._clock() if self._heap else None
                    self._condition.wait(timeout)
                if self._stopped:
                    return
                _, token = heapq.heappop(self._heap)
                callback = self._callbacks.pop(token)
                self._fired.add(token)
            # A callback only ends a call; one that fails must not stop the others.
            with contextlib.suppress(Exception):
                callback()
