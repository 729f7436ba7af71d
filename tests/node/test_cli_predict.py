"""`zerosum predict` (and `deltab --load`) match a table's columns to the model by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import zerosum.cli
from node.deltab.io import read_table
from node.deltab.synthetic import make_cohort, write_cohort_csv


def _call(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    try:
        status = zerosum.cli.main([str(a) for a in argv])
    except SystemExit as stop:
        status = int(stop.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _columns(path: Path, order: list[str], rename: dict[str, str] | None = None) -> Path:
    """A copy of the CSV at ``path`` with its columns in ``order`` (and some renamed)."""
    rows = [line.split(",") for line in path.read_text().splitlines()]
    index = [rows[0].index(name) for name in order]
    out = [[row[j] for j in index] for row in rows]
    out[0] = [(rename or {}).get(name, name) for name in out[0]]
    target = path.with_name(f"{path.stem}-{len(list(path.parent.iterdir()))}.csv")
    target.write_text("".join(",".join(row) + "\n" for row in out))
    return target


@pytest.fixture
def trained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    data = write_cohort_csv(make_cohort(150, 6, seed=8), tmp_path / "train.csv")
    model = tmp_path / "model.json"
    status, _, err = _call(capsys, "deltab", "--train-features", data, "--feature-num", 4,
                           "--save", model)  # fmt: skip
    assert status == 0, err
    return data, model


def _predict(capsys: pytest.CaptureFixture[str], model: Path, data: Path) -> tuple[int, str, Path]:
    out = data.with_suffix(".out.csv")
    status, _, err = _call(capsys, "predict", "--model", model, "--data", data, "--output", out)
    return status, err, out


def test_columns_in_another_order_are_matched_by_name_with_a_note(
    trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data, model = trained
    status, err, reference = _predict(capsys, model, data)
    assert (status, err) == (0, "")
    names = read_table(data).feature_names
    shuffled = _columns(data, ["f0003", "id", *reversed(names[3:]), "age", *names[:2]])
    status, err, out = _predict(capsys, model, shuffled)
    assert status == 0
    assert err == (
        f"zerosum predict: note: the feature columns of {shuffled} are in another order than "
        "the model's; they were matched to the model by name.\n"
    )
    np.testing.assert_array_equal(read_table(out).features, read_table(reference).features)
    # deltab --load does the same.
    first, second = data.with_suffix(".a.txt"), data.with_suffix(".b.txt")
    for table, target in ((data, first), (shuffled, second)):
        status, _, err = _call(capsys, "deltab", "--load", model, "--predict-features", table,
                               "--predict-output", target)  # fmt: skip
        assert status == 0, err
    assert "were matched to the model by name" in err
    assert first.read_text() == second.read_text()


def test_other_columns_are_refused_by_name(
    trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data, model = trained
    names = list(read_table(data).feature_names)
    renamed = _columns(data, ["id", "age", *names], rename={"f0002": "thickness"})
    status, err, out = _predict(capsys, model, renamed)
    assert status == 2 and not out.exists()
    assert err == (
        f"zerosum predict: error: {renamed} does not have the feature columns the model was "
        "trained on: missing 'f0002'; unexpected 'thickness' (the model has 6 features, the "
        "file 6); give the model's features, named as in its training table.\n"
    )
    fewer = _columns(data, ["id", "age", *names[:-1]])
    status, err, _ = _predict(capsys, model, fewer)
    assert status == 2 and "missing 'f0006' (the model has 6 features, the file 5)" in err


def test_a_model_file_without_names_matches_columns_by_position(
    trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data, model = trained
    document = json.loads(model.read_text())
    del document["feature_names"]  # as every model file written before names were saved
    old = model.with_name("old.json")
    old.write_text(json.dumps(document))
    names = list(read_table(data).feature_names)
    status, err, out = _predict(capsys, old, _columns(data, ["id", "age", *names]))
    assert (status, err) == (0, "")
    status, err, reference = _predict(capsys, model, data)
    assert status == 0
    np.testing.assert_array_equal(read_table(out).features, read_table(reference).features)
    status, err, _ = _predict(capsys, old, _columns(data, ["id", "age", *names[:-1]]))
    assert status == 2 and "has 5 feature columns but the model was trained on 6" in err


def test_predict_says_what_it_wrote(
    trained: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data, model = trained
    out = data.with_suffix(".pred.csv")
    status, stdout, _ = _call(capsys, "predict", "--model", model, "--data", data, "--output", out)
    assert status == 0
    assert stdout == (
        f"zerosum predict: wrote brain_age and delta (unbiased_quadratic model) of 150 "
        f"subjects of {data} to {out}\n"
    )
