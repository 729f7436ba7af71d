"""The dropout scenario follows the live unmasking rule and its closed forms."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

from node.egress.release import ReleaseNoise
from node.plans.interface import TensorSensitivity
from noise.accounting import gaussian_epsilon
from noise.designs import explicit_design, remaining_variance
from noise.policy import NoisePlan, worst_remaining_variance
from simulations.config import DropoutSweep, SimulationConfigError, load_config
from simulations.dropout import DropoutParams, dropout_plan, dropout_rows, survivor_noise
from simulations.dropout_summary import summarise_dropout, wilson_interval
from simulations.seeding import cell_seed
from simulations.sweep import plan_cells, run_cell

SMALL = [
    DropoutParams("complete", 0, 7, 0.3, 1),
    DropoutParams("complete", 0, 9, 0.3, 3),
    DropoutParams("harary", 4, 9, 0.3, 1),
    DropoutParams("harary", 4, 10, 0.3, 2),
    DropoutParams("harary", 3, 9, 0.25, 1),  # odd degree on odd K: node 0 has one more pair
]


def _live(plan: NoisePlan, node: str) -> ReleaseNoise:
    """The node's release at unit scale, as ``node.egress.release.plan_release`` builds it."""
    return ReleaseNoise(
        node_id=node,
        unit=plan,
        tensors=(TensorSensitivity("stats", 1.0, "unit"),),
        scales={"stats": 1.0},
        delta=1e-6,
        calibration="unit",
    )


@pytest.mark.parametrize("params", SMALL, ids=lambda p: f"{p.graph}{p.harary_degree}-K{p.n_nodes}")
@pytest.mark.parametrize("residual", [False, True])
def test_survivors_keep_what_the_live_rule_computes(params: DropoutParams, residual: bool) -> None:
    plan = dropout_plan(params, residual)
    design = plan.design
    ids = design.node_ids
    t = params.collusion_threshold
    rng = np.random.default_rng(2024)
    alive = rng.random((40, len(ids))) >= params.dropout_rate
    alive[0] = True  # no dropout: no unmasking at all
    alive[1, :2] = False
    kept = survivor_noise(plan, alive)
    checked_refusals = checked_answers = 0
    for rep, row in enumerate(alive):
        dropped = [n for n, a in zip(ids, row, strict=True) if not a]
        survivors = [n for n, a in zip(ids, row, strict=True) if a]
        if not survivors:
            continue
        live_left = remaining_variance(design, dropped, plan.residual_variance)
        for node in survivors:
            k = ids.index(node)
            assert kept.after_reveal[rep, k] == pytest.approx(live_left[node], rel=1e-12)
            answers = _live(plan, node).floor_shortfall(dropped) is None
            assert bool(kept.answered[rep, k]) == answers
            if answers:
                checked_answers += 1
                assert kept.outsider[rep, k] == pytest.approx(live_left[node], rel=1e-12)
                # The worst T survivors, by brute force over every coalition.
                others = [n for n in survivors if n != node]
                worst = min(
                    (
                        remaining_variance(design, [*dropped, *c], plan.residual_variance)[node]
                        for c in itertools.combinations(others, min(t, len(others)))
                    ),
                )
                assert kept.coalition[rep, k] == pytest.approx(worst, rel=1e-12, abs=1e-15)
                floor = plan.target_variance * (1 - 1e-9)
                assert bool(kept.strict[rep, k]) == (worst >= floor)
            else:
                checked_refusals += 1
                assert kept.outsider[rep, k] == pytest.approx(
                    design.variance(node) + plan.residual_variance, rel=1e-12
                )
                assert kept.coalition[rep, k] == pytest.approx(
                    worst_remaining_variance(design, node, t, plan.residual_variance), rel=1e-12
                )
    assert checked_answers > 0 and checked_refusals > 0


def test_designs_with_several_pair_levels_match_brute_force() -> None:
    rng = np.random.default_rng(11)
    ids = [f"n{i}" for i in range(7)]
    pairs = {
        (a, b): float(rng.choice([0.0, 0.2, 0.5, 1.0])) for a, b in itertools.combinations(ids, 2)
    }
    for a in ids:  # every node needs a partner
        pairs[(a, "n6" if a != "n6" else "n0")] = 0.7
    design = explicit_design(ids, pairs)
    plan = NoisePlan(design, 0.05, 1.2, 1.0, 1e-6, 1.0)
    alive = rng.random((30, 7)) >= 0.3
    kept = survivor_noise(plan, alive, collusion_threshold=2)
    levels = np.unique(design.pair_variances[design.pair_variances > 0])
    assert levels.size == 4
    compared = 0
    for rep, row in enumerate(alive):
        dropped = [n for n, a in zip(ids, row, strict=True) if not a]
        survivors = [n for n, a in zip(ids, row, strict=True) if a]
        left = remaining_variance(design, dropped, 0.05)
        for node in survivors:
            k = ids.index(node)
            assert kept.after_reveal[rep, k] == pytest.approx(left[node], rel=1e-12)
            if not kept.answered[rep, k]:
                continue
            others = [n for n in survivors if n != node]
            worst = min(
                remaining_variance(design, [*dropped, *c], 0.05)[node]
                for c in itertools.combinations(others, min(2, len(others)))
            )
            assert kept.coalition[rep, k] == pytest.approx(worst, rel=1e-12)
            compared += 1
    assert compared >= 20 and not kept.answered[alive].all()


def test_complete_graph_rounds_fail_exactly_when_more_than_t_drop() -> None:
    params = DropoutParams("complete", 0, 200, 0.02, 3)
    reps = 400
    rows = list(dropout_rows(params, reps, cell_seed(5, "d" * 64)))
    zerosum = [r for r in rows if r["scheme"] == "zerosum"]
    assert len(zerosum) == reps
    for r in zerosum:
        assert r["infeasible"] == int(r["dropped"] > 3)  # type: ignore[operator]
        # The design is sized exactly for T: any dropout leaves T colluders too much.
        assert r["infeasible_strict"] == int(r["dropped"] > 0)  # type: ignore[operator]
    # And the dropout draws follow Binomial(K, r): P(more than T drop).
    expected = float(binom.sf(3, 200, 0.02))
    failed = sum(int(r["infeasible"]) for r in zerosum)  # type: ignore[call-overload]
    lo, hi = wilson_interval(failed, reps, level=0.999)
    assert lo <= expected <= hi


def test_rows_compare_against_independent_noise() -> None:
    params = DropoutParams("harary", 6, 60, 0.1, 2)
    rows = list(dropout_rows(params, 30, cell_seed(1, "a" * 64)))
    target = gaussian_epsilon(1.0 / math.sqrt(dropout_plan(params, False).target_variance), 1e-6)
    assert target == pytest.approx(1.0, rel=1e-9)
    by_rep: dict[int, dict[str, dict[str, object]]] = {}
    for r in rows:
        by_rep.setdefault(int(r["rep"]), {})[str(r["scheme"])] = r  # type: ignore[call-overload]
    for schemes in by_rep.values():
        ind, zs, res = schemes["independent"], schemes["zerosum"], schemes["zerosum+residual"]
        survivors = int(ind["survivors"])  # type: ignore[call-overload]
        assert zs["survivors"] == res["survivors"] == survivors
        assert ind["infeasible"] == 0 and ind["aggregate_noise_var"] == survivors
        assert ind["epsilon_coalition_max"] == pytest.approx(target)
        assert zs["infeasible"] == int(int(zs["refusals"]) > 0)  # type: ignore[call-overload]
        if not zs["infeasible"]:
            assert zs["aggregate_noise_var"] == 0.0
            assert float(zs["epsilon_outsider_max"]) <= target * (1 + 1e-9)  # type: ignore[arg-type]
        else:
            assert math.isnan(float(zs["aggregate_noise_var"]))  # type: ignore[arg-type]
        if not res["infeasible"]:
            assert res["aggregate_noise_var"] == pytest.approx(survivors / 60)
    assert any(r["infeasible"] for r in rows) and not all(r["infeasible"] for r in rows)


def test_a_harary_survivor_can_be_left_bare_against_t_colluders() -> None:
    # d = 2T: node 0 loses T neighbours and still meets its floor, but its T other
    # neighbours then hold every pair term it has left.
    params = DropoutParams("harary", 4, 12, 0.0, 2)
    plan = dropout_plan(params, False)
    alive = np.ones((1, 12), dtype=np.bool_)
    alive[0, [1, 11]] = False  # node 0's neighbours are 1, 2, 10, 11
    kept = survivor_noise(plan, alive)
    assert kept.answered[0, 0]
    assert kept.outsider[0, 0] == pytest.approx(plan.target_variance)
    assert kept.coalition[0, 0] == 0.0


def test_rows_are_a_function_of_the_seed() -> None:
    params = DropoutParams("complete", 0, 30, 0.2, 1)
    first = list(dropout_rows(params, 10, cell_seed(3, "b" * 64)))
    again = list(dropout_rows(params, 10, cell_seed(3, "b" * 64)))
    other = list(dropout_rows(params, 10, cell_seed(4, "b" * 64)))
    assert first == again  # NaN-free here: K = 30 never loses every node
    assert [r["dropped"] for r in first] != [r["dropped"] for r in other]


def test_summary_counts_rounds_and_takes_the_worst() -> None:
    config = load_config("quick")
    cells = [c for c in plan_cells(config) if c.kind == "dropout"]
    rows = [row for c in cells[:6] for row in run_cell(c)]
    summaries = summarise_dropout(rows)
    assert {s.scheme for s in summaries} == {"independent", "zerosum", "zerosum+residual"}
    for s in summaries:
        assert s.rounds == config.dropout.reps
        lo, hi = s.infeasible_interval
        assert lo <= s.infeasible_fraction <= hi
        if s.scheme == "independent":
            assert s.infeasible == 0 and s.epsilon_coalition_worst == pytest.approx(1.0)


# -- configuration --------------------------------------------------------------------------


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sim.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_cells_leave_out_combinations_without_a_design() -> None:
    sweep = DropoutSweep(
        graphs=("complete", "harary"),
        harary_degrees=(4,),
        n_nodes=(4, 10),
        rates=(0.0, 0.1),
        collusion_thresholds=(1, 3, 5),
    )
    points = {(p.graph, p.n_nodes, p.collusion_threshold) for p in sweep.cells()}
    # complete: T ≤ K − 2; harary d=4: T < 4 < K
    assert points == {
        ("complete", 4, 1),
        ("complete", 10, 1),
        ("complete", 10, 3),
        ("complete", 10, 5),
        ("harary", 10, 1),
        ("harary", 10, 3),
    }
    assert len(sweep.cells()) == 2 * len(points)
    for p in sweep.cells():
        dropout_plan(p, residual=True)  # every listed cell has a design


def test_toml_overrides_and_scenarios(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        'scenarios = ["dropout"]\n[dropout]\nn_nodes = [20]\nrates = [0, 0.05]\nreps = 7\n'
        'graphs = ["harary"]\nharary_degrees = [6]\n',
    )
    config = load_config("quick", path)
    cells = plan_cells(config)
    assert {c.kind for c in cells} == {"dropout"}
    assert {(c.params.n_nodes, c.reps) for c in cells} == {(20, 7)}  # type: ignore[union-attr]
    assert config.dropout.rates == (0.0, 0.05)
    full = load_config("full", scenarios=["dropout"])
    assert max(p.n_nodes for p in full.dropout.cells()) == 1000
    disabled = load_config("quick", _config(tmp_path, "[dropout]\nn_nodes = []\n"))
    assert not [c for c in plan_cells(disabled) if c.kind == "dropout"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[dropout]\nrates = [0.1, 1.0]\n", "dropout.rates = 1.0 must be a dropout rate in [0, 1)"),
        ('[dropout]\ngraphs = ["ring"]\n', "dropout.graphs = 'ring' is not one of"),
        ("[dropout]\nn_nodes = [1]\n", "dropout.n_nodes = 1 must be a whole number from 2"),
        ("[dropout]\nharary_degrees = []\n", "dropout.harary_degrees = [] must be a non-empty"),
        ("[dropout]\ncollusion_thresholds = [-1]\n", "dropout.collusion_thresholds = -1"),
        ("[dropout]\nreps = 0\n", "dropout.reps = 0 must be a whole number >= 1"),
        ("[dropout]\nepsilon = 0\n", "dropout.epsilon = 0.0 must be > 0"),
        ("[dropout]\nsize = 3\n", "dropout.size = 3 is not a known setting"),
        ('scenarios = ["dropouts"]\n', "scenarios = 'dropouts' is not one of"),
    ],
)
def test_bad_dropout_settings_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SimulationConfigError, match=re.escape(message)):
        load_config("quick", _config(tmp_path, text))
