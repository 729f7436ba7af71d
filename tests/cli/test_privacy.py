"""The worked privacy table printed by `zerosum privacy`."""

from __future__ import annotations

import json

import pytest

from zerosum.cli import main


def test_table_lists_every_node_and_observer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "--nodes", "4", "--collusion-threshold", "2"]) == 0
    out = capsys.readouterr().out
    assert "ε outsider" in out and "ε coord+2" in out
    rows = [line for line in out.splitlines() if line.strip().startswith("tre")]
    assert len(rows) == 4
    # No residual noise: the coordinator learns the exact sum.
    assert all(line.split()[5] == "inf" for line in rows)
    # The design meets the target ε = 1 even against T = 2 colluders.
    assert all(float(line.split()[4]) <= 1.0 + 1e-9 for line in rows)


def test_json_with_residual_is_finite_for_the_coordinator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["privacy", "--nodes", "10", "--construction", "cape", "--residual-dp", "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["aggregate_noise_variance"] > 0
    node = data["per_node"]["tre01"]
    assert node["outsider"]["epsilon"] <= 1.0
    assert 1.0 < node["coordinator"]["epsilon"] < 10


def test_bad_input_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "--nodes", "1"]) == 2
    assert "--nodes must be at least 2" in capsys.readouterr().err
    assert main(["privacy", "--epsilon", "-1"]) == 2
    assert "epsilon" in capsys.readouterr().err
    assert main(["privacy", "--nodes", "3", "--collusion-threshold", "2"]) == 2
    assert "infeasible" in capsys.readouterr().err


def test_every_epsilon_column_composes_over_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    def first_row(rounds: int) -> list[str]:
        assert (
            main(["privacy", "--nodes", "5", "--collusion-threshold", "2", "--rounds", str(rounds)])
            == 0
        )
        lines = capsys.readouterr().out.splitlines()
        return lines[3].split()

    one, two = first_row(1), first_row(2)
    # node, egress σ, ε outsider, σ left vs T, ε outsider+T, ε coordinator, ...
    assert one[1] == two[1] and one[3] == two[3]  # noise levels do not change with rounds
    assert float(two[2]) > float(one[2])
    assert float(two[4]) > float(one[4])  # the T-coalition column composes too
