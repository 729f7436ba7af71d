"""Every unmask answer with pair terms is a release the budget sees, before its bytes leave.

Revealing pair terms with dropped nodes raises the round's release for the
coalition classes. Before, the unmask path checked only the per-egress floor:
in the default 3-TRE federation (T = 1, then min_nodes = 2) one checker
rejecting its TRE's egress made the other two reveal, each recorded
colluders:1 at ε = ∞, and both were refused every later session. Now:

* ``federation init`` sets min_nodes = T + 2 = 3 for three nodes, so the
  coordinator ends the session at the withdrawal and nobody reveals anything;
* with min_nodes = 2 written into the config by hand (the old default), the
  survivors refuse the unmask request with a sentence naming colluders:1;
* a reveal that fits every class is recorded in the node's ledger before the
  answer leaves: the lying coordinator (tests/adversary/lying_server.py) reads
  the node's state-folder ledger while the node still waits for its receipt;
  with a budget it would pass, the same reveal is refused with the numbers.

In both real-coordinator scenarios each survivor's checked classes stay
finite and within the budget, and each then completes a second session with
the same state folder.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from node.egress.approval import sign_approval, write_approval
from node.egress.budget import checked
from node.egress.bundle import EgressBundle
from node.records.ledger import ObserverTotal, PrivacyLedger
from proto.federation import load_federation
from tests.adversary.lying_server import LyingCoordinator, RoundRecord, Script
from tests.adversary.records import Answer
from tests.adversary.scenario import Attack, Processes, ledger_gaps, make_federation
from tests.support.processes import Federation, init_federation
from tests.support.sessions import SessionRun

pytestmark = pytest.mark.integration

THREE = ("a", "b", "c")
FOUR = ("a", "b", "c", "d")
REJECTED = "a"
SURVIVORS = ("b", "c")
END = "the test coordinator ends the session after the unmask answers"


@dataclass
class SharedStateRun(SessionRun):
    """A session whose nodes keep their state folders in ``states`` (one TRE, many sessions)."""

    states: Path = Path()

    def state_folder(self, node_id: str) -> Path:
        return self.states / node_id


def _federation(root: Path, *, min_nodes: int | None = None) -> Federation:
    fed = init_federation(
        root,
        THREE,
        cohort_sizes=(150, 120, 130),
        join_deadline=30.0,
        round_deadline=10.0,
        nan_policy="drop",
    )
    if min_nodes is None:
        return fed
    # A config written by hand (or by an older init) with fewer survivors allowed.
    text = fed.toml.read_text(encoding="utf-8")
    assert f"min_nodes = {fed.config.min_nodes}\n" in text
    fed.toml.write_text(
        text.replace(f"min_nodes = {fed.config.min_nodes}\n", f"min_nodes = {min_nodes}\n"),
        encoding="utf-8",
    )
    return Federation(fed.root, load_federation(fed.toml))


def _reject(run: SessionRun, node_id: str) -> None:
    """As the node's output checker: sign a rejection of its round-0 egress."""
    folder = run.at_gate(node_id, 0)
    signed = sign_approval(
        run.federation.checker(node_id),
        EgressBundle.manifest_sha256(folder),
        "reject",
        reviewer="output checker",
        comment="not this time",
    )
    write_approval(folder, signed)


def _checked_totals(run: SessionRun, node: str) -> dict[str, ObserverTotal]:
    config = run.federation.config
    ledger = PrivacyLedger.open(run.state_folder(node) / "ledger.json", node, config.privacy.delta)
    return {t.label: t for t in ledger.totals() if checked(t.label, config.privacy.residual_dp)}


def _entries(run: SessionRun, node: str) -> list[dict[str, Any]]:
    """The node's state-folder ledger entries (none when it never released anything)."""
    path = run.state_folder(node) / "ledger.json"
    if not path.exists():
        return []
    entries: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["entries"]
    return entries


def _assert_within_budget(run: SessionRun, node: str, *, released: bool = True) -> None:
    budget = run.federation.config.privacy.epsilon_budget
    totals = _checked_totals(run, node)
    if released:
        assert {"outsider", "colluders:1"} <= set(totals), totals
    for label, total in totals.items():
        assert math.isfinite(total.mu) and total.epsilon <= budget, (node, label, total)


def _second_session(fed: Federation, root: Path, processes: Processes) -> SharedStateRun:
    again = SharedStateRun(fed, root / "second", processes, states=root / "states")
    again.start_coordinator()
    for node in THREE:
        again.start_node(node)
    codes = {"coordinator": again.coordinator.wait(90)}
    codes.update({n: again.nodes[n].wait(30) for n in THREE})
    assert codes == dict.fromkeys(["coordinator", *THREE], 0), again.describe()
    return again


@pytest.mark.parametrize(
    "min_nodes",
    [None, pytest.param(2, marks=pytest.mark.slow)],
    ids=["init-default", "hand-written-2"],
)
def test_a_rejected_egress_in_a_three_tre_federation_costs_the_survivors_no_unbounded_class(
    tmp_path: Path, processes: Processes, min_nodes: int | None
) -> None:
    fed = _federation(tmp_path / "fed", min_nodes=min_nodes)
    assert fed.config.min_nodes == (3 if min_nodes is None else 2)
    first = SharedStateRun(fed, tmp_path / "first", processes, states=tmp_path / "states")
    first.start_coordinator()
    first.start_node(REJECTED, approve="manual")
    for node in SURVIVORS:
        first.start_node(node)
    _reject(first, REJECTED)
    codes = {"coordinator": first.coordinator.wait(90)}
    codes.update({n: first.nodes[n].wait(30) for n in (REJECTED, *SURVIVORS)})
    assert codes == dict.fromkeys(["coordinator", REJECTED, *SURVIVORS], 1), first.describe()
    session = first.state.session()
    assert session is not None and session["state"] == "failed"
    if min_nodes is None:
        # Two left of the three it needs: the coordinator stops at the withdrawal
        # (a survivor may not even have uploaded by then).
        assert "the federation requires at least 3" in session["reason"], session
        assert first.state.unmask_attempts(0) == []
    else:
        # The survivors are asked for their pair terms with a, and refuse.
        assert first.state.unmask_attempts(0) == [(SURVIVORS, (REJECTED,))]
        assert "refused to unmask round 0" in session["reason"], session
        refusals = first.state.refusals()
        assert refusals, first.describe()
        for _, _, reason in refusals:
            assert (
                "revealing my pair terms with {a} in round 0: an outsider with 1 colluding "
                "node (colluders:1) would face no noise at all (μ = inf)" in reason
            ), reason
            assert "above the budget of 4" in reason
    for node in SURVIVORS:
        entries = _entries(first, node)
        assert not [e for e in entries if e["kind"] == "unmask"], entries
        assert "Traceback" not in first.nodes[node].stderr()
        # With min_nodes = 2 both uploaded before they were asked to unmask.
        _assert_within_budget(first, node, released=min_nodes is not None)

    again = _second_session(fed, tmp_path, processes)
    for node in SURVIVORS:
        _assert_within_budget(again, node)
        releases = [e for e in _entries(again, node) if e["kind"] == "release"]
        assert releases and releases[-1]["session_id"] == again.state.session()["session_id"]


class DroppedOne(Script):
    """Round 0: tell b, c and d that a dropped (a is shown the honest set and waits).

    Each answer carrying pair terms is checked as it arrives, while its node
    waits for the receipt: the node's state-folder ledger must already hold
    the unmask entry that counts it.
    """

    def __init__(self, federation: Federation) -> None:
        self.federation = federation
        self.ledger_first: dict[str, bool] = {}

    def shown(
        self, server: LyingCoordinator, record: RoundRecord, caller: str
    ) -> tuple[Sequence[str], Sequence[str]]:
        if record.index != 0 or caller == REJECTED:
            return super().shown(server, record, caller)
        return [n for n in record.participants if n != REJECTED], [REJECTED]

    def answered(self, server: LyingCoordinator, record: RoundRecord, answer: Answer) -> None:
        if answer.corrections is None:
            return
        path = self.federation.root / "nodes" / answer.node_id / "state" / "ledger.json"
        entries: list[dict[str, Any]] = (
            PrivacyLedger.open(
                path, answer.node_id, self.federation.config.privacy.delta
            ).to_json()["entries"]
            if path.exists()
            else []
        )
        self.ledger_first[answer.node_id] = any(
            e["kind"] == "unmask"
            and e["session_id"] == server.session_id
            and e["round_index"] == record.index
            and set(answer.dropped) <= set(e["details"]["dropped"])
            for e in entries
        )


@pytest.mark.parametrize("budget", [4.0, 1.2], ids=["within-budget", "over-budget"])
def test_a_reveal_is_in_the_ledger_before_it_leaves_or_refused_with_the_numbers(
    tmp_path: Path, processes: Processes, budget: float
) -> None:
    federation = make_federation(
        tmp_path / "fed", FOUR, extra=["--epsilon-budget", str(budget), "--max-reruns", "0"]
    )
    assert federation.config.min_nodes == 3
    script = DroppedOne(federation)
    attack = Attack(federation, tmp_path / "run", processes, script)
    attack.start()
    others = ("b", "c", "d")
    record: RoundRecord = attack.wait_for(
        "b, c and d to answer or refuse",
        lambda: (
            (r := attack.coordinator.round(0)) is not None
            and set(others) <= set(r.answers) | set(r.refusals)
            and r
        ),
    )
    codes = attack.end(END)
    assert codes == dict.fromkeys(FOUR, 1), attack.describe()
    assert ledger_gaps(attack) == []
    if budget == 4.0:
        assert set(record.answers) >= set(others) and not record.refusals
        for node in others:
            assert record.answers[node].dropped == (REJECTED,)
        assert script.ledger_first == dict.fromkeys(others, True)
        for node in others:
            unmask = [e for e in attack.ledger(node)["entries"] if e["kind"] == "unmask"]
            assert len(unmask) == 1 and unmask[0]["details"]["dropped"] == [REJECTED]
            # The entry raised the release: one colluder with the answer knows two of three terms.
            release = next(e for e in attack.ledger(node)["entries"] if e["kind"] == "release")
            ratio = unmask[0]["mu"]["colluders:1"] / release["mu"]["colluders:1"]
            assert math.isclose(ratio, math.sqrt(2), rel_tol=1e-9)
    else:
        assert set(record.refusals) == set(others)
        assert not [a for a in record.answers.values() if a.corrections is not None]
        assert script.ledger_first == {}
        for node in others:
            reason = record.refusals[node]
            assert (
                "revealing my pair terms with {a} in round 0: an outsider with 1 colluding "
                "node (colluders:1) would face μ = " in reason
            ), reason
            assert "above the budget of 1.2" in reason
            entries = attack.ledger(node)["entries"]
            assert not [e for e in entries if e["kind"] == "unmask"]
            assert [e["kind"] for e in entries].count("refusal") == 1
