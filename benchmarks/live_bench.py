"""Many nodes, many rounds: a live session of K node processes against one coordinator process.

The pieces are those of benchmarks/session_bench.py: a federation made by
``zerosum federation init`` whose round plan is replaced by ``rounds`` rounds
of one tensor of d values each, a ``zerosum coordinator`` process with a
fresh state file, and K node processes (benchmarks/_session_worker.py), each
a :class:`~node.protocol.client.CoordinatorClient` with its own TLS channel, identity
key and ephemeral key. Every round every node uploads its fixed-point values
under its uniform self-mask (no pairwise mask: that is CPU in the nodes, not
load on the coordinator), takes part in the unmask step, downloads the
aggregate and checks its statements and tags; the parent checks that every
node's aggregate is Σ_k q(x_k) bit for bit (an error otherwise).

After each round the coordinator's resident set size (VmRSS of
/proc/<pid>/status) is read. :func:`live_session` returns the round times, the
RSS samples and their least-squares slope in MiB per round, over all rounds
and after the first :data:`WARMUP_ROUNDS` (while the allocator's pools fill).

``make bench`` runs one session of K = 100 nodes × 2 rounds of d = 10^4
(``live_round_seconds_k100_d1e4``: the median round, from the start line to
the last node holding its checked aggregate; ``live_start_seconds_k100``:
starting the 100 processes; ``live_join_seconds_k100``: all of them joined
and verified the roster; ``live_coordinator_peak_rss_mb_k100_d1e4``;
``live_round_until_<phase>_seconds_k100_d1e4``: when the last node reached
each phase of the round, as in benchmarks/session_bench.py). The
load test of tests/campaign/ runs K = 50 × 20 rounds of d = 10^5.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks._processes import Deadline, Fleet, coordinator_process
from benchmarks.session_bench import (
    PHASES,
    _expected_sha256,
    _make_federation,
    _node_ids,
    _timed_round,
)

__all__ = ["LiveRun", "live_federation", "live_session", "run"]

TENSOR = "values"
BENCH_NODES = 100
BENCH_VALUES = 10**4
BENCH_ROUNDS = 2
# Starting 100 node processes on two cores takes minutes, not seconds.
SESSION_SECONDS = 1800.0
ROUND_DEADLINE_SECONDS = 600.0
# The allocator's pools fill over the first rounds; the slope after them is the trend.
WARMUP_ROUNDS = 5


def live_federation(folder: Path, node_ids: list[str], size: int, rounds: int) -> Path:
    """``zerosum federation init`` for ``node_ids``, its plan replaced by ``rounds`` rounds."""
    return _make_federation(
        folder,
        node_ids,
        size,
        round_names=[f"round{i:02d}" for i in range(rounds)],
        deadline_seconds=ROUND_DEADLINE_SECONDS,
    )


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+)\s+kB$", status, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"/proc/{pid}/status has no VmRSS line.")
    return int(found.group(1)) / 1024


@dataclass
class LiveRun:
    """What one live session measured."""

    nodes: int
    values: int
    start_seconds: float = 0.0
    join_seconds: float = 0.0
    round_seconds: list[float] = field(default_factory=list)
    # Per round: seconds until the last node reached each phase (session_bench.PHASES).
    phases: list[dict[str, float]] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    errors: list[str] = field(default_factory=list)

    def rss_slope_mb_per_round(self, skip: int = 0) -> float:
        """Least-squares slope of the RSS samples against the round index, from round ``skip``."""
        samples = np.asarray(self.rss_mb[skip:])
        if samples.size < 2:
            return 0.0
        return float(np.polyfit(np.arange(samples.size), samples, 1)[0])

    def phase_medians(self) -> dict[str, float]:
        """Median over the rounds of the time until the last node reached each phase."""
        names = [p for p in PHASES if self.phases and all(p in r for r in self.phases)]
        return {p: round(statistics.median(r[p] for r in self.phases), 3) for p in names}

    def summary(self) -> dict[str, object]:
        rounds = np.asarray(self.round_seconds)
        return {
            "nodes": self.nodes,
            "values_per_node": self.values,
            "rounds": len(self.round_seconds),
            "errors": len(self.errors),
            "start_seconds": round(self.start_seconds, 2),
            "join_seconds": round(self.join_seconds, 2),
            "round_seconds": [round(s, 3) for s in self.round_seconds],
            "round_p50_seconds": round(float(np.percentile(rounds, 50)), 3),
            "round_p95_seconds": round(float(np.percentile(rounds, 95)), 3),
            "round_until_phase_median_seconds": self.phase_medians(),
            "coordinator_rss_mb": [round(m, 1) for m in self.rss_mb],
            "coordinator_rss_slope_mb_per_round": round(self.rss_slope_mb_per_round(), 3),
            "coordinator_rss_slope_mb_per_round_after_warmup": round(
                self.rss_slope_mb_per_round(WARMUP_ROUNDS), 3
            ),
            "warmup_rounds": WARMUP_ROUNDS,
            "coordinator_peak_rss_mb": round(self.peak_rss_mb, 1),
        }


def live_session(work: Path, nodes: int, values: int, rounds: int) -> LiveRun:
    """One session of ``nodes`` node processes × ``rounds`` rounds of ``values`` values."""
    node_ids = _node_ids(nodes) if nodes <= 100 else [f"tre{i:03d}" for i in range(nodes)]
    federation = live_federation(work / f"k{nodes}", node_ids, values, rounds)
    expected = _expected_sha256(federation, nodes, values)
    run = LiveRun(nodes, values)
    deadline = Deadline(SESSION_SECONDS, f"a live session of {nodes} nodes")
    started = time.monotonic()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    with Fleet(federation, node_ids, values, work / "logs") as fleet:
        fleet.wait_ready(deadline)
        run.start_seconds = time.monotonic() - started
        with coordinator_process(federation, work / "state.sqlite", deadline) as coordinator:
            joining = time.monotonic()
            fleet.broadcast({"cmd": "join", "address": coordinator.address}, deadline)
            run.join_seconds = time.monotonic() - joining
            for round_index in range(rounds):
                command = {
                    "cmd": "round",
                    "transport": "session",
                    "round_index": round_index,
                    "round_name": f"round{round_index:02d}",
                    "mask": "none",
                }
                try:
                    seconds, _, phases = _timed_round(fleet, command, expected, deadline)
                except RuntimeError as error:
                    run.errors.append(str(error))
                    break
                run.round_seconds.append(seconds)
                run.phases.append(phases)
                run.rss_mb.append(_rss_mb(coordinator.process.pid))
            run.peak_rss_mb = coordinator.peak_rss_mb()
            if not run.errors:
                coordinator.finish(deadline)
    return run


def run(repeats: int) -> dict[str, float]:
    """The K = 100 live session of the module docstring (one session; ``repeats`` is unused).

    A session of 100 processes takes minutes on a small machine; its rounds
    are the samples.
    """
    del repeats
    with tempfile.TemporaryDirectory(prefix="zerosum-live-bench-") as folder:
        measured = live_session(Path(folder), BENCH_NODES, BENCH_VALUES, BENCH_ROUNDS)
    if measured.errors:
        raise RuntimeError("; ".join(measured.errors))
    figures = {
        f"live_round_until_{phase}_seconds_k100_d1e4": seconds
        for phase, seconds in measured.phase_medians().items()
    }
    return figures | {
        "live_round_seconds_k100_d1e4": statistics.median(measured.round_seconds),
        "live_start_seconds_k100": measured.start_seconds,
        "live_join_seconds_k100": measured.join_seconds,
        "live_coordinator_peak_rss_mb_k100_d1e4": measured.peak_rss_mb,
    }
