"""The session benchmark's federation: two rounds of the benchmark's own layout.

The benchmark times two rounds per session whatever model plan ``federation
init`` writes by default; a change of that default must not leave it with one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import round_walk
from benchmarks.session_bench import BENCH_ROUNDS, TENSOR, _make_federation, _plan
from proto.federation import load_federation


def test_the_benchmark_federation_declares_its_two_rounds(tmp_path: Path) -> None:
    path = _make_federation(tmp_path / "k3", ["n0", "n1", "n2"], size=7)
    assert _plan(path) == BENCH_ROUNDS == ("first", "second")
    rounds = load_federation(path).plan.rounds
    assert [spec.layout.to_json() for spec in rounds] == [
        [{"name": TENSOR, "shape": [7]}],
        [{"name": TENSOR, "shape": [7]}],
    ]


@pytest.mark.slow
def test_the_round_walk_follows_one_model_round(tmp_path: Path) -> None:
    """The walk starts in run_model_round, stays on the node side and counts what it saw."""
    walk = round_walk.walk_one_round(tmp_path)
    assert walk.path[0] == "node.session.model_round"
    assert not any(m.startswith(("coordinator", "zerosum")) for m in walk.path)
    figures = walk.figures()
    assert figures["round_walk_modules"] == len(set(walk.path))
    assert figures["round_walk_transitions"] == len(walk.path) - 1
    assert "node.session.results" in walk.path  # it waited for and took the aggregate
    assert 10 <= figures["round_walk_modules"] <= figures["round_walk_module_pairs"]
