"""Prediction that says when it extrapolates (issue 20, Why 2).

A federated model is fitted on values clipped to the public bounds. Its file
carries them; the node's own predictions.csv and ``zerosum predict`` clip a
subject's features to them, as the fit did, and say how many subjects and
which features were affected — or, with ``--out-of-range refuse``, stop.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest

from node.deltab.persist import load_model, training_bounds_of
from node.plans.deltab.cohort import load_cohort
from node.plans.deltab.plan import DeltabPlan
from node.plans.deltab.settings import DeltabSettings
from proto.federation import load_federation
from tests.node.real_cohorts import NAMES, real_federation
from zerosum.cli import main

GREY = NAMES.index("total_grey_mm3")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DeltabPlan, Path]:
    """Node a's plan over its real-unit cohort, one subject's grey matter ×10; its outputs."""
    folder = tmp_path_factory.mktemp("predict")
    fed = real_federation(folder / "fed", fitted=True)
    config = load_federation(fed / "federation.toml")
    cohort = load_cohort(fed / "nodes" / "a" / "data.csv", config)
    features = cohort.features.copy()
    features[7, GREY] *= 10.0
    cohort = dataclasses.replace(cohort, features=features)
    plan = DeltabPlan(config, cohort)
    assert plan.preflight().passed  # one subject of 120 is under the 5 % threshold
    plan.receive("sums", plan.tensors("sums"))  # this node's sums stand for the aggregate
    out = folder / "out"
    out.mkdir()
    plan.write_outputs(out)
    return fed, plan, out


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))


def test_the_model_file_carries_the_training_bounds(
    fitted: tuple[Path, DeltabPlan, Path],
) -> None:
    fed, _, out = fitted
    clipping = DeltabSettings.from_tables(load_federation(fed / "federation.toml").plan.settings)
    bounds = training_bounds_of(load_model(out / "model.json"))
    assert bounds is not None
    assert tuple(bounds[0]) == clipping.clipping.feature_low
    assert tuple(bounds[1]) == clipping.clipping.feature_high
    document = json.loads((out / "model.json").read_text())
    assert document["feature_names"] == list(NAMES)
    assert len(document["training_bounds"]["feature_high"]) == len(NAMES)


def test_the_nodes_predictions_clip_to_the_bounds_and_say_so(
    fitted: tuple[Path, DeltabPlan, Path],
) -> None:
    _, plan, out = fitted
    assert plan.prediction_note is not None
    assert plan.prediction_note.startswith("1 of 120 subjects of ")
    assert "(1 feature, values outside: total_grey_mm3 1)" in plan.prediction_note
    model = load_model(out / "model.json")
    features = plan.cohort.features.copy()
    high = training_bounds_of(model)
    assert high is not None
    raw = float(model.predict_delta(features[7:8], plan.cohort.age[7:8])[0])
    features[7, GREY] = high[1][GREY]
    clipped = float(model.predict_delta(features[7:8], plan.cohort.age[7:8])[0])
    written = float(_rows(out / "predictions.csv")[7]["delta"])
    assert written == pytest.approx(clipped, abs=1e-9)
    # Unclipped, the one value ten times too large moves delta far away.
    assert abs(raw - clipped) > 10.0


def _predict(*argv: object) -> tuple[int, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(["predict", *(str(a) for a in argv)])
    return code, printed.getvalue()


def test_zerosum_predict_clips_by_default_and_refuses_when_asked(
    fitted: tuple[Path, DeltabPlan, Path], tmp_path: Path
) -> None:
    fed, _, out = fitted
    table = fed / "nodes" / "a" / "data.csv"
    lines = table.read_text().splitlines()
    cells = lines[8].split(",")  # subject 7: header, then rows
    column = 2 + GREY
    cells[column] = repr(float(cells[column]) * 10.0)
    lines[8] = ",".join(cells)
    new = tmp_path / "new.csv"
    new.write_text("\n".join(lines) + "\n")

    code, printed = _predict("--model", out / "model.json", "--data", new, "--output",
                             tmp_path / "p.csv")  # fmt: skip
    assert code == 0, printed
    assert (
        f"zerosum predict: note: 1 of 120 subjects of {new} have values outside the model's "
        "training bounds (1 feature, values outside: total_grey_mm3 1); they were clipped"
    ) in printed
    got = _rows(tmp_path / "p.csv")
    want = _rows(out / "predictions.csv")
    assert float(got[7]["delta"]) == pytest.approx(float(want[7]["delta"]), abs=1e-6)

    code, printed = _predict("--model", out / "model.json", "--data", new, "--output",
                             tmp_path / "q.csv", "--out-of-range", "refuse")  # fmt: skip
    assert code == 2
    assert "total_grey_mm3 1" in printed and "refused (--out-of-range refuse)" in printed
    assert not (tmp_path / "q.csv").exists()

    # Within the bounds nothing is said and nothing changes.
    code, printed = _predict("--model", out / "model.json", "--data", table, "--output",
                             tmp_path / "r.csv", "--out-of-range", "refuse")  # fmt: skip
    assert code == 0 and "note" not in printed, printed
    assert np.isfinite([float(r["delta"]) for r in _rows(tmp_path / "r.csv")]).all()

    # deltab --load predicts within the bounds too, and says so.
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(["deltab", "--load", str(out / "model.json"), "--predict-features", str(new),
                     "--predict-output", str(tmp_path / "d.txt")])  # fmt: skip
    assert code == 0, printed.getvalue()
    assert "1 of 120 subjects" in printed.getvalue() and "total_grey_mm3 1" in printed.getvalue()
    loaded = [float(v) for v in (tmp_path / "d.txt").read_text().split()]
    assert loaded[7] == pytest.approx(float(want[7]["delta"]), abs=1e-6)
