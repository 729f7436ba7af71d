"""A loopback TCP proxy that delays, drops, truncates and resets connections by a seeded schedule.

Nodes connect to the proxy instead of the coordinator; TLS runs end to end
through it (the proxy sees only ciphertext), so a fault here is what a broken
network does to a session, not a forged message. Connection k (in accept
order) gets the k-th fault drawn by :class:`FaultSchedule`:

* ``pass``: bytes go both ways untouched;
* ``delay``: every chunk waits ``delay_seconds`` before it is forwarded;
* ``drop``: the connection is accepted and read but never forwarded (a black
  hole), then closed after ``hold_seconds``;
* ``truncate``: after ``after_bytes`` bytes forwarded (both directions
  together), both sides are closed cleanly (FIN) in mid-stream;
* ``reset``: the same, but closed with SO_LINGER 0, i.e. a TCP RST.

Bounded: it listens on 127.0.0.1 only, serves at most ``max_connections``
connections at once (more are closed at accept), and every connection thread
ends when either side closes, at its fault, or at :meth:`FaultyProxy.close`.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["KINDS", "Fault", "FaultSchedule", "FaultyProxy"]

KINDS = ("pass", "delay", "drop", "truncate", "reset")
_CHUNK = 64 << 10


@dataclass(frozen=True)
class Fault:
    kind: str
    after_bytes: int = 0
    delay_seconds: float = 0.0
    hold_seconds: float = 0.0


class FaultSchedule:
    """The fault of each new connection, from a seeded ``numpy.random.Generator``.

    Each of the first ``faulty_connections`` connections is faulty with
    probability ``rate`` (its kind uniform over the four faults); every later
    connection passes, so that a session can finish once the weather clears.
    ``script`` gives the first connections' faults explicitly instead.
    """

    def __init__(
        self,
        seed: int,
        *,
        rate: float = 0.5,
        faulty_connections: int = 12,
        script: Sequence[Fault] = (),
    ) -> None:
        self.seed = seed
        self._script = list(script)
        self._rng = np.random.default_rng(seed)
        self._rate = rate
        self._left = faulty_connections
        self._lock = threading.Lock()

    def next(self) -> Fault:
        with self._lock:
            if self._script:
                return self._script.pop(0)
            if self._left <= 0:
                return Fault("pass")
            self._left -= 1
            if self._rng.random() >= self._rate:
                return Fault("pass")
            kind = str(self._rng.choice(KINDS[1:]))
            return Fault(
                kind,
                after_bytes=int(self._rng.integers(0, 40_000)),
                delay_seconds=float(self._rng.uniform(0.01, 0.3)),
                hold_seconds=float(self._rng.uniform(1.0, 8.0)),
            )


@dataclass
class _Record:
    index: int
    fault: Fault
    forwarded: int = 0
    acted: bool = False


@dataclass
class FaultyProxy:
    """Listens on 127.0.0.1 (any free port) and forwards to 127.0.0.1:``target_port``."""

    target_port: int
    schedule: FaultSchedule
    max_connections: int = 64
    records: list[_Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(target=self._accept, name="faulty-proxy", daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def faults(self) -> dict[str, int]:
        """How many connections got each kind of fault that actually happened."""
        counts = dict.fromkeys(KINDS, 0)
        for record in self.records:
            kind = record.fault.kind
            happened = kind in ("pass", "delay", "drop") or record.acted
            counts[kind if happened else "pass"] += 1
        return counts

    def close(self) -> None:
        self._stopping.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                busy = sum(t.is_alive() for t in self._threads)
            if busy >= self.max_connections:
                client.close()
                continue
            record = _Record(len(self.records), self.schedule.next())
            self.records.append(record)
            thread = threading.Thread(
                target=self._serve, args=(client, record), name="faulty-proxy-conn", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _serve(self, client: socket.socket, record: _Record) -> None:
        self._track(client)
        fault = record.fault
        upstream: socket.socket | None = None
        try:
            if fault.kind == "drop":
                self._black_hole(client, fault.hold_seconds)
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            self._track(upstream)
            self._pump(client, upstream, record)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()

    def _black_hole(self, client: socket.socket, hold: float) -> None:
        client.settimeout(0.1)
        give_up = time.monotonic() + hold
        while time.monotonic() < give_up and not self._stopping.is_set():
            try:
                if not client.recv(_CHUNK):
                    return
            except TimeoutError:
                continue

    def _pump(self, client: socket.socket, upstream: socket.socket, record: _Record) -> None:
        fault = record.fault
        peers = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ)
            selector.register(upstream, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in selector.select(timeout=0.2):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = source.recv(_CHUNK)
                    if not data:
                        return
                    if fault.kind in ("truncate", "reset"):
                        room = fault.after_bytes - record.forwarded
                        if room <= 0:
                            record.acted = True
                            if fault.kind == "reset":
                                linger = struct.pack("ii", 1, 0)
                                for sock in (client, upstream):
                                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                            else:
                                for sock in (client, upstream):
                                    with contextlib.suppress(OSError):
                                        sock.shutdown(socket.SHUT_RDWR)
                            return
                        data = data[:room]
                    if fault.kind == "delay":
                        time.sleep(fault.delay_seconds)
                    peers[source].sendall(data)
                    record.forwarded += len(data)
