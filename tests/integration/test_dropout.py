"""Nodes drop out at every stage of a session; the survivors finish exactly or stop with a reason.

Each scenario runs a real coordinator and real node processes. A victim is a
node started with ``--approve manual``: it stops at its approval gate with
its egress bundle written, where the test SIGKILLs it (gone before upload),
or the test signs its approval first (gone after upload). Stages:

(a) before the roster: one node never starts; the join deadline passes;
(b) after the roster, before upload: killed at its round-0 gate; the
    survivors unmask it (attest the survivor set, send pair terms);
(c) after upload: round 0 includes it, killed at its round-1 gate;
(d) during unmask: five nodes; one is killed at its round-1 gate and a
    second victim uploads round 1 and is frozen (SIGSTOP) before it can sign
    the survivor set; the coordinator must drop it at the unmask deadline and,
    since a signed survivor set is never changed, rerun round 1 among the three
    left under the next round index (fresh keys and noise, a counted release),
    without any pair terms ever revealed;
(e) below the threshold: min_nodes = 3 of 3, one killed at its gate;
(f) a survivor refuses to unmask because revealing its pair terms with the
    dropped node would leave its own egress below its noise floor
    (collusion threshold 0, so no pair weight was sized for a lost partner).

Exactness is checked twice: each published aggregate equals, bit for bit,
the wrapping sum of the survivors' un-noised audit payloads, and every
survivor's model equals the model from plain sums over exactly the cohorts
each round aggregated (to 1e-9 relative). The scenarios run side by side;
only their start-up is serialised, so each one's join phase is short even on
a loaded machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from node.deltab.plan import run_in_process
from node.plans.deltab.plan import plan_settings
from tests.support.processes import (
    Federation,
    Processes,
    Turns,
    init_federation,
    outcome,
    run_concurrently,
    wait_until,
)
from tests.support.sessions import SessionRun, reference_model, relative_difference

pytestmark = pytest.mark.integration

FIVE = ("a", "b", "c", "d", "e")
FOUR = ("a", "b", "c", "d")
THREE = ("a", "b", "c")
# Joins close as soon as everyone joined, so the join deadline costs time only
# in scenario (a); it must cover a node's start-up on a loaded machine. Each
# round deadline that passes costs its full length.
JOIN_DEADLINE = 30.0
ROUND_DEADLINE = 12.0

# The longest scenarios start first (start-ups are serialised).
ORDER = (
    "during-unmask",
    "before-roster",
    "after-upload",
    "after-roster",
    "noise-floor",
    "below-threshold",
)


@dataclass
class Finished:
    """A scenario's session after every process ended: exit statuses by name."""

    run: SessionRun
    codes: dict[str, int]


@dataclass
class Scenario:
    """Where one scenario runs, and when it may start its processes."""

    name: str
    federation: Federation
    folder: Path
    processes: Processes
    turns: Turns

    def session(self) -> SessionRun:
        return SessionRun(self.federation, self.folder / self.name, self.processes)


def _federation(root: Path, name: str, nodes: tuple[str, ...], *extra: str) -> Federation:
    return init_federation(
        root / name,
        nodes,
        cohort_sizes=(150, 120, 130, 140, 125)[: len(nodes)],
        join_deadline=JOIN_DEADLINE,
        round_deadline=ROUND_DEADLINE,
        extra=extra,
    )


def _start(scenario: Scenario, approve: dict[str, str], joined: int) -> SessionRun:
    """Coordinator, then the nodes; returns once ``joined`` nodes have joined."""
    run = scenario.session()
    with scenario.turns.turn(scenario.name):
        run.start_coordinator()
        for node, mode in approve.items():
            run.start_node(node, approve=mode)
        wait_until(
            lambda: len(run.state.members()) == joined,
            what=f"{joined} nodes to join",
            alive=run.everyone(),
        )
    return run


def _finish(run: SessionRun, *, victims: tuple[str, ...] = (), expect: str) -> Finished:
    """Wait for the coordinator, check how the session ended, then for the other nodes.

    The coordinator leaves once every live node has learnt the outcome, so
    those nodes must exit promptly after it.
    """
    codes = {"coordinator": run.coordinator.wait(150)}
    session = run.state.session()
    assert session is not None
    if session["state"] != expect:
        raise AssertionError(
            f"the session ended {session['state']} ({session['reason'] or 'no reason'}), "
            f"not {expect}\n{run.describe()}"
        )
    for node, spawned in run.nodes.items():
        if node not in victims:
            codes[node] = spawned.wait(30)
    for victim in victims:
        codes[victim] = run.nodes[victim].kill()
    return Finished(run, codes)


def _before_roster(scenario: Scenario) -> Finished:
    run = _start(scenario, {"b": "auto", "c": "auto", "d": "auto"}, joined=3)
    return _finish(run, expect="completed")


def _after_roster(scenario: Scenario) -> Finished:
    run = _start(scenario, {"a": "manual", "b": "auto", "c": "auto", "d": "auto"}, joined=4)
    run.at_gate("a", 0)
    run.nodes["a"].kill()
    return _finish(run, victims=("a",), expect="completed")


def _after_upload(scenario: Scenario) -> Finished:
    run = _start(scenario, {"a": "manual", "b": "auto", "c": "auto", "d": "auto"}, joined=4)
    run.approve("a", 0)
    run.at_gate("a", 1)
    run.nodes["a"].kill()
    return _finish(run, victims=("a",), expect="completed")


def _during_unmask(scenario: Scenario) -> Finished:
    approve = {"a": "manual", "b": "manual", "c": "auto", "d": "auto", "e": "auto"}
    run = _start(scenario, approve, joined=5)
    run.approve("a", 0)
    run.approve("b", 0)
    run.approve("b", 1)
    wait_until(
        lambda: "b" in run.state.uploads(1),
        what="b's round-1 upload to be recorded",
        alive=run.everyone(),
    )
    # Round 1 stays open until its deadline (a has not uploaded), so b cannot
    # have seen an unmask request yet.
    assert run.state.round_status(1) == "open"
    run.nodes["b"].freeze()
    run.at_gate("a", 1)
    run.nodes["a"].kill()
    return _finish(run, victims=("a", "b"), expect="completed")


def _gate_victim(scenario: Scenario) -> Finished:
    run = _start(scenario, {"a": "manual", "b": "auto", "c": "auto"}, joined=3)
    run.at_gate("a", 0)
    run.nodes["a"].kill()
    return _finish(run, victims=("a",), expect="failed")


@pytest.fixture(scope="module")
def scenarios(
    module_processes: Processes, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Finished | BaseException]:
    root = tmp_path_factory.mktemp("dropout")
    # Collusion threshold 1 (the default): pair weights survive one lost partner.
    four = _federation(root, "four", FOUR)
    # Five nodes: after two are lost the rerun among three keeps T + 2 = 3.
    five = _federation(root, "five", FIVE)
    strict = _federation(root, "strict", THREE, "--min-nodes", "3")
    no_slack = _federation(root, "no-slack", THREE, "--collusion-threshold", "0")
    turns = Turns(ORDER)
    where = {
        "during-unmask": (_during_unmask, five),
        "before-roster": (_before_roster, four),
        "after-upload": (_after_upload, four),
        "after-roster": (_after_roster, four),
        "noise-floor": (_gate_victim, no_slack),
        "below-threshold": (_gate_victim, strict),
    }

    def job(name: str) -> Callable[[], Finished]:
        scenario_of, federation = where[name]
        return lambda: scenario_of(Scenario(name, federation, root, module_processes, turns))

    return run_concurrently({name: job(name) for name in ORDER})


def _assert_exact(
    done: Finished,
    rounds: dict[int, tuple[str, ...]],
    reference_rounds: tuple[tuple[str, ...], tuple[str, ...]],
) -> None:
    """Aggregates = Σ audit payloads over each round's survivors; models = the reference."""
    run = done.run
    for round_index, survivors in rounds.items():
        published = run.state.result(round_index)
        assert published is not None, f"round {round_index} has no result\n{run.describe()}"
        assert published[0] == survivors
        assert np.array_equal(published[1], run.audit_sum(survivors, round_index))
    fed = run.federation
    reference = reference_model(fed, *reference_rounds)
    for node in rounds[max(rounds)]:
        assert relative_difference(run.model(node), reference, fed.holdout()) <= 1e-9


def _unmask_entries(run: SessionRun, node: str) -> list[tuple[int, list[str]]]:
    return [
        (e["round_index"], e["details"]["dropped"])
        for e in run.ledger(node)["entries"]
        if e["kind"] == "unmask"
    ]


def test_node_missing_before_the_roster_is_excluded(
    scenarios: dict[str, Finished | BaseException],
) -> None:
    done = outcome(scenarios, "before-roster")
    run = done.run
    assert done.codes == dict.fromkeys(["coordinator", "b", "c", "d"], 0), run.describe()
    assert run.state.members() == dict.fromkeys(["b", "c", "d"], "live")
    assert "excluded: {a}" in run.nodes["b"].stderr()
    survivors = ("b", "c", "d")
    _assert_exact(done, {0: survivors, 1: survivors}, (survivors, survivors))
    # Every round over the same three cohorts: the pooled fit of those three.
    fed = run.federation
    cohorts = [fed.cohort(n) for n in survivors]
    pooled = run_in_process([(c.features, c.age) for c in cohorts], plan_settings(fed.config))
    assert relative_difference(run.model("b"), pooled, fed.holdout()) <= 1e-9
    # Every round has its unmask step; nobody dropped in either.
    assert all(run.state.unmask_attempts(r) == [(survivors, ())] for r in (0, 1))


def test_node_lost_after_the_roster_is_unmasked(
    scenarios: dict[str, Finished | BaseException],
) -> None:
    done = outcome(scenarios, "after-roster")
    run = done.run
    assert done.codes == {"coordinator": 0, "b": 0, "c": 0, "d": 0, "a": -9}, run.describe()
    survivors = ("b", "c", "d")
    assert run.state.unmask_attempts(0) == [(survivors, ("a",))]
    assert run.state.unmask_attempts(1) == [(survivors, ())]
    _assert_exact(done, {0: survivors, 1: survivors}, (survivors, survivors))
    for node in survivors:
        assert _unmask_entries(run, node) == [(0, ["a"])]


def test_node_lost_after_its_upload_counts_in_the_rounds_it_finished(
    scenarios: dict[str, Finished | BaseException],
) -> None:
    done = outcome(scenarios, "after-upload")
    run = done.run
    assert done.codes == {"coordinator": 0, "b": 0, "c": 0, "d": 0, "a": -9}, run.describe()
    survivors = ("b", "c", "d")
    assert run.state.unmask_attempts(0) == [(FOUR, ())]
    assert run.state.unmask_attempts(1) == [(survivors, ("a",))]
    _assert_exact(done, {0: FOUR, 1: survivors}, (FOUR, survivors))
    for node in survivors:
        assert _unmask_entries(run, node) == [(1, ["a"])]


def test_survivor_silent_during_unmask_makes_the_round_rerun_among_the_others(
    scenarios: dict[str, Finished | BaseException],
) -> None:
    done = outcome(scenarios, "during-unmask")
    run = done.run
    left = ("c", "d", "e")
    assert done.codes == {"coordinator": 0, **dict.fromkeys(left, 0), "a": -9, "b": -9}, (
        run.describe()
    )
    # One survivor set for round 1, never changed: b never signed it, so nobody answered.
    assert run.state.unmask_attempts(1) == [(("b", "c", "d", "e"), ("a",))]
    assert run.state.round_status(1) == "superseded" and run.state.result(1) is None
    assert run.state.unmask_attempts(2) == [(left, ())]
    assert run.state.members() == {"a": "dropped", "b": "dropped", **dict.fromkeys(left, "live")}
    # b's round-1 upload was stored, and stays under its self-mask: no seed, no pair terms.
    assert "b" in run.state.uploads(1)
    assert run.state.query("SELECT COUNT(*) FROM unmask_corrections WHERE round_index = 1") == [
        (0,)
    ]
    _assert_exact(done, {0: FIVE, 2: left}, (FIVE, left))
    for node in left:
        assert _unmask_entries(run, node) == []
        # The rerun is a release of its own: rounds 0, 1 and 2 are counted.
        releases = [e["round_index"] for e in run.ledger(node)["entries"] if e["kind"] == "release"]
        assert releases == [0, 1, 2]


def test_too_few_survivors_end_the_session_with_the_reason(
    scenarios: dict[str, Finished | BaseException],
) -> None:
    done = outcome(scenarios, "below-threshold")
    run = done.run
    assert done.codes == {"coordinator": 1, "b": 1, "c": 1, "a": -9}, run.describe()
    why = (
        "only 2 of 3 nodes submitted round 'means' (a dropped); the federation requires at least 3"
    )
    session = run.state.session()
    assert session is not None and session["state"] == "failed" and session["reason"] == why
    assert why in run.coordinator.stderr()
    for node in ("b", "c"):
        text = run.nodes[node].stderr()
        assert why in text and "Traceback" not in text
    assert run.state.result(0) is None


def test_survivors_refuse_an_unmask_below_their_noise_floor(
    scenarios: dict[str, Finished | BaseException],
) -> None:
    done = outcome(scenarios, "noise-floor")
    run = done.run
    assert done.codes == {"coordinator": 1, "b": 1, "c": 1, "a": -9}, run.describe()
    assert run.state.unmask_attempts(0) == [(("b", "c"), ("a",))]
    refusals = run.state.refusals()
    assert refusals, run.describe()
    refusing = {node for _, node, _ in refusals}
    for round_index, _, reason in refusals:
        assert round_index == 0 and "below my floor" in reason
    # The coordinator fails the session at the first refusal; a survivor whose
    # refusal came second may only have seen that failure.
    session = run.state.session()
    assert session is not None and session["state"] == "failed"
    assert "refused to unmask round 0" in session["reason"]
    assert session["reason"] in run.coordinator.stderr()
    for node in ("b", "c"):
        text = run.nodes[node].stderr()
        assert "Traceback" not in text
        declined = [e for e in run.ledger(node)["entries"] if e["kind"] == "refusal"]
        assert not [e for e in run.ledger(node)["entries"] if e["kind"] == "unmask"]
        if node in refusing:
            assert len(declined) == 1
            assert declined[0]["details"]["dropped"] == ["a"]
            assert "below my floor" in declined[0]["details"]["reason"]
            assert "refused to unmask round 0 ('means')" in text and "below my floor" in text
        else:
            assert "refused to unmask round 0" in text
    assert run.state.result(0) is None
