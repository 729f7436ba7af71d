"""An unmask answer with pair terms is a release the budget sees before its bytes leave.

The node's answers are driven directly (``node.session.unmask_answers.answer``)
with correctly signed requests and a fake coordinator that records what was
sent (the helpers of tests/node/test_unmask_safety.py). Revealing the pair
terms with the dropped nodes raises the round's release for the coalition
classes; the node composes that with its ledger and refuses, naming the class
and the numbers, when any class the policy bounds would be left without noise
or pass ``privacy.epsilon_budget`` — and then nothing is recorded as revealed
and nothing but the refusal is sent.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from node.egress import budget
from node.errors import NodeRefused
from proto.federation import FederationConfig
from tests.node.unmask_requests import _answer, _node, _released, _request, _unmask_entries
from tests.support.made_up_federation import _config


def _with_budget(config: FederationConfig, epsilon_budget: float) -> FederationConfig:
    return dataclasses.replace(
        config, privacy=dataclasses.replace(config.privacy, epsilon_budget=epsilon_budget)
    )


def test_three_nodes_one_dropped_would_leave_one_colluder_facing_no_noise(tmp_path: Path) -> None:
    # The old default federation: K = 3, T = 1, min_nodes = 2. c dropped; a's
    # pair term with c revealed, b colluding holds the only other one.
    ids = ["a", "b", "c"]
    node = _node(tmp_path, _config(ids, threshold=1, min_nodes=2))
    noise = _released(node, ids, [0])
    # The per-egress floor alone lets it through: a keeps its term with b.
    assert noise.floor_shortfall(["c"]) is None
    assert math.isinf(noise.mu_after_unmask(["c"])["colluders:1"])
    with pytest.raises(NodeRefused) as refused:
        _answer(node, _request(ids, 0, ["a", "b"], ["c"]), ids, noise, awaiting=0)
    reason = str(refused.value)
    assert "revealing my pair terms with {c} in round 0" in reason
    assert "an outsider with 1 colluding node (colluders:1) would face no noise at all" in reason
    assert "ε = inf over 1 release" in reason and "above the budget of 4" in reason
    # Attested, then refused: no pair terms left, and the ledger never counts them.
    assert [s[0] for s in node.coordinator.sent] == ["attest", "refuse"]
    assert _unmask_entries(node) == []
    assert node.ctx.ledger.entries[-1].kind == "refusal"
    checked = [t for t in node.ctx.ledger.totals() if budget.checked(t.label, residual_dp=False)]
    assert [t.label for t in checked] == ["outsider", "colluders:1"]
    assert all(t.epsilon <= 1.0 + 1e-9 for t in checked)


def test_a_reveal_that_would_pass_the_budget_is_refused_with_the_numbers(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d"]
    config = _with_budget(_config(ids, threshold=1, min_nodes=3), 1.2)
    node = _node(tmp_path, config)
    noise = _released(node, ids, [0])
    after = noise.mu_after_unmask(["d"])
    # Finite, but more than the budget admits: one colluder then knows two of a's three terms.
    assert math.isclose(after["colluders:1"], noise.mu()["colluders:1"] * math.sqrt(2))
    excess = budget.reveal_excess(
        node.ctx.ledger,
        session_id=node.ctx.session_id,
        round_index=0,
        after=after,
        budget=1.2,
        residual_dp=False,
    )
    assert [e.label for e in excess] == ["colluders:1"]
    epsilon = excess[0].epsilon
    assert 1.2 < epsilon < math.inf
    with pytest.raises(NodeRefused) as refused:
        _answer(node, _request(ids, 0, ["a", "b", "c"], ["d"]), ids, noise, awaiting=0)
    reason = str(refused.value)
    assert (
        f"an outsider with 1 colluding node (colluders:1) would face μ = {after['colluders:1']:.4g}"
        in reason
    )
    assert f"bringing its total to ε = {epsilon:.4g} over 1 release" in reason
    assert "(the ledger holds ε = 1), above the budget of 1.2" in reason
    assert _unmask_entries(node) == []
    assert node.coordinator.sent_answers() == []


def test_within_the_budget_the_answer_is_recorded_at_its_raised_cost_before_it_is_sent(
    tmp_path: Path,
) -> None:
    ids = ["a", "b", "c", "d"]
    node = _node(tmp_path, _config(ids, threshold=1, min_nodes=3))
    noise = _released(node, ids, [0])
    ledger = node.ctx.ledger
    entries_when_sent: list[int] = []
    real_submit = node.coordinator.submit_unmask

    def submit(*args: Any) -> object:
        # What the ledger file holds at the moment the bytes would leave.
        entries_when_sent.append(
            sum(
                1
                for e in type(ledger).open(ledger.path, "a", ledger.delta).entries
                if e.kind == "unmask"
            )
        )
        return real_submit(*args)

    node.coordinator.submit_unmask = submit  # type: ignore[method-assign]
    _answer(node, _request(ids, 0, ["a", "b", "c"], ["d"]), ids, noise, awaiting=0)
    assert entries_when_sent == [1]
    assert _unmask_entries(node) == [(0, ["d"])]
    total = {t.label: t for t in ledger.totals()}["colluders:1"]
    assert math.isclose(total.mu, noise.mu_after_unmask(["d"])["colluders:1"])
