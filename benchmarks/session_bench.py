"""One aggregation round of a real session: node processes, coordinator process, mutual TLS.

Everything runs on 127.0.0.1 as separate processes: a federation made by
``zerosum federation init`` in a temporary folder, the coordinator started as
``python -m zerosum.cli coordinator --federation F --state S --listen
127.0.0.1:0`` (a fresh state file, hence a fresh session, each time), and K
node processes (benchmarks/_session_worker.py), each a
:class:`~node.client.CoordinatorClient` that joins with an ephemeral X25519 key
signed by its Ed25519 identity key, verifies the roster and derives its
pairwise seeds before any timing starts.

**The round** (``round_seconds_k10_d1e6``). K = 10 nodes hold d = 10^6
float64 values each. The clock starts when the parent sends every node its
start line (a barrier: nothing of the round is done before) and stops when
the last node holds the round's aggregate. In between each node

1. encodes its values in fixed point (the federation's ``fixed_point_bits``)
   and adds its pairwise mask over the complete 10-node design
   (``noise.masks.pairwise_mask``: 9 keyed Gaussian streams of 10^6 draws);
2. uploads the 8 MB payload in 1 MiB chunks (header with layout and SHA-256
   first); the coordinator adds each chunk into the round's running sum as it
   arrives, writes it to its state folder, checks size and SHA-256, records
   the upload in SQLite and, on the last upload, writes and publishes the sum;
3. polls ``GetResult`` every 10 ms until the round is ready, then downloads
   the 8 MB aggregate (checked against its SHA-256).

A mask depends on the pairwise seeds, the round, the layout and the design,
never on data, so a node draws it as soon as it knows those — after the
roster, or after the previous round's result — while it computes its
statistics or waits for the round to open (``node.masking.MaskPrefetch``, as
``NodeRunner`` does). The headline round therefore adds a mask drawn ahead:
just before the start line every node is told to draw it, and the time all
10 processes take to do so side by side is ``mask_draw_seconds_k10_d1e6``.
Two other kinds of round are measured as well:
``round_seconds_k10_d1e6_masks_in_round`` draws the mask inside the timed
window, after the start line (what a node that cannot draw ahead would pay;
``round_masking_seconds_k10_d1e6`` is the time until the last node finished
step 1 there), and ``round_seconds_k10_d1e6_upload_only`` adds no mask
(steps 2 and 3 only: what the coordinator and the network cost).

Every node's aggregate is compared with Σ_k q(x_k) computed in the parent:
the masks must cancel bit for bit. A session has as many rounds as the
federation's round plan (``coordinator.config.SessionConfig.plan``: "moments"
and "scatter" under the pairwise construction). In every session the first
round is a drawn-ahead round and the second alternates between the two other
kinds, so the benchmark runs 2 · ``repeats`` + 1 sessions (the first is a
warm-up): ``repeats`` samples of each alternating kind, twice as many of the
headline.

**Baselines.** ``round_ratio_vs_flower_secagg_reference``: the round over
2.2 s, the time Flower's secure aggregation (SecAgg, Bonawitz et al. 2017,
ACM CCS; every node a neighbour of every other) took for the same K and d on
this class of machine: a fixed reference, not re-measured here
(``..._masks_in_round``: the same for the in-window round).
``round_ratio_vs_plain_grpc[_masks_in_round|_upload_only]``: in every
session, right before or after each round (alternating), the same node
processes run the same round — same masking, same bytes, same TLS
certificates — against a bare gRPC sum server (benchmarks/_plain_grpc.py, in
this process: raw-byte messages, no header, checksum, state or polling; a
download blocks until the sum is complete). Each figure is the median of the
per-session ratios session round / bare round, and
``plain_grpc_round_seconds_k10_d1e6[...]`` are the bare rounds' own medians.
Masking is CPU work in the node processes: with 10 of them on a machine with
few cores, drawing inside the window bounds the round from below whatever
the transport.

**Coordinator memory** (``coordinator_peak_rss_mb_k{5,20}_d1e6``). For K = 5
and K = 20 nodes (separate federations), a fresh coordinator process runs one
round of d = 10^6 values per node; once every node holds the aggregate, the
benchmark reads the coordinator's peak resident set size, VmHWM from
/proc/<pid>/status (exact, kept by the kernel), and stops it. Nodes upload
without masks here: masking happens in the node processes and would only
slow the run on a small machine. ``coordinator_rss_ratio_k20_vs_k5`` is the
ratio of the medians; the coordinator keeps one running sum per round, not
one vector per node, so it should stay well under 1.5.

Every wait is bounded (:data:`MEASUREMENT_SECONDS` per session), and every
process started here is stopped when the benchmark ends, whatever happens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from benchmarks._plain_grpc import PlainSumServer
from benchmarks._session_worker import MASK_MODES, PLAIN_TENSOR, TENSOR, node_values
from coordinator.config import SessionConfig
from noise.fixed_point import FixedPointCodec, wrapping_sum
from noise.layout import Layout
from proto.federation import RoundSpec, config_hash, dump_federation, load_federation

__all__ = ["FLOWER_SECAGG_REFERENCE_SECONDS", "MEASUREMENT_SECONDS", "run"]

FLOWER_SECAGG_REFERENCE_SECONDS = 2.2
MEASUREMENT_SECONDS = 120.0
ROUND_NODES = 10
MEMORY_NODES = (5, 20)
VALUES_PER_NODE = 10**6

_ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


class _Deadline:
    """A time limit shared by every wait of one measurement."""

    def __init__(self, seconds: float, what: str) -> None:
        self._end = time.monotonic() + seconds
        self._seconds = seconds
        self._what = what

    def remaining(self, waiting_for: str) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"{self._what} took longer than {self._seconds:.0f} s (waiting for {waiting_for})."
            )
        return left


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    # One numpy thread per process: K processes already share the cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


class _Lines:
    """The lines of a child's output pipe, read by a thread as they come."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._queue: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for line in self._stream:
            self._queue.put(line.rstrip("\n"))

    def get(self, timeout: float) -> str:
        """The next line; queue.Empty if none came within ``timeout`` seconds."""
        return self._queue.get(timeout=timeout)

    def close(self) -> None:
        """Once the child has exited: let the reader reach the end, then close the pipe."""
        self._thread.join(timeout=5)
        self._stream.close()


class _Worker:
    """A node process answering one JSON line per command."""

    def __init__(self, federation: Path, node_id: str, index: int, size: int, log: Path) -> None:
        self.node_id = node_id
        self.log = log
        self._log_file = log.open("w")
        arguments = ["--federation", str(federation), "--node-id", node_id]
        arguments += ["--index", str(index), "--size", str(size)]
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks._session_worker", *arguments],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log_file,
                text=True,
                cwd=_ROOT,
                env=_child_env(),
            )
        except BaseException:
            self._log_file.close()
            raise
        assert self.process.stdout is not None
        self._lines = _Lines(self.process.stdout)

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def receive(self, deadline: _Deadline) -> dict[str, Any]:
        waiting_for = f"node {self.node_id}"
        while True:
            try:
                line = self._lines.get(timeout=min(1.0, deadline.remaining(waiting_for)))
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"node process {self.node_id} exited with status "
                        f"{self.process.returncode}: {self._tail()}"
                    ) from None
                continue
            answer: dict[str, Any] = json.loads(line)
            if "error" in answer:
                raise RuntimeError(f"{answer['error']} ({self._tail()})")
            return answer

    def _tail(self) -> str:
        self._log_file.flush()
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-5:]) or "no output on stderr"

    def stop(self) -> None:
        try:
            if self.process.poll() is None:
                with contextlib.suppress(OSError):
                    self.send({"cmd": "quit"})
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self._lines.close()
        finally:
            self._log_file.close()


class _Fleet:
    """K node processes driven in lock step."""

    def __init__(self, federation: Path, node_ids: Sequence[str], size: int, logs: Path) -> None:
        self.workers: list[_Worker] = []
        try:
            for index, node_id in enumerate(node_ids):
                self.workers.append(
                    _Worker(federation, node_id, index, size, logs / f"node-{node_id}.log")
                )
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> _Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, deadline: _Deadline) -> None:
        for worker in self.workers:
            worker.receive(deadline)

    def broadcast(self, command: dict[str, Any], deadline: _Deadline) -> list[dict[str, Any]]:
        for worker in self.workers:
            worker.send(command)
        return [worker.receive(deadline) for worker in self.workers]

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


class _Coordinator:
    """A ``zerosum coordinator`` process with a fresh state file."""

    def __init__(self, federation: Path, state: Path, deadline: _Deadline) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zerosum.cli",
                "coordinator",
                "--federation",
                str(federation),
                "--state",
                str(state),
                "--listen",
                "127.0.0.1:0",
                "--linger",
                "10",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=_ROOT,
            env=_child_env(),
        )
        assert self.process.stderr is not None
        self._lines = _Lines(self.process.stderr)
        self.seen: list[str] = []
        try:
            self.port = int(self._wait_for(_LISTENING, deadline).group(1))
        except BaseException:
            self.stop()
            raise

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _wait_for(self, pattern: re.Pattern[str], deadline: _Deadline) -> re.Match[str]:
        while True:
            try:
                line = self._lines.get(timeout=min(1.0, deadline.remaining("the coordinator")))
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"the coordinator exited with status {self.process.returncode}: "
                        + " | ".join(self.seen[-5:])
                    ) from None
                continue
            self.seen.append(line)
            if found := pattern.search(line):
                return found

    def peak_rss_mb(self) -> float:
        """The process's peak resident set size so far (VmHWM), in MiB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        found = re.search(r"^VmHWM:\s+(\d+)\s+kB$", status, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"/proc/{self.process.pid}/status has no VmHWM line.")
        return int(found.group(1)) / 1024

    def finish(self, deadline: _Deadline) -> None:
        """Wait for the coordinator to end its completed session; fail if it does not."""
        try:
            code = self.process.wait(timeout=deadline.remaining("the coordinator to exit"))
        except subprocess.TimeoutExpired:
            raise TimeoutError("the coordinator did not exit after its session ended.") from None
        if code != 0:
            raise RuntimeError(f"the coordinator exited with status {code}.")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._lines.close()


@contextlib.contextmanager
def _coordinator(federation: Path, state: Path, deadline: _Deadline) -> Iterator[_Coordinator]:
    coordinator = _Coordinator(federation, state, deadline)
    try:
        yield coordinator
    finally:
        coordinator.stop()


def _make_federation(folder: Path, node_ids: Sequence[str], size: int = 0) -> Path:
    """``zerosum federation init`` for ``node_ids`` with deadlines far beyond any round.

    The plan's rounds keep their names but carry one tensor of the benchmark's
    ``size`` values (the coordinator takes every round's layout from the config).
    """
    from zerosum.cli import main as zerosum_main

    arguments = [
        "federation",
        "init",
        "--nodes",
        ",".join(node_ids),
        "--out",
        str(folder),
        "--coordinator",
        "127.0.0.1:50051",
        "--join-deadline",
        str(MEASUREMENT_SECONDS),
        "--round-deadline",
        str(MEASUREMENT_SECONDS),
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        code = zerosum_main(arguments)
    if code != 0:
        raise RuntimeError(f"zerosum federation init failed with status {code}.")
    path = folder / "federation.toml"
    made = load_federation(path)
    layout = Layout.of({TENSOR: (size or VALUES_PER_NODE,)})
    rounds = tuple(RoundSpec(spec.name, layout) for spec in made.plan.rounds)
    config = dataclasses.replace(made, plan=dataclasses.replace(made.plan, rounds=rounds))
    path.write_text(dump_federation(config), encoding="utf-8")
    return path


def _plan(federation: Path) -> tuple[str, ...]:
    config = load_federation(federation)
    return SessionConfig.from_federation(config, config_hash(config)).plan()


def _expected_sha256(federation: Path, n_nodes: int, size: int) -> str:
    codec = FixedPointCodec(load_federation(federation).fixed_point_bits)
    total = wrapping_sum(codec.encode(node_values(i, size)) for i in range(n_nodes))
    return hashlib.sha256(total.tobytes()).hexdigest()


def _node_ids(count: int) -> list[str]:
    return [f"tre{i:02d}" for i in range(count)]


def _timed_round(
    fleet: _Fleet,
    command: dict[str, Any],
    expected_sha256: str,
    deadline: _Deadline,
    before: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """(seconds until every node held the aggregate, seconds until every node had masked)."""
    if before is not None:
        before()
    start = time.monotonic()
    answers = fleet.broadcast(command, deadline)
    wrong = [
        worker.node_id
        for worker, answer in zip(fleet.workers, answers, strict=True)
        if answer["sha256"] != expected_sha256
    ]
    if wrong:
        raise RuntimeError(
            f"{command['transport']} round {command['round_index']}: the aggregate received by "
            f"{', '.join(wrong)} is not the sum of the nodes' values."
        )
    return (
        max(a["done"] for a in answers) - start,
        max(a["masked"] for a in answers) - start,
    )


def _prepare(fleet: _Fleet, round_index: int, tensor: str, deadline: _Deadline) -> float:
    """Every node draws its mask for (round, tensor) ahead; seconds until the last is done."""
    start = time.monotonic()
    answers = fleet.broadcast(
        {"cmd": "prepare", "round_index": round_index, "tensor": tensor}, deadline
    )
    return float(max(a["drawn"] for a in answers)) - start


def _session_kinds(session: int) -> tuple[str, str]:
    """The mask mode of round 0 and round 1 of a session (see the module docstring)."""
    return ("ahead", "in_round" if session % 2 else "none")


def _round_session(
    fleet: _Fleet,
    server: PlainSumServer,
    *,
    federation: Path,
    plan: tuple[str, ...],
    expected: str,
    state: Path,
    session: int,
) -> dict[str, float]:
    """One session: two rounds (see :func:`_session_kinds`), each with its bare-gRPC twin."""
    deadline = _Deadline(MEASUREMENT_SECONDS, f"session {session} of the round benchmark")

    def reset() -> None:
        server.reset(ROUND_NODES, VALUES_PER_NODE)

    figures: dict[str, float] = {}
    with _coordinator(federation, state, deadline) as coordinator:
        fleet.broadcast({"cmd": "join", "address": coordinator.address}, deadline)
        for round_index, (round_name, kind) in enumerate(
            zip(plan[:2], _session_kinds(session), strict=True)
        ):
            ours = {
                "cmd": "round",
                "transport": "session",
                "round_index": round_index,
                "round_name": round_name,
                "mask": kind,
            }
            # Alternate which of the pair goes first, so neither always meets
            # the warmer (or the busier) machine.
            order = ("session", "plain")
            if (session // 2 + round_index) % 2:
                order = ("plain", "session")
            for transport in order:
                command = {**ours, "transport": transport}
                if transport == "session":
                    if kind == "ahead":
                        figures["draw"] = _prepare(fleet, round_index, TENSOR, deadline)
                    figures[kind], figures["masking_" + kind] = _timed_round(
                        fleet, command, expected, deadline
                    )
                else:
                    if kind == "ahead":
                        _prepare(fleet, round_index, PLAIN_TENSOR, deadline)
                    figures["plain_" + kind], _ = _timed_round(
                        fleet, command, expected, deadline, reset
                    )
        if len(plan) == 2:
            coordinator.finish(deadline)
    return figures


def _round_figures(work: Path, repeats: int) -> dict[str, float]:
    node_ids = _node_ids(ROUND_NODES)
    federation = _make_federation(work / "k10", node_ids)
    plan = _plan(federation)
    if len(plan) < 2:
        raise RuntimeError(f"the round plan {plan} has fewer than the two rounds needed here.")
    expected = _expected_sha256(federation, ROUND_NODES, VALUES_PER_NODE)
    tls = federation.parent / "coordinator"
    samples: dict[str, list[float]] = {}
    with contextlib.ExitStack() as running:
        server = PlainSumServer(
            certificate=(tls / "server.pem").read_bytes(),
            private_key=(tls / "server.key").read_bytes(),
            ca_certificate=load_federation(federation).ca_certificate_path.read_bytes(),
            max_workers=2 * ROUND_NODES + 4,
            wait_seconds=MEASUREMENT_SECONDS,
        )
        running.callback(server.stop)
        fleet = running.enter_context(
            _Fleet(federation, node_ids, VALUES_PER_NODE, federation.parent)
        )
        setup = _Deadline(MEASUREMENT_SECONDS, "starting the node processes")
        fleet.wait_ready(setup)
        fleet.broadcast({"cmd": "plain", "address": server.address}, setup)
        # Session 0 warms up; then 2·repeats sessions, so that each of the
        # alternating second rounds ("in_round", "none") gets ``repeats`` samples.
        for session in range(2 * repeats + 1):
            state = work / f"state-k10-{session}.sqlite"
            figures = _round_session(
                fleet,
                server,
                federation=federation,
                plan=plan,
                expected=expected,
                state=state,
                session=session,
            )
            if session == 0:
                continue  # warm-up
            for kind in MASK_MODES:
                if kind in figures:
                    figures["ratio_" + kind] = figures[kind] / figures["plain_" + kind]
            for key, value in figures.items():
                samples.setdefault(key, []).append(value)
    median = {key: statistics.median(values) for key, values in samples.items()}
    return {
        "round_seconds_k10_d1e6": median["ahead"],
        "round_seconds_k10_d1e6_masks_in_round": median["in_round"],
        "round_seconds_k10_d1e6_upload_only": median["none"],
        "mask_draw_seconds_k10_d1e6": median["draw"],
        "round_masking_seconds_k10_d1e6": median["masking_in_round"],
        "round_ratio_vs_flower_secagg_reference": median["ahead"] / FLOWER_SECAGG_REFERENCE_SECONDS,
        "round_ratio_vs_flower_secagg_reference_masks_in_round": median["in_round"]
        / FLOWER_SECAGG_REFERENCE_SECONDS,
        "round_ratio_vs_plain_grpc": median["ratio_ahead"],
        "round_ratio_vs_plain_grpc_masks_in_round": median["ratio_in_round"],
        "round_ratio_vs_plain_grpc_upload_only": median["ratio_none"],
        "plain_grpc_round_seconds_k10_d1e6": median["plain_ahead"],
        "plain_grpc_round_seconds_k10_d1e6_masks_in_round": median["plain_in_round"],
        "plain_grpc_round_seconds_k10_d1e6_upload_only": median["plain_none"],
    }


def _peak_rss_mb(work: Path, n_nodes: int, repeats: int) -> float:
    node_ids = _node_ids(n_nodes)
    federation = _make_federation(work / f"k{n_nodes}", node_ids)
    command = {
        "cmd": "round",
        "transport": "session",
        "round_index": 0,
        "round_name": _plan(federation)[0],
        "mask": "none",
    }
    expected = _expected_sha256(federation, n_nodes, VALUES_PER_NODE)
    peaks: list[float] = []
    with _Fleet(federation, node_ids, VALUES_PER_NODE, federation.parent) as fleet:
        fleet.wait_ready(_Deadline(MEASUREMENT_SECONDS, f"starting {n_nodes} node processes"))
        for session in range(repeats):
            deadline = _Deadline(MEASUREMENT_SECONDS, f"memory run {session} with K = {n_nodes}")
            state = work / f"state-k{n_nodes}-{session}.sqlite"
            with _coordinator(federation, state, deadline) as coordinator:
                fleet.broadcast({"cmd": "join", "address": coordinator.address}, deadline)
                _timed_round(fleet, command, expected, deadline)
                peaks.append(coordinator.peak_rss_mb())
    return statistics.median(peaks)


def run(repeats: int) -> dict[str, float]:
    """Measure the figures of the module docstring; medians over ``repeats`` runs each."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1; got {repeats}.")
    if not Path("/proc/self/status").exists():
        raise RuntimeError("the session benchmark reads /proc/<pid>/status and needs Linux.")
    with tempfile.TemporaryDirectory(prefix="zerosum-session-bench-") as folder:
        work = Path(folder)
        figures = _round_figures(work, repeats)
        small, large = (_peak_rss_mb(work, k, repeats) for k in MEMORY_NODES)
    figures["coordinator_peak_rss_mb_k5_d1e6"] = small
    figures["coordinator_peak_rss_mb_k20_d1e6"] = large
    figures["coordinator_rss_ratio_k20_vs_k5"] = large / small
    return figures


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 5), indent=2))
