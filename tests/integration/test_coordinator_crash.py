"""kill -9 of the coordinator process at several moments; a restart finishes the same session.

Three node processes run with ``--approve manual``, so the test decides when
each egress may leave and can stop the session exactly at the moment it
wants: (a) every node joined, (b) the first upload of round 0 recorded,
(c) round 0 aggregated, (d) round 1 half uploaded. It reads the moment from
the coordinator's SQLite file, SIGKILLs the coordinator, restarts it with the
same arguments and approves the rest. The fixed-point aggregate is exact, so
every node's model.json must be the very same bytes as from an uninterrupted
session on the same data, although the session keys (and so every mask)
differ. The five sessions run side by side (their start-ups one after another).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.federations import three_cohort_federation
from tests.support.processes import (
    Federation,
    Processes,
    Turns,
    outcome,
    run_concurrently,
    wait_until,
)
from tests.support.sessions import SessionRun, reference_model, relative_difference

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")
MOMENTS = ("joined", "first-upload", "aggregated", "round-1-uploads")


@dataclass
class Finished:
    """A session that ran to its end; for a crash run, what the state showed at the kill."""

    run: SessionRun
    codes: dict[str, int]
    killed_status: int | None = None
    at_kill: dict[str, Any] | None = None


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    # Deadlines far longer than any restart: nothing may be dropped here.
    return three_cohort_federation(tmp_path_factory.mktemp("crash") / "federation", NODES, 60)


def _start(run: SessionRun, turns: Turns, approve: str) -> None:
    """Coordinator, then the nodes; returns once the roster is final."""
    with turns.turn(run.label):
        run.start_coordinator()
        for node in NODES:
            run.start_node(node, approve=approve)
        wait_until(run.state.roster_final, what="every node to join", alive=run.everyone())


def _uninterrupted(
    federation: Federation, folder: Path, processes: Processes, turns: Turns
) -> Finished:
    run = SessionRun(federation, folder, processes)
    _start(run, turns, "auto")
    return Finished(run, run.wait_all())


def _snapshot(run: SessionRun) -> dict[str, Any]:
    session = run.state.session()
    assert session is not None
    return {
        "session_id": session["session_id"],
        "roster_final": session["roster_final"],
        "uploads": {r: run.state.uploads(r) for r in (0, 1)},
        "status": {r: run.state.round_status(r) for r in (0, 1)},
    }


def _crash(
    federation: Federation, folder: Path, processes: Processes, turns: Turns, moment: str
) -> Finished:
    run = SessionRun(federation, folder, processes)
    _start(run, turns, "manual")
    alive = run.everyone
    # (node, round) approvals still to give after the restart.
    pending: list[tuple[str, int]]
    if moment == "joined":
        pending = [(n, r) for r in (0, 1) for n in NODES]
    elif moment == "first-upload":
        run.approve("a", 0)
        wait_until(lambda: run.state.uploads(0), what="a round-0 upload", alive=alive())
        pending = [("b", 0), ("c", 0), *((n, 1) for n in NODES)]
    elif moment == "aggregated":
        for node in NODES:
            run.approve(node, 0)
        wait_until(lambda: run.state.result(0), what="round 0's result", alive=alive())
        pending = [(n, 1) for n in NODES]
    else:
        for node in NODES:
            run.approve(node, 0)
        run.approve("a", 1)
        run.approve("b", 1)
        wait_until(lambda: run.state.uploads(1), what="a round-1 upload", alive=alive())
        pending = [("c", 1)]
    killed_status = run.coordinator.kill()
    at_kill = _snapshot(run)
    run.start_coordinator()
    for node, round_index in pending:
        run.approve(node, round_index)
    return Finished(run, run.wait_all(), killed_status, at_kill)


@pytest.fixture(scope="module")
def sessions(
    federation: Federation,
    module_processes: Processes,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Finished | BaseException]:
    root = tmp_path_factory.mktemp("crash-runs")
    turns = Turns(("uninterrupted", *MOMENTS))

    def crash(moment: str) -> Callable[[], Finished]:
        return lambda: _crash(federation, root / moment, module_processes, turns, moment)

    def uninterrupted() -> Finished:
        return _uninterrupted(federation, root / "uninterrupted", module_processes, turns)

    jobs: dict[str, Callable[[], Finished]] = {"uninterrupted": uninterrupted}
    jobs.update({moment: crash(moment) for moment in MOMENTS})
    return run_concurrently(jobs)


def test_uninterrupted_session_is_the_exact_pooled_fit(
    federation: Federation, sessions: dict[str, Finished | BaseException]
) -> None:
    done = outcome(sessions, "uninterrupted")
    assert done.codes == dict.fromkeys(["coordinator", *NODES], 0), done.run.describe()
    pooled = reference_model(federation, NODES, NODES)
    for node in NODES:
        diff = relative_difference(done.run.model(node), pooled, federation.holdout())
        assert diff <= 1e-9
    for round_index in (0, 1):
        published = done.run.state.result(round_index)
        assert published is not None
        survivors, aggregate = published
        assert survivors == NODES
        assert np.array_equal(aggregate, done.run.audit_sum(NODES, round_index))


@pytest.mark.parametrize("moment", MOMENTS)
def test_coordinator_killed_and_restarted_gives_the_identical_model(
    moment: str, sessions: dict[str, Finished | BaseException]
) -> None:
    crashed = outcome(sessions, moment)
    reference = outcome(sessions, "uninterrupted")
    run, at_kill = crashed.run, crashed.at_kill
    assert crashed.killed_status == -9
    assert at_kill is not None

    # The kill came at the intended moment.
    assert at_kill["roster_final"]
    if moment == "joined":
        assert at_kill["uploads"] == {0: set(), 1: set()}
    elif moment == "first-upload":
        assert at_kill["uploads"][0] == {"a"}
        assert at_kill["status"][0] == "open"
    elif moment == "aggregated":
        assert at_kill["status"][0] == "ready"
        assert at_kill["uploads"][1] == set()
    else:
        assert at_kill["status"][0] == "ready"
        assert at_kill["status"][1] == "open"
        assert at_kill["uploads"][1] and at_kill["uploads"][1] <= {"a", "b"}

    assert crashed.codes == dict.fromkeys(["coordinator", *NODES], 0), run.describe()
    session_id = at_kill["session_id"]
    assert f"resumed session {session_id}" in run.coordinator.stderr()
    for node in NODES:
        entries = run.ledger(node)["entries"]
        assert {e["session_id"] for e in entries} == {session_id}
        assert [e["kind"] for e in entries] == ["release", "release"]
        model = (run.out(node) / "model.json").read_bytes()
        assert model == (reference.run.out(node) / "model.json").read_bytes()
    for round_index in (0, 1):
        published = run.state.result(round_index)
        expected = reference.run.state.result(round_index)
        assert published is not None and expected is not None
        assert published[0] == NODES
        assert np.array_equal(published[1], expected[1])
        assert np.array_equal(published[1], run.audit_sum(NODES, round_index))
