"""Shared machinery for the integration tests: real processes, certificates and state files.

Every test in this folder runs the ``zerosum`` command line as separate
processes on 127.0.0.1 — a coordinator with its SQLite state file, and nodes
that hold their own TLS certificates and Ed25519 identity keys — the way TREs
run a session. The pieces:

* :func:`init_federation`: ``zerosum federation init --synthetic`` with small
  cohorts and short deadlines;
* :class:`Processes`: spawns ``python -m zerosum.cli ...`` with stdout and
  stderr in log files, and kills whatever still runs when the test ends;
* :func:`wait_until`: polls a condition with a bounded timeout (no sleeping
  and hoping), failing early when a process that should be running has exited;
* :class:`CoordinatorState`: the coordinator's SQLite file opened read-only,
  to see the moments a test acts on (roster final, an upload recorded, a round
  aggregated, an unmask attempt issued);
* :class:`SessionRun`: one session's coordinator and nodes, with approvals
  signed by the test for nodes started with ``--approve manual``;
* :func:`reference_model`: the brain-age model from plain sums over exactly
  the cohorts each round aggregated, the value an exact secure sum must give.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from numpy.typing import NDArray

from coordinator.store import payload_dir_for
from coordinator.store.rows import layout_from_json
from node.cohort import LocalCohort, load_cohort
from node.deltab.io import Table, read_table
from node.deltab.model import BrainAgeModel
from node.deltab.persist import load_model
from node.deltab.plan import NodeState, finish, receive, round_tensors
from node.deltab.stats import combine
from node.deltab.sums import MEANS, SUMS
from node.plans.deltab import plan_settings
from noise.fixed_point import wrapping_sum
from noise.keys import IdentityKey
from noise.layout import payload_digest
from noise.self_mask import self_mask
from proto.federation import FederationConfig, load_federation
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
        "--nodes",
        ",".join(nodes),
        "--out",
        str(out),
        "--synthetic",
        "--seed",
        str(seed),
        "--cohort-sizes",
        ",".join(str(n) for n in cohort_sizes),
        "--n-features",
        "12",
        "--n-components",
        "4",
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


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Processes of one test, killed at its teardown whatever happened."""
    spawned = Processes(tmp_path / "logs")
    try:
        yield spawned
    finally:
        spawned.close()


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    """Processes shared by a module's scenarios, killed when the module is done."""
    spawned = Processes(tmp_path_factory.mktemp("logs"))
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


class CoordinatorState:
    """The coordinator's SQLite state, opened read-only for each query.

    A missing file, a missing table or a locked database reads as "nothing
    yet": the coordinator may be starting, or being restarted.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if not self.path.exists():
            return []
        try:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=1.0)
        except sqlite3.Error:
            return []
        try:
            return list(db.execute(sql, tuple(params)).fetchall())
        except sqlite3.Error:
            return []
        finally:
            db.close()

    def session(self) -> dict[str, Any] | None:
        rows = self.query("SELECT session_id, state, reason, roster_final FROM session")
        if not rows:
            return None
        session_id, state, reason, roster_final = rows[0]
        return {
            "session_id": session_id,
            "state": state,
            "reason": reason,
            "roster_final": bool(roster_final),
        }

    def roster_final(self) -> bool:
        found = self.session()
        return bool(found and found["roster_final"])

    def members(self) -> dict[str, str]:
        """Joined node -> 'live' or 'dropped'."""
        return dict(self.query("SELECT node_id, status FROM roster"))

    def uploads(self, round_index: int) -> set[str]:
        rows = self.query("SELECT node_id FROM uploads WHERE round_index = ?", (round_index,))
        return {r[0] for r in rows}

    def round_status(self, round_index: int) -> str | None:
        rows = self.query("SELECT status FROM rounds WHERE round_index = ?", (round_index,))
        return rows[0][0] if rows else None

    def result(self, round_index: int) -> tuple[tuple[str, ...], U64] | None:
        """(survivors, aggregate) of a published round, read from the payload file."""
        rows = self.query(
            "SELECT survivors, path FROM results WHERE round_index = ?", (round_index,)
        )
        if not rows:
            return None
        survivors, name = rows[0]
        data = (payload_dir_for(self.path) / name).read_bytes()
        return tuple(json.loads(survivors)), np.frombuffer(data, dtype="<u8").astype(np.uint64)

    def unmasked_sha256(self, round_index: int, node_id: str) -> str:
        """SHA-256 of ``node_id``'s stored upload less the self-mask whose seed it revealed.

        That is the payload of its egress bundle (or its CAPE-sum share).
        """
        rows = self.query(
            "SELECT path, layout FROM uploads WHERE round_index = ? AND node_id = ?",
            (round_index, node_id),
        )
        seeds = self.query(
            "SELECT self_mask_seed FROM unmask_corrections WHERE round_index = ? AND node_id = ?",
            (round_index, node_id),
        )
        assert len(rows) == 1 and len(seeds) == 1, (rows, seeds)
        (name, layout_text), ((seed,),) = rows[0], seeds
        sent = np.frombuffer((payload_dir_for(self.path) / name).read_bytes(), dtype="<u8")
        pad = self_mask(bytes(seed), layout_from_json(layout_text), round_index=round_index)
        return payload_digest(sent.astype(np.uint64) - pad).hex()

    def unmask_attempts(self, round_index: int) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """(survivors, dropped) of each unmask attempt of a round, in order."""
        rows = self.query(
            "SELECT survivors, dropped FROM unmask_requests WHERE round_index = ? ORDER BY attempt",
            (round_index,),
        )
        return [(tuple(json.loads(s)), tuple(json.loads(d))) for s, d in rows]

    def refusals(self) -> list[tuple[int, str, str]]:
        return [
            (int(r), n, why)
            for r, n, why in self.query("SELECT round_index, node_id, reason FROM unmask_refusals")
        ]


# ---------------------------------------------------------------- one session


@dataclass
class SessionRun:
    """A coordinator and nodes of one session, in their own folder with their own port."""

    federation: Federation
    folder: Path
    processes: Processes
    port: int = field(default_factory=free_port)
    coordinators: list[Spawned] = field(default_factory=list)
    nodes: dict[str, Spawned] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.state = CoordinatorState(self.folder / "coordinator" / "state.sqlite")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def label(self) -> str:
        return self.folder.name

    @property
    def coordinator(self) -> Spawned:
        return self.coordinators[-1]

    def everyone(self) -> list[Spawned]:
        return [self.coordinator, *self.nodes.values()]

    def start_coordinator(self) -> Spawned:
        """Start (or, after a crash, restart with the same arguments) and wait until it listens."""
        spawned = self.processes.zerosum(
            f"{self.label}-coordinator",
            "coordinator",
            "--federation",
            str(self.federation.toml),
            "--state",
            str(self.state.path),
            "--listen",
            self.address,
        )
        self.coordinators.append(spawned)
        wait_until(
            lambda: f"listening on {self.address}" in spawned.stderr(),
            what=f"{spawned.name} to listen on {self.address}",
            alive=[spawned],
        )
        return spawned

    def out(self, node_id: str) -> Path:
        return self.folder / f"out-{node_id}"

    def state_folder(self, node_id: str) -> Path:
        """The node's state folder: one per run, as the runs stand for separate deployments."""
        return self.folder / f"state-{node_id}"

    def start_node(
        self, node_id: str, *, approve: str = "auto", env: Mapping[str, str] | None = None
    ) -> Spawned:
        spawned = self.processes.zerosum(
            f"{self.label}-{node_id}",
            "node",
            "--federation",
            str(self.federation.toml),
            "--node-id",
            node_id,
            "--out",
            str(self.out(node_id)),
            "--state",
            str(self.state_folder(node_id)),
            "--approve",
            approve,
            "--coordinator",
            self.node_dials(),
            env=env,
        )
        self.nodes[node_id] = spawned
        return spawned

    def node_dials(self) -> str:
        """The address nodes dial: the coordinator's (a test may put a proxy between)."""
        return self.address

    def egress(self, node_id: str, round_index: int) -> Path:
        return self.out(node_id) / "egress" / f"round-{round_index}"

    def at_gate(self, node_id: str, round_index: int) -> Path:
        """Wait until the node has written round ``round_index``'s egress bundle."""
        folder = self.egress(node_id, round_index)
        wait_until(
            (folder / "manifest.json").exists,
            what=f"node {node_id!r} to write its round-{round_index} egress bundle",
            alive=[self.nodes[node_id]],
        )
        return folder

    def approve(self, node_id: str, round_index: int) -> None:
        """As the node's output checker: wait for the bundle, review it, sign the approval.

        ``zerosum review --audit … --approve`` re-checks the real bundle (and
        its noise against the audit record) and signs with the checker key of
        the node; it must pass every check to sign.
        """
        folder = self.at_gate(node_id, round_index)
        audit = self.out(node_id) / "audit" / f"round-{round_index}"
        # The manifest is written before the checksums, the audit record after the bundle.
        wait_until(
            lambda: (
                (folder / "checksums" / "manifest.json.txt").exists()
                and (audit / "audit.json").exists()
            ),
            what=f"node {node_id!r} to finish writing its round-{round_index} bundle",
            alive=[self.nodes[node_id]],
        )
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            code = zerosum_main(
                [
                    "review",
                    str(folder),
                    "--federation",
                    str(self.federation.toml),
                    "--audit",
                    str(audit),
                    "--approve",
                    "--key",
                    str(self.federation.root / "checkers" / node_id / "checker.pem"),
                    "--reviewer",
                    "integration test",
                    "--comment",
                    "approved by the test driving this session",
                ]
            )
        assert code == 0, f"review of {folder} refused to approve:\n{printed.getvalue()}"

    def wait_all(self, timeout: float = SESSION_TIMEOUT) -> dict[str, int]:
        """Wait for the coordinator and every node; their exit statuses by name."""
        deadline = time.monotonic() + timeout
        codes = {}
        for name, spawned in [("coordinator", self.coordinator), *self.nodes.items()]:
            codes[name] = spawned.wait(max(1.0, deadline - time.monotonic()))
        return codes

    def model(self, node_id: str) -> BrainAgeModel:
        return load_model(self.out(node_id) / "model.json")

    def audit_payload(self, node_id: str, round_index: int) -> U64:
        path = self.out(node_id) / "audit" / f"round-{round_index}" / "payload.npy"
        return np.asarray(np.load(path, allow_pickle=False), dtype=np.uint64)

    def audit_sum(self, node_ids: Iterable[str], round_index: int) -> U64:
        """Σ of the nodes' un-noised fixed-point payloads, modulo 2^64."""
        return wrapping_sum([self.audit_payload(n, round_index) for n in sorted(node_ids)])

    def ledger(self, node_id: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.out(node_id) / "ledger.json").read_text())
        return data

    def describe(self) -> str:
        return "\n".join(s.describe() for s in [*self.coordinators, *self.nodes.values()])


# ---------------------------------------------------------------- what the result must be


def reference_model(
    federation: Federation, means_nodes: Iterable[str], sums_nodes: Iterable[str]
) -> BrainAgeModel:
    """The model from plain (noise-free) sums over the cohorts each round aggregated.

    Round "means" sums over ``means_nodes``; every node of ``sums_nodes`` takes
    those global means and the "sums" round sums over them
    (node/deltab/plan.py). With every round over the same nodes this is
    ``plan.run_in_process`` on those cohorts, i.e. the pooled fit.
    """
    settings = plan_settings(federation.config)
    first, second = sorted(means_nodes), sorted(sums_nodes)
    cohorts = {n: federation.cohort(n) for n in {*first, *second}}
    states = {n: NodeState(settings=settings) for n in cohorts}
    means = combine(
        [round_tensors(MEANS, cohorts[n].features, cohorts[n].age, states[n]) for n in first]
    )
    for n in second:
        receive(MEANS, means, states[n])
    sums = combine(
        [round_tensors(SUMS, cohorts[n].features, cohorts[n].age, states[n]) for n in second]
    )
    return finish({MEANS: means, SUMS: sums}, settings)


def relative_difference(model: BrainAgeModel, reference: BrainAgeModel, holdout: Table) -> float:
    """max |brain age − reference brain age| / max |reference brain age| on the holdout."""
    assert holdout.age is not None
    got = np.asarray(model.predict_age(holdout.features, holdout.age))
    want = np.asarray(reference.predict_age(holdout.features, holdout.age))
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
