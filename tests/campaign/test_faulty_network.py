"""Real sessions through the faulty proxy: finished exactly, or ended with a reason on every node.

A coordinator process and three node processes (``zerosum coordinator`` and
``zerosum node``) run a two-round session; the nodes reach the coordinator
only through :class:`~tests.campaign.proxy.FaultyProxy`, whose seeded
schedule delays, black-holes, truncates and resets their first connections
(:data:`SCHEDULES`).
Whatever the schedule, the session must

* finish exactly: every process exits 0, every node's model is the pooled
  fit, and each published aggregate is the sum of the nodes' audit payloads;
* or end with a stated reason: every process that fails says why in a
  sentence (no traceback), and any aggregate the coordinator did publish is
  still the exact sum over its survivors;

and never outlive its deadlines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.campaign.proxy import FaultSchedule, FaultyProxy
from tests.support.federations import three_cohort_federation
from tests.support.processes import Federation, Processes, Spawned, Turns, outcome, run_concurrently
from tests.support.sessions import SessionRun, reference_model, relative_difference

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = ("a", "b", "c")
# seed -> (rate, faulty connections): four sessions in weather, two in a storm
# where every connection a node opens for a long while is faulty.
SCHEDULES = {
    101: (0.6, 12),
    202: (0.6, 12),
    303: (0.6, 12),
    404: (0.6, 12),
    505: (1.0, 40),
    606: (1.0, 40),
}
SEEDS = tuple(SCHEDULES)
DEADLINE = 45.0
# Join and two rounds, each at most DEADLINE, plus restarts of the retries.
SESSION_BOUND = 5 * DEADLINE


@dataclass
class ProxiedRun(SessionRun):
    """A session whose nodes dial the proxy instead of the coordinator."""

    proxy_address: str = ""

    def node_dials(self) -> str:
        return self.proxy_address


@dataclass
class Weathered:
    run: ProxiedRun
    codes: dict[str, int]
    faults: dict[str, int]


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    return three_cohort_federation(
        tmp_path_factory.mktemp("weather") / "federation", NODES, DEADLINE
    )


def _session(
    federation: Federation, folder: Path, processes: Processes, turns: Turns, seed: int
) -> Weathered:
    run = ProxiedRun(federation, folder, processes)
    with turns.turn(str(seed)):
        run.start_coordinator()
        rate, faulty = SCHEDULES[seed]
        proxy = FaultyProxy(run.port, FaultSchedule(seed, rate=rate, faulty_connections=faulty))
        run.proxy_address = proxy.address
        try:
            for node in NODES:
                run.start_node(node)
        except BaseException:
            proxy.close()
            raise
    try:
        codes = run.wait_all(SESSION_BOUND)
    finally:
        proxy.close()
    return Weathered(run, codes, proxy.faults())


@pytest.fixture(scope="module")
def sessions(
    federation: Federation, module_processes: Processes, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Weathered | BaseException]:
    root = tmp_path_factory.mktemp("weather-runs")
    turns = Turns([str(s) for s in SEEDS])

    def job(seed: int) -> Callable[[], Weathered]:
        return lambda: _session(federation, root / str(seed), module_processes, turns, seed)

    return run_concurrently({str(seed): job(seed) for seed in SEEDS})


def _stated_reason(spawned: Spawned) -> str:
    lines = [line for line in spawned.stderr().splitlines() if line.strip()]
    assert "Traceback" not in spawned.stderr(), spawned.describe()
    assert lines, f"{spawned.name} failed without a word"
    return lines[-1]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_session_through_a_faulty_network_is_exact_or_says_why(
    seed: int, federation: Federation, sessions: dict[str, Weathered | BaseException]
) -> None:
    done = outcome(sessions, str(seed))
    run = done.run
    print(f"seed {seed}: faults {done.faults}, exit codes {done.codes}")
    assert sum(n for kind, n in done.faults.items() if kind != "pass") > 0, done.faults
    for round_index in (0, 1):
        published = run.state.result(round_index)
        if published is not None:
            survivors, aggregate = published
            assert np.array_equal(aggregate, run.audit_sum(survivors, round_index))
    if all(code == 0 for code in done.codes.values()):
        pooled = reference_model(federation, NODES, NODES)
        for node in NODES:
            diff = relative_difference(run.model(node), pooled, federation.holdout())
            assert diff <= 1e-9
        return
    for name, code in done.codes.items():
        if code != 0:
            spawned = run.coordinator if name == "coordinator" else run.nodes[name]
            reason = _stated_reason(spawned)
            print(f"  {name} exited {code}: {reason}")
