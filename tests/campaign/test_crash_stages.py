"""kill -9 of the coordinator at the stages tests/integration/test_coordinator_crash.py leaves out.

That module kills the coordinator once every node joined, after the first
upload, once round 0 is aggregated and with round 1 half uploaded. Here:

* ``join-partial``: one node of three joined, the roster still open;
* ``attesting``: round 0's uploads all in and two of three survivors' signed
  survivor sets recorded (node ``c``, the first to upload, is stopped with
  SIGSTOP right after its upload, so it cannot attest);
* ``answering``: every survivor attested, two of three unmask answers in (the
  first node to attest is stopped right after its attestation);
* ``downloading``: round 0 published and fetched by two nodes, not by the
  third (the first node to answer is stopped right after its answer).

Each time the coordinator is SIGKILLed at that moment and started again with
the same arguments, the stopped node is continued (SIGCONT), the rest is
approved, and every node's model.json must be the very same bytes as from an
uninterrupted session on the same data, every published aggregate the sum of
the nodes' audit payloads. Last, a CAPE session whose coordinator is killed
in its secure-sum and model rounds.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.federations import CAPE_EXTRA, three_cohort_federation
from tests.support.processes import (
    Federation,
    Processes,
    Turns,
    outcome,
    run_concurrently,
    wait_until,
)
from tests.support.sessions import SessionRun

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = ("a", "b", "c")
MOMENTS = ("join-partial", "attesting", "answering", "downloading")
# Catching a moment that lasts a node's poll interval (0.2 s) needs quick looks.
QUICK = 0.002


@dataclass
class Finished:
    run: SessionRun
    codes: dict[str, int]
    at_kill: dict[str, Any] | None = None


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    return three_cohort_federation(tmp_path_factory.mktemp("stages") / "federation", NODES, 90)


def _rows(run: SessionRun, table: str, round_index: int) -> set[str]:
    found = run.state.query(f"SELECT node_id FROM {table} WHERE round_index = ?", (round_index,))
    return {r[0] for r in found}


def _first(run: SessionRun, table: str, round_index: int, timeout: float = 90.0) -> str:
    """The first node with a row in ``table`` for the round, looked for every 2 ms."""
    give_up = time.monotonic() + timeout
    while not (found := _rows(run, table, round_index)):
        assert time.monotonic() < give_up, f"no {table} row for round {round_index}"
        time.sleep(QUICK)
    return sorted(found)[0]


def _stop(run: SessionRun, node: str) -> None:
    # The process id is ours: a node this test started.
    os.kill(run.nodes[node].pid, signal.SIGSTOP)


def _continue(run: SessionRun, node: str) -> None:
    os.kill(run.nodes[node].pid, signal.SIGCONT)


def _snapshot(run: SessionRun) -> dict[str, Any]:
    session = run.state.session()
    return {
        "session": session,
        "joined": set(run.state.members()),
        "status": run.state.round_status(0),
        "uploads": run.state.uploads(0),
        "attested": _rows(run, "unmask_acks", 0),
        "answered": _rows(run, "unmask_corrections", 0),
        "delivered": _rows(run, "deliveries", 0),
    }


def _freeze_at(run: SessionRun, moment: str) -> str:
    """Bring round 0 to ``moment`` and stop the node that is to be frozen there; its id."""
    frozen: str
    wait_until(run.state.roster_final, what="every node to join", alive=run.everyone())
    run.approve("c", 0)
    wait_until(lambda: run.state.uploads(0), what="c's upload", alive=run.everyone())
    if moment == "attesting":
        frozen = "c"
        _stop(run, frozen)
    run.approve("a", 0)
    run.approve("b", 0)
    if moment == "attesting":
        wait_until(
            lambda: _rows(run, "unmask_acks", 0) == {"a", "b"},
            what="a and b to attest",
            alive=[run.coordinator],
        )
    elif moment == "answering":
        frozen = _first(run, "unmask_acks", 0)
        _stop(run, frozen)
        others = set(NODES) - {frozen}
        wait_until(
            lambda: _rows(run, "unmask_corrections", 0) == others,
            what="the other two unmask answers",
            alive=[run.coordinator],
        )
    else:
        frozen = _first(run, "unmask_corrections", 0)
        _stop(run, frozen)
        others = set(NODES) - {frozen}
        wait_until(
            lambda: _rows(run, "deliveries", 0) >= others,
            what="the other two downloads",
            alive=[run.coordinator],
        )
    return frozen


def _session(
    federation: Federation, folder: Path, processes: Processes, turns: Turns, moment: str | None
) -> Finished:
    run = SessionRun(federation, folder, processes)
    with turns.turn(moment or "uninterrupted"):
        run.start_coordinator()
        if moment is None:
            for node in NODES:
                run.start_node(node)
            return Finished(run, run.wait_all())
        for node in NODES:
            run.start_node(node, approve="manual")
            if moment == "join-partial" and node == "a":
                wait_until(run.state.members, what="a to join", alive=run.everyone())
                break
    frozen = None if moment == "join-partial" else _freeze_at(run, moment)
    assert run.coordinator.kill() == -9
    at_kill = {**_snapshot(run), "frozen": frozen}
    run.start_coordinator()
    if frozen is not None:
        _continue(run, frozen)
    if moment == "join-partial":
        for node in ("b", "c"):
            run.start_node(node, approve="manual")
        for node in NODES:
            run.approve(node, 0)
    for node in NODES:
        run.approve(node, 1)
    return Finished(run, run.wait_all(), at_kill)


@pytest.fixture(scope="module")
def sessions(
    federation: Federation, module_processes: Processes, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Finished | BaseException]:
    root = tmp_path_factory.mktemp("stage-runs")
    turns = Turns(("uninterrupted", *MOMENTS))

    def job(moment: str | None) -> Callable[[], Finished]:
        name = moment or "uninterrupted"
        return lambda: _session(federation, root / name, module_processes, turns, moment)

    jobs = {"uninterrupted": job(None)}
    jobs.update({m: job(m) for m in MOMENTS})
    return run_concurrently(jobs)


@pytest.mark.parametrize("moment", MOMENTS)
def test_coordinator_killed_at_the_stage_gives_the_identical_model(
    moment: str, sessions: dict[str, Finished | BaseException]
) -> None:
    reference = outcome(sessions, "uninterrupted")
    crashed = outcome(sessions, moment)
    run, at_kill = crashed.run, crashed.at_kill
    assert at_kill is not None
    frozen = at_kill["frozen"]
    # The kill came at the intended moment.
    if moment == "join-partial":
        assert at_kill["joined"] == {"a"} and not at_kill["session"]["roster_final"]
    elif moment == "attesting":
        assert at_kill["status"] == "unmask"
        assert at_kill["uploads"] == set(NODES)
        assert at_kill["attested"] == {"a", "b"} and not at_kill["answered"]
    elif moment == "answering":
        assert at_kill["status"] == "unmask"
        assert at_kill["attested"] == set(NODES)
        assert at_kill["answered"] == set(NODES) - {frozen}
    else:
        assert at_kill["status"] == "ready"
        assert frozen not in at_kill["delivered"]
        assert at_kill["delivered"] >= set(NODES) - {frozen}

    assert crashed.codes == dict.fromkeys(["coordinator", *NODES], 0), run.describe()
    assert f"resumed session {at_kill['session']['session_id']}" in run.coordinator.stderr()
    for node in NODES:
        model = (run.out(node) / "model.json").read_bytes()
        assert model == (reference.run.out(node) / "model.json").read_bytes()
    for round_index in (0, 1):
        published = run.state.result(round_index)
        assert published is not None
        assert published[0] == NODES
        assert np.array_equal(published[1], run.audit_sum(NODES, round_index))


def test_coordinator_killed_in_cape_rounds_resumes_the_session(
    tmp_path: Path, processes: Processes
) -> None:
    """A CAPE session (rounds 0 cape-sum/means, 1 means, 2 cape-sum/sums, 3 sums).

    The coordinator is SIGKILLed three times: once a's CAPE-sum share of round
    0 is recorded, with a at its round-1 approval gate, and with a at its
    round-3 gate (so after the secure sum of round 2); each time it is started
    again with the same arguments. Every node must end with the same model
    bytes, and the coordinator must hold exactly a's share and bundles.
    """
    federation = three_cohort_federation(tmp_path / "fed", NODES, 90, extra=CAPE_EXTRA)
    run = SessionRun(federation, tmp_path / "run", processes)
    run.start_coordinator()
    run.start_node("a", approve="manual")
    for node in NODES[1:]:
        run.start_node(node)
    wait_until(run.state.roster_final, what="every node to join", alive=run.everyone())
    wait_until(lambda: "a" in run.state.uploads(0), what="a's share", alive=run.everyone())
    kills = [run.coordinator.kill()]
    run.start_coordinator()
    for round_index in (1, 3):
        run.at_gate("a", round_index)
        assert run.state.round_status(round_index - 1) == "ready"
        kills.append(run.coordinator.kill())
        run.start_coordinator()
        run.approve("a", round_index)
    codes = run.wait_all()
    assert kills == [-9, -9, -9]
    assert codes == dict.fromkeys(["coordinator", *NODES], 0), run.describe()
    session_id = run.state.session()["session_id"]  # type: ignore[index]
    for coordinator in run.coordinators[1:]:
        assert f"resumed session {session_id}" in coordinator.stderr()
    model = (run.out("a") / "model.json").read_bytes()
    assert all((run.out(n) / "model.json").read_bytes() == model for n in NODES[1:])
    for round_index in (0, 1, 2, 3):
        published = run.state.result(round_index)
        assert published is not None and published[0] == NODES
