"""The budget against every observer class: which classes are held to it, and by how much."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from node.egress.budget import checked, describe, excess_sentence, over_budget, unbounded_note
from node.records.ledger import PrivacyLedger
from noise.accounting import compose_mu, gaussian_epsilon
from tests.support.ledger_entries import release

DELTA = 1e-6


def _ledger(tmp_path: Path, *releases: dict[str, float]) -> PrivacyLedger:
    ledger = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    for index, mu in enumerate(releases):
        release(ledger, ("earlier", index, "sums"), mu, "00" * 32, f"{index:02x}" * 32)
    return ledger


def test_the_coordinator_classes_are_held_to_the_budget_only_with_residual_noise() -> None:
    for label in ("outsider", "colluders:1", "colluders:3"):
        assert checked(label, residual_dp=False) and checked(label, residual_dp=True)
    for label in ("coordinator", "coalition:1"):
        assert not checked(label, residual_dp=False) and checked(label, residual_dp=True)
    assert describe("colluders:1") == "an outsider with 1 colluding node"
    assert describe("coalition:2") == "the coordinator with 2 colluding nodes"


def test_every_class_over_the_budget_is_named_with_its_numbers(tmp_path: Path) -> None:
    earlier = {"outsider": 0.2, "colluders:1": 0.3, "coordinator": math.inf, "coalition:1": 0.9}
    ledger = _ledger(tmp_path, earlier)
    new = {"outsider": 0.2, "colluders:1": 0.3, "coordinator": math.inf, "coalition:1": 0.9}
    budget = gaussian_epsilon(compose_mu([0.3, 0.3]), DELTA) * 0.99
    over = over_budget(ledger, [new], budget=budget, residual_dp=False)
    # The outsider stays below; the coordinator classes are not checked without residual noise.
    assert [e.label for e in over] == ["colluders:1"]
    (excess,) = over
    assert excess.epsilon == pytest.approx(gaussian_epsilon(compose_mu([0.3, 0.3]), DELTA))
    assert (excess.releases, excess.before_releases) == (2, 1)
    assert excess.before_epsilon == pytest.approx(gaussian_epsilon(0.3, DELTA))
    assert excess_sentence(excess).startswith(
        f"against an outsider with 1 colluding node (colluders:1) to ε = {excess.epsilon:.4g} "
        "over 2 releases (1 new;"
    )
    with_residual = over_budget(ledger, [new], budget=budget, residual_dp=True)
    assert [e.label for e in with_residual] == ["colluders:1", "coordinator", "coalition:1"]
    assert unbounded_note(["outsider", "coordinator"], residual_dp=False).startswith(
        "not held to the budget: coordinator"
    )
    assert unbounded_note(["outsider", "coordinator"], residual_dp=True) == ""
    # A projection never writes the ledger.
    assert len(PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA).entries) == 1
