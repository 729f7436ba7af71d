"""Real processes for the tests: federations on disk, spawned commands, bounded waits.

* :func:`init_federation`: ``zerosum federation init --synthetic`` with small
  cohorts and short deadlines;
* :class:`Processes`: spawns ``python -m zerosum.cli ...`` with stdout and
  stderr in log files, and kills whatever still runs when it is closed (the
  ``processes`` fixtures of ``tests/conftest.py`` close it at teardown);
* :func:`wait_until`: polls a condition with a bounded timeout (no sleeping
  and hoping), failing early when a process that should be running has exited;
* :func:`run_concurrently`, :class:`Turns`, :func:`outcome`: jobs on threads
  whose results or exceptions are kept by name.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from node.deltab.io import Table, read_table
from node.plans.deltab.cohort import LocalCohort, load_cohort
from noise.keys import IdentityKey
from proto.federation import FederationConfig, load_federation
from tests.support.synthetic_init import synthetic_flags
from zerosum.cli import main as zerosum_main

T = TypeVar("T")
U64 = NDArray[np.uint64]

# Generous bounds: they only matter when something is broken, and the suite
# must not fail spuriously on a loaded 2-core machine.
START_TIMEOUT = 90.0
SESSION_TIMEOUT = 150.0
POLL_SECONDS = 0.05


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- federations


@dataclass(frozen=True)
class Federation:
    """A federation folder written by ``zerosum federation init --synthetic``."""

    root: Path
    config: FederationConfig

    @property
    def toml(self) -> Path:
        return self.root / "federation.toml"

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self.config.node_ids

    def identity(self, node_id: str) -> IdentityKey:
        return IdentityKey.read_pem(self.root / "nodes" / node_id / "identity.pem")

    def checker(self, node_id: str) -> IdentityKey:
        """The output checker key ``federation init`` made for ``node_id``."""
        return IdentityKey.read_pem(self.root / "checkers" / node_id / "checker.pem")

    def data(self, node_id: str) -> Path:
        return self.root / "nodes" / node_id / "data.csv"

    def cohort(self, node_id: str) -> LocalCohort:
        return load_cohort(self.data(node_id), self.config)

    def holdout(self) -> Table:
        return read_table(self.root / "holdout.csv")


def init_federation(
    out: Path,
    nodes: Sequence[str],
    *,
    cohort_sizes: Sequence[int],
    join_deadline: float,
    round_deadline: float,
    seed: int = 11,
    nan_policy: str = "mean",
    extra: Sequence[str] = (),
) -> Federation:
    """Run ``zerosum federation init --synthetic`` (small cohorts, 12 features, 4 components).

    ``nan_policy = "mean"`` (the default here) gives a two-round plan, "means" then
    "sums", so that a test can act between rounds; "drop" gives the one-round plan.
    """
    argv = [
        "federation",
        "init",
        "--out",
        str(out),
        *synthetic_flags(
            nodes,
            seed=seed,
            n_features=12,
            n_components=4,
            cohort_sizes=",".join(str(n) for n in cohort_sizes),
        ),
        "--holdout-size",
        "100",
        # Every run overrides the port (--listen, --coordinator); the host
        # goes into the server certificate.
        "--coordinator",
        "127.0.0.1:1",
        "--join-deadline",
        str(join_deadline),
        "--round-deadline",
        str(round_deadline),
        "--nan-policy",
        nan_policy,
        *extra,
    ]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = zerosum_main(argv)
    assert code == 0, f"federation init failed: {printed.getvalue()}"
    return Federation(out, load_federation(out / "federation.toml"))


# ---------------------------------------------------------------- processes


@dataclass
class Spawned:
    """One ``zerosum`` process, its stdout and stderr in files."""

    name: str
    argv: tuple[str, ...]
    popen: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def stderr(self) -> str:
        return _read(self.stderr_path)

    def stdout(self) -> str:
        return _read(self.stdout_path)

    def describe(self) -> str:
        code = self.popen.poll()
        state = "running" if code is None else f"exit {code}"
        tail = "\n".join(("    " + line) for line in self.stderr().splitlines()[-12:])
        return f"{self.name} ({state}), last stderr lines:\n{tail}"

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} did not exit within {timeout:.0f} s\n{self.describe()}"
            ) from None

    def kill(self) -> int:
        """SIGKILL (a crash, as ``kill -9``) and reap; returns the exit status (-9)."""
        if self.running():
            # The process id is ours: a child this test started and has not reaped.
            os.kill(self.pid, signal.SIGKILL)
        return self.popen.wait(timeout=30)

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its connections but does nothing at all."""
        os.kill(self.pid, signal.SIGSTOP)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


class Processes:
    """Spawns ``python -m zerosum.cli ...`` processes; :meth:`close` kills any still running."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.spawned: list[Spawned] = []
        self._lock = threading.Lock()

    def zerosum(self, name: str, *argv: str, env: Mapping[str, str] | None = None) -> Spawned:
        self.logs.mkdir(parents=True, exist_ok=True)
        with self._lock:
            taken = {s.name for s in self.spawned}
            unique, k = name, 1
            while unique in taken:
                k += 1
                unique = f"{name}-{k}"
            out = self.logs / f"{unique}.stdout"
            err = self.logs / f"{unique}.stderr"
            environment = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
            with out.open("wb") as stdout, err.open("wb") as stderr:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "zerosum.cli", *argv],
                    stdout=stdout,
                    stderr=stderr,
                    stdin=subprocess.DEVNULL,
                    env=environment,
                )
            spawned = Spawned(unique, tuple(argv), popen, out, err)
            self.spawned.append(spawned)
            return spawned

    def close(self) -> None:
        for spawned in self.spawned:
            if spawned.running():
                # SIGKILL also ends a process stopped with SIGSTOP.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(spawned.pid, signal.SIGKILL)
        for spawned in self.spawned:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spawned.popen.wait(timeout=30)


P = TypeVar("P", bound=Processes)


def closed_at_end(spawned: P) -> Iterator[P]:
    """Yield ``spawned``, closing it however the block ends (the body of a processes fixture)."""
    try:
        yield spawned
    finally:
        spawned.close()


def wait_until(
    condition: Callable[[], T | None],
    *,
    what: str,
    timeout: float = START_TIMEOUT,
    alive: Iterable[Spawned] = (),
) -> T:
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout`` seconds.

    Fails at once, with the process's log, when a process in ``alive`` has
    exited (the moment waited for can then never come).
    """
    watched = list(alive)
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        for spawned in watched:
            if not spawned.running():
                raise AssertionError(
                    f"{spawned.name} exited while waiting for {what}\n{spawned.describe()}"
                )
        if time.monotonic() > deadline:
            logs = "\n".join(s.describe() for s in watched)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")
        time.sleep(POLL_SECONDS)


def run_concurrently(jobs: Mapping[str, Callable[[], T]]) -> dict[str, T | BaseException]:
    """Run each job in its own thread; its return value, or the exception it raised."""
    results: dict[str, T | BaseException] = {}

    def run(name: str, job: Callable[[], T]) -> None:
        try:
            results[name] = job()
        except BaseException as error:
            results[name] = error

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SESSION_TIMEOUT * 2)
    for name in jobs:
        results.setdefault(name, AssertionError(f"scenario {name!r} did not finish"))
    return results


class Turns:
    """Lets concurrent scenarios start one after another, in a fixed order.

    Starting every process at once would make each one's start-up (imports,
    keys, data) slow enough on two cores to miss a short join deadline;
    serialising only the start-up keeps the rest of the scenarios overlapping.
    """

    def __init__(self, order: Sequence[str]) -> None:
        self._order = list(order)
        self._done = {name: threading.Event() for name in order}

    @contextlib.contextmanager
    def turn(self, name: str) -> Iterator[None]:
        position = self._order.index(name)
        if position:
            self._done[self._order[position - 1]].wait(timeout=SESSION_TIMEOUT)
        try:
            yield
        finally:
            self._done[name].set()


def outcome(results: Mapping[str, T | BaseException], name: str) -> T:
    """A scenario's result; re-raises what it raised, so the test reports that."""
    value = results[name]
    if isinstance(value, BaseException):
        raise value
    return value


# ---------------------------------------------------------------- the coordinator's state
