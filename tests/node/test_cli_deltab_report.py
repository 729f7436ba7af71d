"""`zerosum deltab` talks back: --debug, --save-text, a run summary, a degenerate-fit warning."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import zerosum.cli
from node.deltab.exceptions import DeltabWarning
from node.deltab.io import read_table
from node.deltab.model import BrainAgeModel
from node.deltab.synthetic import make_cohort, write_cohort_csv
from zerosum.commands._deltab_report import check_interpolation

MODELS = ("simple", "unbiased", "unbiased_quadratic", "alternate", "alternate_quadratic")


def _call(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    try:
        status = zerosum.cli.main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own usage errors
        status = int(stop.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def cohort_csv(tmp_path: Path) -> Path:
    return write_cohort_csv(make_cohort(120, 15, seed=12), tmp_path / "cohort.csv")


def _numbers(path: Path) -> np.ndarray:
    rows = [[float(v) for v in line.split()] for line in path.read_text().splitlines()]
    return np.array(rows, dtype=np.float64)


def _delta_from_text(folder: Path, x: np.ndarray, age: np.ndarray, kind: str) -> np.ndarray:
    """The delta computed only from the --save-text files and summary.txt's formulas."""
    summary = (folder / "summary.txt").read_text()
    scalar = {
        name: float(re.search(rf"^{name}:\s+(\S+)$", summary, re.M).group(1))  # type: ignore[union-attr]
        for name in ("age_mean", "age_scale", "agesq_orth")
    }
    skip = {"summary", "feature_names"}
    a = {f.stem: _numbers(f) for f in folder.glob("*.txt") if f.stem not in skip}
    support = a["support"].ravel().astype(int)
    z = (x[:, support] - a["feature_mean"].ravel()[support]) / a["feature_scale"].ravel()[support]
    u = (z - a["feature_adjust"][0]) @ a["components"] / a["singular_values"].ravel()
    y0 = (age - scalar["age_mean"]) / scalar["age_scale"]
    y = y0 - a["age_adjust"].ravel()[0]
    q = y0**2 - a["agesq_adjust"].ravel()[0] - scalar["agesq_orth"] * y
    b1, b2, b2sq = a["b1"].ravel(), a["b2"].ravel(), a["b2sq"].ravel()
    gamma, gammasq = a["gamma"].reshape(1, -1), a["gammasq"].reshape(2, -1)
    if kind == "simple":
        delta = u @ b1 - y
    elif kind == "unbiased":
        delta = u @ b1 - y - b2[0] * y
    elif kind == "unbiased_quadratic":
        delta = u @ b1 - y - b2sq[0] * y - b2sq[1] * q
    elif kind == "alternate":
        lam = gamma[0]
        delta = (u - np.outer(y, lam)) @ lam / (lam @ lam)
    else:
        lam = gammasq[0]
        delta = (u - np.outer(y, lam) - np.outer(q, gammasq[1])) @ lam / (lam @ lam)
    years: np.ndarray = delta * scalar["age_scale"]
    return years


def test_the_public_flags_debug_and_save_text_are_accepted(
    tmp_path: Path, cohort_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = _call(
        capsys, "deltab", "--train-features", cohort_csv, "--feature-num", 5, "--debug",
        "--save-text", tmp_path / "text", "--predict-output", tmp_path / "d.txt",
    )  # fmt: skip
    assert status == 0, err
    assert (tmp_path / "text" / "summary.txt").is_file()
    assert (
        f"debug: read {cohort_csv}: comma-separated, with a header, ids, an 'age' column, "
        "120 subjects x 15 features, 0 missing feature cells"
    ) in err
    assert "debug: model: age mean" in err


@pytest.mark.parametrize("kind", MODELS)
def test_save_text_holds_the_model_its_summary_describes(
    tmp_path: Path, cohort_csv: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    folder = tmp_path / "text"
    out = tmp_path / "d.txt"
    status, stdout, err = _call(
        capsys, "deltab", "--train-features", cohort_csv, "--feature-num", 5,
        "--predict-model", kind, "--save-text", folder, "--predict-output", out,
    )  # fmt: skip
    assert status == 0, err
    assert f"saved the model as text to {folder}/" in stdout
    table = read_table(cohort_csv)
    assert table.age is not None
    # Following summary.txt's formulas with the numbers of the folder gives the prediction.
    np.testing.assert_allclose(
        _delta_from_text(folder, table.features, table.age, kind),
        _numbers(out).ravel(),
        atol=1e-8,
    )
    summary = (folder / "summary.txt").read_text()
    assert "subjects:        120" in summary and "features:        15" in summary
    assert (folder / "feature_names.txt").read_text().splitlines() == list(table.feature_names)
    # The training data stay out of the folder.
    assert table.age[0] != 0 and f"{table.age[0]:.6f}" not in " ".join(
        p.read_text() for p in folder.glob("*.txt")
    )


def test_save_text_keeps_an_existing_model_folder_unless_overwrite(
    tmp_path: Path, cohort_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "text"
    argv = ["deltab", "--train-features", cohort_csv, "--save-text", folder]
    assert _call(capsys, *argv, "--save", tmp_path / "m1.json")[0] == 0
    before = (folder / "b1.txt").read_text()
    status, _, err = _call(capsys, *argv, "--feature-num", 3, "--save", tmp_path / "m2.json")
    assert status == 2 and "already holds a model saved as text; pass --overwrite" in err
    assert (folder / "b1.txt").read_text() == before
    assert not (tmp_path / "m2.json").exists()
    status, _, err = _call(
        capsys, *argv, "--feature-num", 3, "--save", tmp_path / "m2.json", "--overwrite"
    )
    assert status == 0, err
    assert (folder / "b1.txt").read_text() != before


def test_a_successful_run_says_what_it_did(
    tmp_path: Path, cohort_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, out = tmp_path / "m.json", tmp_path / "ba.csv"
    status, stdout, err = _call(
        capsys, "deltab", "--train-features", cohort_csv, "--feature-num", 5, "--save", model,
        "--predict", "age", "--predict-output", out,
    )  # fmt: skip
    assert (status, err) == (0, "")
    lines = stdout.splitlines()
    assert lines[0].startswith(
        f"zerosum deltab: trained the unbiased_quadratic model on 120 subjects x 15 features "
        f"of {cohort_csv}: 5 principal components, "
    )
    assert lines[0].endswith("% of the feature variance")
    assert lines[1] == f"zerosum deltab: saved the model to {model}"
    assert lines[2] == (
        f"zerosum deltab: wrote the brain age (unbiased_quadratic model) of 120 subjects of "
        f"{cohort_csv} to {out}"
    )
    status, stdout, _ = _call(
        capsys, "deltab", "--load", model, "--predict-features", cohort_csv,
        "--predict-output", tmp_path / "d.txt",
    )  # fmt: skip
    assert status == 0
    assert stdout.startswith(
        f"zerosum deltab: loaded {model}: unbiased_quadratic model trained on 120 subjects x "
        "15 features; 5 principal components"
    )


def test_debug_shows_the_traceback_of_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nowhere.csv"
    status, _, err = _call(capsys, "deltab", "--train-features", missing)
    assert status == 2 and "Traceback" not in err
    status, _, err = _call(capsys, "deltab", "--train-features", missing, "--debug")
    assert status == 2
    assert "Traceback (most recent call last)" in err and "DeltabInputError" in err
    assert err.strip().splitlines()[-1].startswith("zerosum deltab: error: cannot read")


def test_fewer_subjects_than_features_is_a_clear_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = write_cohort_csv(make_cohort(5, 20, seed=3), tmp_path / "small.csv")
    out = tmp_path / "d.txt"
    status, _, err = _call(capsys, "deltab", "--train-features", small, "--predict-output", out)
    assert status == 0
    assert np.max(np.abs(_numbers(out))) < 1e-9  # what the user got, silently, before
    [warning] = [line for line in err.splitlines() if "warning" in line]
    assert warning.startswith(f"zerosum deltab: warning: {small}: 5 subjects and 20 features: ")
    assert "4 principal components and the mean fit the 5 training ages exactly" in warning
    assert "the model is degenerate" in warning
    # A well-posed fit says nothing of the kind.
    status, _, err = _call(
        capsys, "deltab", "--train-features", write_cohort_csv(make_cohort(60, 20, seed=3),
        tmp_path / "enough.csv"), "--feature-num", 5, "--predict-output", tmp_path / "e.txt",
    )  # fmt: skip
    assert (status, err) == (0, "")


def test_the_interpolation_check_is_a_deltab_warning() -> None:
    cohort = make_cohort(30, 8, seed=5)
    model = BrainAgeModel("unbiased").fit(cohort.features, cohort.age)
    check_interpolation(model, cohort.features, cohort.age, Path("ok.csv"))  # no warning
    # A feature that is the age itself determines every training age exactly.
    leaky = np.column_stack([cohort.features, cohort.age])
    exact = BrainAgeModel("unbiased").fit(leaky, cohort.age)
    with pytest.warns(DeltabWarning, match=r"leaky.csv: the features of 30 subjects determine"):
        check_interpolation(exact, leaky, cohort.age, Path("leaky.csv"))
    few = make_cohort(6, 10, seed=5)
    tiny = BrainAgeModel("simple").fit(few.features, few.age)
    with pytest.warns(DeltabWarning, match=r"6 subjects and 10 features: the model's 5"):
        check_interpolation(tiny, few.features, few.age, Path("few.csv"))
