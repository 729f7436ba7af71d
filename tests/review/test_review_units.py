"""`zerosum review` shows every released value in real units beside the scaled value sent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from node.egress.bundle import EgressBundle
from node.egress.receipt import DPReceipt, MaskingFacts, ObserverRelease, SDCEvidence, TensorEntry
from node.review.units import real_units
from tests.support.bundles import make_bundle, review
from tests.support.made_up_federation import CODEC, SESSION, _config
from zerosum.cli import main

IDS = ["a", "b", "c"]
# The test federation's public bounds (tests/support/made_up_federation.py).
AGE = (45.0, 80.0)
FEATURE = (-4.0, 4.0)
P = 4


def _scaled(values: np.ndarray, low: float, high: float) -> np.ndarray:
    return (values - (low + high) / 2) / ((high - low) / 2)


def _deltab_bundle(ages: np.ndarray, x: np.ndarray) -> EgressBundle:
    """The sums round of the brain-age plan over (ages, x), without noise, as a bundle."""
    config = _config(IDS)
    layout = config.plan.round("sums").layout
    y = _scaled(ages, *AGE)
    s = _scaled(x, *FEATURE)
    rows, cols = np.triu_indices(P)
    tensors = {
        "n": np.array(float(len(ages))),
        "sum_x": s.sum(axis=0),
        "sum_xx": (s.T @ s)[rows, cols],
        "sum_xy": s.T @ y,
        "sum_xy2": s.T @ y**2,
        "sum_y": np.array(y.sum()),
        "sum_y2": np.array((y**2).sum()),
        "sum_y3": np.array((y**3).sum()),
        "sum_y4": np.array((y**4).sum()),
    }
    entries = tuple(
        TensorEntry(slot.name, slot.shape, slot.offset, slot.size, 1.0, 1.0, "test")
        for slot in layout
    )
    return EgressBundle(
        session_id=SESSION,
        round_index=0,
        round_name="sums",
        node_id="a",
        fixed_point_bits=32,
        tensors=entries,
        masking=MaskingFacts("pairwise", "complete", 3, 1, (0.7,), False),
        dp=DPReceipt(1e-6, (ObserverRelease("outsider", 0, 1.0, 3.0, 1e-6),), (), 1),
        sdc=SDCEvidence(len(ages)),
        payload=layout.encode(tensors, CODEC),
    )


def test_real_units_are_the_sums_of_the_values_themselves() -> None:
    rng = np.random.default_rng(11)
    ages = rng.uniform(*AGE, size=220)
    x = rng.uniform(*FEATURE, size=(220, P))
    views = {v.name: v for v in real_units(_deltab_bundle(ages, x), _config(IDS))}
    rows, cols = np.triu_indices(P)
    expected = {
        "n": [220.0],
        "sum_x": x.sum(axis=0),
        "sum_xx": (x.T @ x)[rows, cols],
        "sum_xy": x.T @ ages,
        "sum_xy2": x.T @ ages**2,
        "sum_y": [ages.sum()],
        "sum_y2": [(ages**2).sum()],
        "sum_y3": [(ages**3).sum()],
        "sum_y4": [(ages**4).sum()],
    }
    for name, want in expected.items():
        got = [row.real for row in views[name].rows]
        # Fixed point with 32 fraction bits, then sums of up to 4th powers of ~80.
        assert got == pytest.approx(list(want), rel=1e-7), name
    assert views["sum_y"].rows[0].unit == "years"
    assert views["sum_xy"].rows[2].label == "x3 × age"  # the bounds' feature names
    assert views["sum_xx"].rows[1].label == "x1 × x2"
    assert views["n"].meaning == "number of subjects, noised"
    # The scaled value sent stays beside it: the ages' sum in [-1, 1] units.
    assert views["sum_y"].rows[0].scaled == pytest.approx(_scaled(ages, *AGE).sum(), abs=1e-8)


def test_without_the_plan_the_values_are_shown_scaled_only() -> None:
    rng = np.random.default_rng(2)
    bundle = _deltab_bundle(rng.uniform(*AGE, size=120), rng.uniform(*FEATURE, size=(120, P)))
    views = real_units(bundle, None)
    assert all(row.real is None for view in views for row in view.rows)
    assert views[1].rows[0].label == "sum_x[0]"


def test_review_prints_values_clipped_counts_and_the_guarantee(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = make_bundle(tmp_path)
    assert main(review(folder)) == 0
    out = capsys.readouterr().out
    assert "released values (as sent, and in real units):" in out
    assert "n: number of subjects, noised" in out
    assert "clipped to the public bounds (audit record): total 0" in out
    assert (
        "configured guarantee ε ≤ 1 per release against an outsider holding the seeds of T = 1 "
        "colluding node(s); this release: ε = 1 against that observer, ε = 0.6889 against an "
        "outsider"
    ) in out
    assert "… 1597 more (--values, --json or --html list all)" in out
    assert main(["review", str(folder), "--values"]) == 0
    assert "sum_xx[1599]" in capsys.readouterr().out
    assert main(["review", str(folder)]) == 0
    assert "not in the bundle (the counts stay in the TRE's audit record" in (
        capsys.readouterr().out
    )
    assert main(["review", str(folder), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    values = {v["tensor"]: v for v in document["bundle"]["values"]}
    assert len(values["sum_xx"]["entries"]) == 1600


def test_results_json_says_the_values_are_scaled(tmp_path: Path) -> None:
    folder = make_bundle(tmp_path)
    results = json.loads((folder / "results.json").read_text())["results"]
    what = results["noised_values"]["comments"][0]
    assert "pre-scaled to [-1, 1], not real units" in what


def test_a_sensitivity_below_the_plans_derivation_fails() -> None:
    from node.review.checks import check_config

    rng = np.random.default_rng(4)
    bundle = _deltab_bundle(rng.uniform(*AGE, size=150), rng.uniform(*FEATURE, size=(150, P)))
    # Every tensor declares Δ = 1; with P = 4 the plan derives √P = 2 for sum_x.
    messages = [f.message for f in check_config(bundle, _config(IDS)) if f.level == "fail"]
    assert "sum_x declares sensitivity 1, below the 2 the plan derives from the public bounds" in (
        messages
    )
    assert not any(m.startswith(("n ", "sum_y ")) for m in messages)
