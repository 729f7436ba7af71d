"""The session benchmark's federation: two rounds of the benchmark's own layout.

The benchmark times two rounds per session whatever model plan ``federation
init`` writes by default; a change of that default must not leave it with one.
"""

from __future__ import annotations

from pathlib import Path

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
