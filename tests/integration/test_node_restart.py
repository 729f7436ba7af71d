"""kill -9 of a node process at several moments; the same command again finishes the session.

A real coordinator process and three node processes run each session. Node
``a`` is the victim; the test SIGKILLs it at a moment it reads from the
coordinator's SQLite file or from the node's own output, then starts it again
with exactly the same command line:

(a) ``joined``: after ``a`` joined, before the roster is final (``b`` and ``c``
    start only after the restart);
(b) ``at-gate``: ``a`` runs with ``--approve manual`` and is killed at its
    round-0 approval gate, then again at its round-1 gate after round 0 was
    aggregated (the second restart catches up on round 0 from its published
    result and finds its round-1 bundle still waiting for the reviewer);
(c) ``uploaded``: ``a`` approves automatically while ``b`` waits for manual
    approval; ``a`` is killed once its round-0 upload is recorded, and again
    once its round-1 upload is recorded (round 0 aggregated in between);
(d) ``unmask`` (four nodes): ``c`` is killed for good at its round-1 gate and
    ``b`` is frozen (SIGSTOP) after its round-1 upload; at the round deadline
    the coordinator asks ``a``, ``b`` and ``d`` to unmask ``c``; ``a`` attests
    the survivor set and is killed; restarted, it attests again, ``b`` is
    thawed, and all three send their pair terms with ``c``.

Residual noise is off, so each published aggregate is exact: in (a)–(c) every
node's model.json must be the very same bytes in every scenario, the
restarted node's included, and equal the pooled fit; in (d) the fit over the
cohorts each round counted. A restart never recomputes what it wrote: the
victim's egress payloads keep their bytes and modification times, its ledger
holds exactly one release per round (the manifest that was approved) and one
unmask entry in (d), and its session key is gone once the session is over.
The sessions run side by side; only their start-ups are serialised.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from node.egress.bundle import EgressBundle
from tests.support.processes import (
    Federation,
    Processes,
    Spawned,
    Turns,
    init_federation,
    outcome,
    run_concurrently,
    wait_until,
)
from tests.support.sessions import SessionRun, reference_model, relative_difference

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")
# (d) runs four nodes: with T = 1 a round needs T + 2 = 3 survivors (min_nodes),
# so that revealing pair terms with c leaves every observer class some noise.
UNMASK_NODES = ("a", "b", "c", "d")
SURVIVORS = ("a", "b", "d")
VICTIM = "a"
FULL = ("joined", "at-gate", "uploaded")  # every node takes part in both rounds
# The unmask scenario waits for a round deadline, so it starts first.
SCENARIOS = ("unmask", *FULL)
# In (a)–(c) nothing waits for a deadline; they only bound a failure and must
# outlast a node's restart on a loaded two-core machine.
DEADLINE = 30.0
# In (d) round 1 waits out its deadline for c; the unmask deadline (the same
# length) must outlast a's restart, with four node processes on the machine.
UNMASK_DEADLINE = 20.0


@dataclass
class Finished:
    """A scenario's session after every process ended."""

    run: SessionRun
    codes: dict[str, int]
    session_id: str
    restarts: list[Spawned] = field(default_factory=list)
    # Round -> (payload.npy bytes, its mtime in ns, manifest sha256) before a kill.
    written: dict[int, tuple[bytes, int, str]] = field(default_factory=dict)
    key_mode: int | None = None


def _egress_facts(run: SessionRun, round_index: int) -> tuple[bytes, int, str]:
    folder = run.egress(VICTIM, round_index)
    payload = folder / "payload.npy"
    return payload.read_bytes(), payload.stat().st_mtime_ns, EgressBundle.manifest_sha256(folder)


def _kill_and_restart(run: SessionRun, approve: str, restarts: list[Spawned]) -> Spawned:
    """SIGKILL the victim, start it again with the same command, wait until it rejoined."""
    assert run.nodes[VICTIM].kill() == -9
    spawned = run.start_node(VICTIM, approve=approve)
    restarts.append(spawned)
    wait_until(
        lambda: "joined session" in spawned.stderr(),
        what=f"the restarted {spawned.name} to rejoin",
        alive=[spawned, run.coordinator],
    )
    return spawned


def _finish(
    run: SessionRun,
    restarts: list[Spawned],
    written: dict[int, tuple[bytes, int, str]] | None = None,
    key_mode: int | None = None,
) -> Finished:
    codes = run.wait_all()
    found = run.state.session()
    assert found is not None
    return Finished(run, codes, str(found["session_id"]), restarts, written or {}, key_mode)


def _start(run: SessionRun, turns: Turns, approve: dict[str, str]) -> None:
    with turns.turn(run.label):
        run.start_coordinator()
        for node, mode in approve.items():
            run.start_node(node, approve=mode)
        wait_until(run.state.roster_final, what="every node to join", alive=run.everyone())


def _joined(run: SessionRun, turns: Turns) -> Finished:
    restarts: list[Spawned] = []
    with turns.turn(run.label):
        run.start_coordinator()
        run.start_node(VICTIM)
        wait_until(
            lambda: VICTIM in run.state.members(), what="node a to join", alive=run.everyone()
        )
        assert not run.state.roster_final()
        key_mode = stat.S_IMODE((run.out(VICTIM) / "session.key").stat().st_mode)
        _kill_and_restart(run, "auto", restarts)
        assert not run.state.roster_final()
        for node in NODES[1:]:
            run.start_node(node)
        wait_until(run.state.roster_final, what="every node to join", alive=run.everyone())
    return _finish(run, restarts, key_mode=key_mode)


def _at_gate(run: SessionRun, turns: Turns) -> Finished:
    restarts: list[Spawned] = []
    _start(run, turns, {"a": "manual", "b": "auto", "c": "auto"})
    written = {}
    for round_index in (0, 1):
        run.at_gate(VICTIM, round_index)
        written[round_index] = _egress_facts(run, round_index)
        _kill_and_restart(run, "manual", restarts)
        run.approve(VICTIM, round_index)
    return _finish(run, restarts, written=written)


def _has_uploaded(run: SessionRun, round_index: int) -> Callable[[], bool]:
    return lambda: VICTIM in run.state.uploads(round_index)


def _uploaded(run: SessionRun, turns: Turns) -> Finished:
    restarts: list[Spawned] = []
    _start(run, turns, {"a": "auto", "b": "manual", "c": "auto"})
    written = {}
    for round_index in (0, 1):
        wait_until(
            _has_uploaded(run, round_index),
            what=f"node a's round-{round_index} upload",
            alive=run.everyone(),
        )
        written[round_index] = _egress_facts(run, round_index)
        _kill_and_restart(run, "auto", restarts)
        run.approve("b", round_index)
    return _finish(run, restarts, written=written)


def _unmask(run: SessionRun, turns: Turns) -> Finished:
    restarts: list[Spawned] = []
    _start(run, turns, {"a": "auto", "b": "auto", "c": "manual", "d": "auto"})
    run.approve("c", 0)
    run.at_gate("c", 1)
    run.nodes["c"].kill()
    wait_until(
        lambda: set(SURVIVORS) <= run.state.uploads(1),
        what="the round-1 uploads of a, b and d",
        alive=[run.coordinator, *(run.nodes[n] for n in SURVIVORS)],
    )
    frozen = run.nodes["b"]
    frozen.freeze()
    try:
        attested = "round 1 ('sums'): attested survivors {a, b, d} (dropped {c})"
        wait_until(
            lambda: attested in run.nodes[VICTIM].stderr(),
            what="node a to attest the survivor set",
            timeout=UNMASK_DEADLINE * 3,
            alive=[run.coordinator, run.nodes[VICTIM]],
        )
        written = {1: _egress_facts(run, 1)}
        restarted = _kill_and_restart(run, "auto", restarts)
        wait_until(
            lambda: attested in restarted.stderr(),
            what="the restarted node a to attest again",
            alive=[run.coordinator, restarted],
        )
    finally:
        # The process is this test's child; SIGCONT lets it answer (or be killed at teardown).
        os.kill(frozen.pid, signal.SIGCONT)
    codes = {"coordinator": run.coordinator.wait(120)}
    for node in SURVIVORS:
        codes[node] = run.nodes[node].wait(30)
    codes["c"] = run.nodes["c"].kill()
    found = run.state.session()
    assert found is not None
    return Finished(run, codes, str(found["session_id"]), restarts, written)


STEPS: dict[str, Callable[[SessionRun, Turns], Finished]] = {
    "joined": _joined,
    "at-gate": _at_gate,
    "uploaded": _uploaded,
    "unmask": _unmask,
}


@pytest.fixture(scope="module")
def federations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Federation]:
    root = tmp_path_factory.mktemp("restart")

    def make(name: str, nodes: tuple[str, ...], deadline: float) -> Federation:
        return init_federation(
            root / name,
            nodes,
            cohort_sizes=(150, 120, 130, 140)[: len(nodes)],
            join_deadline=DEADLINE,
            round_deadline=deadline,
        )

    return {
        "full": make("full", NODES, DEADLINE),
        "unmask": make("unmask", UNMASK_NODES, UNMASK_DEADLINE),
    }


@pytest.fixture(scope="module")
def sessions(
    federations: dict[str, Federation],
    module_processes: Processes,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Finished | BaseException]:
    root = tmp_path_factory.mktemp("restart-runs")
    turns = Turns(SCENARIOS)

    def job(name: str) -> Callable[[], Finished]:
        federation = federations["unmask" if name == "unmask" else "full"]
        return lambda: STEPS[name](SessionRun(federation, root / name, module_processes), turns)

    return run_concurrently({name: job(name) for name in SCENARIOS})


def _model(out: Path) -> bytes:
    return (out / "model.json").read_bytes()


@pytest.mark.parametrize("scenario", FULL)
def test_a_restarted_node_finishes_the_session_with_the_same_model(
    federations: dict[str, Federation],
    scenario: str,
    sessions: dict[str, Finished | BaseException],
) -> None:
    done = outcome(sessions, scenario)
    run = done.run
    assert done.codes == dict.fromkeys(["coordinator", *NODES], 0), run.describe()
    for round_index in (0, 1):
        published = run.state.result(round_index)
        assert published is not None
        assert published[0] == NODES
    model = _model(run.out(VICTIM))
    assert all(_model(run.out(node)) == model for node in NODES[1:])
    federation = federations["full"]
    pooled = reference_model(federation, NODES, NODES)
    assert relative_difference(run.model(VICTIM), pooled, federation.holdout()) <= 1e-9
    # Bit for bit the model of the other scenarios: the aggregate is exact.
    for other in FULL:
        finished = sessions[other]
        if isinstance(finished, Finished):
            assert _model(finished.run.out(VICTIM)) == model


def test_a_node_restarted_during_unmask_answers_once_and_finishes_exactly(
    federations: dict[str, Federation], sessions: dict[str, Finished | BaseException]
) -> None:
    done = outcome(sessions, "unmask")
    run = done.run
    assert done.codes == {"coordinator": 0, "a": 0, "b": 0, "d": 0, "c": -9}, run.describe()
    published = run.state.result(1)
    assert published is not None
    assert published[0] == SURVIVORS
    assert [len(attempt[0]) for attempt in run.state.unmask_attempts(1)] == [3]
    assert _model(run.out("a")) == _model(run.out("b")) == _model(run.out("d"))
    federation = federations["unmask"]
    expected = reference_model(federation, UNMASK_NODES, SURVIVORS)
    assert relative_difference(run.model(VICTIM), expected, federation.holdout()) <= 1e-9
    unmask = [e for e in run.ledger(VICTIM)["entries"] if e["kind"] == "unmask"]
    assert [(e["round_index"], e["details"]["dropped"]) for e in unmask] == [(1, ["c"])]
    assert (
        "round 1 ('sums'): sent self-mask seed and pair terms with {c}" in done.restarts[0].stderr()
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_restart_releases_nothing_twice(
    scenario: str, sessions: dict[str, Finished | BaseException]
) -> None:
    done = outcome(sessions, scenario)
    run = done.run
    entries = [e for e in run.ledger(VICTIM)["entries"] if e["kind"] == "release"]
    assert [e["round_index"] for e in entries] == [0, 1]
    assert {e["session_id"] for e in run.ledger(VICTIM)["entries"]} == {done.session_id}
    for entry in entries:
        folder = run.egress(VICTIM, entry["round_index"])
        assert entry["details"]["manifest_sha256"] == EgressBundle.manifest_sha256(folder)
        EgressBundle.verify(folder)
    # What was written before a kill is what stands at the end, untouched.
    for round_index, facts in done.written.items():
        assert _egress_facts(run, round_index) == facts
    # The coordinator holds exactly the payload of the bundle on disk.
    for round_index in (0, 1):
        bundle = EgressBundle.read(run.egress(VICTIM, round_index))
        assert run.state.unmasked_sha256(round_index, VICTIM) == bundle.payload_sha256
    assert "conflicting" not in run.coordinator.stderr()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_restarted_node_says_what_it_resumed(
    scenario: str, sessions: dict[str, Finished | BaseException]
) -> None:
    done = outcome(sessions, scenario)
    session = done.session_id
    logs = [spawned.stderr() for spawned in done.restarts]
    assert logs and all(f"rejoined session {session} with the key saved in" in log for log in logs)
    resuming = f"resuming session {session}: "
    if scenario == "joined":
        assert resuming + "no round aggregated yet, round 0 ('means') not written yet" in logs[0]
    elif scenario == "at-gate":
        assert resuming + "no round aggregated yet, round 0 ('means') bundle found" in logs[0]
        assert resuming + "round 0 aggregated, round 1 ('sums') bundle found" in logs[1]
        assert all("(not yet released; not recomputed)" in log for log in logs)
    elif scenario == "uploaded":
        assert resuming + "no round aggregated yet, round 0 ('means') bundle found" in logs[0]
        assert resuming + "round 0 aggregated, round 1 ('sums') bundle found" in logs[1]
        assert all("(approved and recorded; not recomputed)" in log for log in logs)
        assert all("the coordinator already held these bytes" in log for log in logs)
    else:
        assert resuming + "round 0 aggregated, round 1 ('sums') bundle found" in logs[0]
    assert f"session {session} completed" in logs[-1]


def test_the_session_key_is_private_and_deleted_at_the_end(
    sessions: dict[str, Finished | BaseException],
) -> None:
    done = outcome(sessions, "joined")
    assert done.key_mode == 0o600
    for node in NODES:
        out = done.run.out(node)
        assert not (out / "session.key").exists()
        record = json.loads((out / "session.json").read_text())
        assert (record["session_id"], record["node_id"]) == (done.session_id, node)
        assert record["completed"]
    # The victim rejoined with the very key the coordinator accepted first.
    roster = dict(done.run.state.query("SELECT node_id, public_key FROM roster"))
    record = json.loads((done.run.out(VICTIM) / "session.json").read_text())
    assert bytes(roster[VICTIM]).hex() == record["public_key"]
