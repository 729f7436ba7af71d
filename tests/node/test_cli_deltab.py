"""`zerosum deltab`, `zerosum predict` and `zerosum synth` through the real dispatcher."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import zerosum.cli
from node.deltab.io import read_table
from node.deltab.model import BrainAgeModel
from node.deltab.synthetic import Cohort, make_cohort, write_cohort_csv

_COMMANDS = {
    "deltab": ("zerosum.commands.deltab", "train a brain-age model and predict"),
    "predict": ("zerosum.commands.predict", "apply a saved brain-age model"),
    "synth": ("zerosum.commands.synth", "write a synthetic cohort"),
}


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> None:
    # The dispatcher is not under test; make sure it knows the three commands.
    for name, entry in _COMMANDS.items():
        if name not in zerosum.cli.SUBCOMMANDS:
            monkeypatch.setitem(zerosum.cli.SUBCOMMANDS, name, entry)


@pytest.fixture
def cohort() -> Cohort:
    return make_cohort(120, 15, seed=12)


@pytest.fixture
def files(tmp_path: Path, cohort: Cohort) -> dict[str, Path]:
    return {
        "cohort": write_cohort_csv(cohort, tmp_path / "cohort.csv"),
        "ages": write_cohort_csv(
            cohort, tmp_path / "ages.txt", False, include_features=False, header=False
        ),
        "features": write_cohort_csv(
            cohort, tmp_path / "features.tsv", False, include_age=False, header=False
        ),
    }


def _call(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str]:
    try:
        status = zerosum.cli.main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own usage errors
        status = int(stop.code or 0)
    err = capsys.readouterr().err
    return status, err


def _numbers(path: Path) -> np.ndarray:
    return np.array([float(line) for line in path.read_text().splitlines()])


def test_train_and_predict_from_one_csv(
    tmp_path: Path, files: dict[str, Path], cohort: Cohort, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "delta.txt"
    status, err = _call(
        capsys, "deltab", "--train-features", files["cohort"], "--feature-num", 5,
        "--predict-output", out,
    )  # fmt: skip
    assert (status, err) == (0, "")
    delta = _numbers(out)
    assert delta.shape == (120,)
    # The command is the estimator on the file's numbers, with the public default model ...
    table = read_table(files["cohort"])
    assert table.age is not None
    expected = BrainAgeModel("unbiased_quadratic", n_components=5).fit(table.features, table.age)
    np.testing.assert_allclose(delta, expected.predict_delta(table.features, table.age), atol=1e-8)
    # ... whose training delta carries no linear age trend.
    assert abs(np.corrcoef(delta, cohort.age)[0, 1]) < 1e-6


def test_headerless_tsv_with_separate_ages_gives_the_same_numbers(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    one = tmp_path / "one.txt"
    two = tmp_path / "two.txt"
    assert _call(capsys, "deltab", "--train-features", files["cohort"], "--feature-proportion",
                 0.3, "--predict-output", one)[0] == 0  # fmt: skip
    assert _call(capsys, "deltab", "--train-ages", files["ages"], "--train-features",
                 files["features"], "--feature-proportion", 0.3,
                 "--predict-output", two)[0] == 0  # fmt: skip
    np.testing.assert_allclose(_numbers(one), _numbers(two), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("case", [("age", "brain_age"), ("delta", "delta")])
def test_csv_output_has_id_age_and_prediction_columns(
    tmp_path: Path,
    files: dict[str, Path],
    cohort: Cohort,
    capsys: pytest.CaptureFixture[str],
    case: tuple[str, str],
) -> None:
    what, column = case
    out = tmp_path / "out.csv"
    status, _ = _call(
        capsys, "deltab", "--train-features", files["cohort"], "--kaiser-guttmann",
        "--predict", what, "--predict-model", "unbiased", "--predict-output", out,
    )  # fmt: skip
    assert status == 0
    header = out.read_text().splitlines()[0]
    assert header == f"id,age,{column}"
    table = read_table(out)
    assert table.ids == cohort.ids
    assert table.age is not None
    np.testing.assert_allclose(table.age, cohort.age, atol=1e-6)


@pytest.mark.parametrize("kind", ["simple", "unbiased", "unbiased_quadratic", "alternate",
                                  "alternate_quadratic"])  # fmt: skip
def test_save_load_round_trip(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    direct = tmp_path / "direct.txt"
    again = tmp_path / "again.txt"
    model = tmp_path / "model.json"
    status, err = _call(
        capsys, "deltab", "--train-features", files["cohort"], "--feature-var", 0.9,
        "--predict-model", kind, "--save", model, "--predict-output", direct,
    )  # fmt: skip
    assert (status, err) == (0, "")
    json.loads(model.read_text())  # a real JSON document
    status, err = _call(
        capsys, "deltab", "--load", model, "--predict-features", files["features"],
        "--predict-ages", files["ages"], "--predict-model", kind, "--predict-output", again,
    )  # fmt: skip
    assert (status, err) == (0, "")
    np.testing.assert_allclose(_numbers(again), _numbers(direct), rtol=1e-9, atol=1e-9)


def test_save_alone_writes_no_prediction(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    status, _ = _call(capsys, "deltab", "--train-features", files["cohort"], "--save", "m.json")
    assert status == 0
    assert (tmp_path / "m.json").exists()
    assert not (tmp_path / "deltab.txt").exists()


def test_predict_command_writes_id_age_brain_age_delta(
    tmp_path: Path, files: dict[str, Path], cohort: Cohort, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.json"
    reference = tmp_path / "ref.txt"
    assert _call(capsys, "deltab", "--train-features", files["cohort"], "--feature-num", 6,
                 "--predict-model", "unbiased", "--save", model,
                 "--predict-output", reference)[0] == 0  # fmt: skip
    out = tmp_path / "pred.tsv"
    status, err = _call(
        capsys, "predict", "--model", model, "--data", files["cohort"], "--output", out
    )
    assert (status, err) == (0, "")
    lines = out.read_text().splitlines()
    assert lines[0].split("\t") == ["id", "age", "brain_age", "delta"]
    table = read_table(out)
    assert table.ids == cohort.ids
    assert table.age is not None
    brain_age, delta = table.features[:, 0], table.features[:, 1]
    np.testing.assert_allclose(brain_age - delta, table.age, atol=1e-6)
    np.testing.assert_allclose(delta, _numbers(reference), rtol=1e-7, atol=1e-7)


def test_predict_command_kind_override_changes_the_numbers(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.json"
    assert _call(capsys, "deltab", "--train-features", files["cohort"], "--feature-num", 6,
                 "--save", model)[0] == 0  # fmt: skip
    outs = {}
    for kind in ("simple", "unbiased"):
        outs[kind] = tmp_path / f"{kind}.csv"
        status, _ = _call(capsys, "predict", "--model", model, "--data", files["cohort"],
                          "--output", outs[kind], "--model-kind", kind)  # fmt: skip
        assert status == 0
    simple, unbiased = (read_table(outs[k]).features[:, 1] for k in ("simple", "unbiased"))
    assert not np.allclose(simple, unbiased)


def test_remove_policy_drops_subjects_and_keeps_ages_aligned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cohort = make_cohort(150, 10, seed=4, missing_fraction=0.02)
    data = write_cohort_csv(cohort, tmp_path / "c.csv")
    complete = ~np.isnan(cohort.features).any(axis=1)
    out, ages = tmp_path / "d.txt", tmp_path / "a.txt"
    status, err = _call(
        capsys, "deltab", "--train-features", data, "--feature-nans", "remove",
        "--predict-output", out, "--true-ages-output", ages,
    )  # fmt: skip
    assert status == 0
    assert f"left out {int((~complete).sum())} of 150 subjects" in err
    assert _numbers(out).shape == (int(complete.sum()),)
    np.testing.assert_allclose(_numbers(ages), cohort.age[complete], atol=1e-6)
    status, err = _call(capsys, "deltab", "--train-features", data, "--predict-output",
                        tmp_path / "median.txt")  # fmt: skip
    assert status == 0
    assert _numbers(tmp_path / "median.txt").shape == (150,)


def _bad_inputs(tmp: Path, files: dict[str, Path]) -> Iterator[tuple[str, list[object], str]]:
    ragged = tmp / "ragged.csv"
    ragged.write_text("id,age,a,b\ns1,60,1,2\ns2,61,1\n")
    yield (
        "ragged",
        ["--train-features", ragged],
        r"ragged.csv: line 3 has 3 fields; the header has 4\.",
    )
    letters = tmp / "letters.csv"
    letters.write_text("age,f0001,f0002,f0003,f0004\n60,1,2,3,4\n61,1,2,3,abc\n")
    yield (
        "non-numeric",
        ["--train-features", letters],
        (r"letters.csv: line 3, column 'f0004': 'abc' is not a number\."),
    )
    short = tmp / "short.txt"
    short.write_text("\n".join(["60"] * 119) + "\n")
    yield (
        "mismatch",
        ["--train-ages", short, "--train-features", files["features"]],
        (r"short.txt has 119 subjects but .*features.tsv has 120"),
    )
    small = tmp / "small.csv"
    write_cohort_csv(make_cohort(8, 15, seed=1), small)
    yield (
        "components",
        ["--train-features", small, "--feature-num", 10],
        (
            r"--feature-num 10 asks for 10 principal components, but .*small.csv has only "
            r"8 subjects, which allow at most 7"
        ),
    )
    empty_column = tmp / "empty_column.csv"
    empty_column.write_text("age,a,b\n60,1,\n61,2,\n62,3,NA\n")
    yield "all-nan", ["--train-features", empty_column], r"column 'b' has no values"
    existing = tmp / "exists.txt"
    existing.write_text("keep me\n")
    yield (
        "exists",
        ["--train-features", files["cohort"], "--predict-output", existing],
        (r"exists.txt already exists; pass --overwrite"),
    )
    yield (
        "unreadable",
        ["--train-features", tmp / "nowhere.csv"],
        (r"cannot read .*nowhere.csv: there is no such file\."),
    )
    yield (
        "no-age",
        ["--train-features", files["features"]],
        (
            r"features.tsv has no 'age' column: it has no header row \(line 1 holds data, not "
            r"column names\); give the true ages with --train-ages or add a header"
        ),
    )
    yield "nothing", [], r"nothing to do: give --train-features"
    yield "exclusive", ["--train-features", files["cohort"], "--feature-num", 3,
                        "--feature-var", 0.5], r"not allowed with argument"  # fmt: skip
    yield (
        "bad-fraction",
        ["--train-features", files["cohort"], "--feature-proportion", 1.5],
        (r"argument --feature-proportion: must be in \(0, 1\]"),
    )
    yield (
        "load-and-train",
        ["--load", tmp / "m.json", "--train-features", files["cohort"]],
        (r"give either --load or --train-features, not both"),
    )
    yield (
        "missing-model",
        ["--load", tmp / "none.json", "--predict-features", files["cohort"]],
        (r"none.json"),
    )
    garbage = tmp / "garbage.json"
    garbage.write_text("{not json")
    yield (
        "corrupt-model",
        ["--load", garbage, "--predict-features", files["cohort"]],
        (r"garbage.json"),
    )
    yield "load-no-data", ["--load", tmp / "m.json"], r"a loaded model needs --predict-features"
    nan_age = tmp / "nan_age.csv"
    nan_age.write_text("age,a,b\n60,1,2\nNA,2,3\n62,3,1\n")
    yield "nan-age", ["--train-features", nan_age], r"nan_age.csv: line 3: the age is missing"


@pytest.mark.parametrize(
    "case",
    ["ragged", "non-numeric", "mismatch", "components", "all-nan", "exists", "unreadable",
     "no-age", "nothing", "exclusive", "bad-fraction", "load-and-train", "missing-model",
     "corrupt-model", "nan-age", "load-no-data"],
)  # fmt: skip
def test_bad_input_exits_2_with_one_sentence(
    tmp_path: Path,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    cases = {name: (argv, pattern) for name, argv, pattern in _bad_inputs(tmp_path, files)}
    argv, pattern = cases[case]
    status, err = _call(capsys, "deltab", *argv)
    assert status == 2
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("zerosum deltab: error: ")
    assert re.search(pattern, last), last
    if case == "exists":
        assert (tmp_path / "exists.txt").read_text() == "keep me\n"


def test_predict_command_bad_inputs(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.json"
    assert _call(capsys, "deltab", "--train-features", files["cohort"], "--save", model)[0] == 0
    status, err = _call(capsys, "predict", "--model", model, "--data", files["features"],
                        "--output", tmp_path / "o.csv")  # fmt: skip
    assert status == 2
    assert err.startswith("zerosum predict: error: ")
    assert "has no 'age' column" in err and "Traceback" not in err
    narrow = tmp_path / "narrow.csv"
    write_cohort_csv(make_cohort(20, 9, seed=1), narrow)
    status, err = _call(capsys, "predict", "--model", model, "--data", narrow,
                        "--output", tmp_path / "o.csv")  # fmt: skip
    assert status == 2
    assert err.startswith("zerosum predict: error: ") and "Traceback" not in err
    assert "15" in err and "9" in err


def test_help_teaches_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("deltab", "predict", "synth"):
        status, _ = _call(capsys, name, "--help")
        assert status == 0
    # --help prints to stdout; read it back per command.
    for name in ("deltab", "predict", "synth"):
        with pytest.raises(SystemExit):
            zerosum.cli.main([name, "--help"])
        out = capsys.readouterr().out
        assert "examples:" in out
        assert f"zerosum {name}" in out


def test_synth_is_reproducible_and_feeds_deltab(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for path in (a, b):
        status, err = _call(capsys, "synth", "--subjects", 60, "--features", 8, "--seed", 5,
                            "--age-range", 50, 70, "--site-offset-sd", 0.3,
                            "--output", path)  # fmt: skip
        assert (status, err) == (0, "")
    assert a.read_bytes() == b.read_bytes()
    table = read_table(a)
    assert table.n_subjects == 60 and table.n_features == 8
    assert table.age is not None and table.age.min() >= 50 and table.age.max() <= 70
    status, _ = _call(capsys, "deltab", "--train-features", a, "--predict-output",
                      tmp_path / "d.txt")  # fmt: skip
    assert status == 0
    status, err = _call(capsys, "synth", "--subjects", 5, "--features", 2, "--output", a)
    assert status == 2 and "already exists" in err
    status, err = _call(capsys, "synth", "--subjects", 5, "--features", 2, "--output",
                        tmp_path / "c.csv", "--age-range", 70, 50)  # fmt: skip
    assert status == 2 and "--age-range needs LOW < HIGH" in err


_IMPORT_PROBE = """\
import sys
before = set(sys.modules)
import zerosum.cli as cli
for name, entry in {commands!r}.items():
    cli.SUBCOMMANDS.setdefault(name, entry)
status = cli.main(sys.argv[1:])
loaded = set(sys.modules) - before
heavy = sorted(m for m in loaded if m.split(".")[0] in {{"grpc", "sklearn", "pandas"}})
print("HEAVY", heavy)
sys.exit(status)
"""


@pytest.mark.parametrize("command", ["deltab", "predict", "synth"])
def test_commands_do_not_import_grpc_sklearn_or_pandas(
    tmp_path: Path, files: dict[str, Path], command: str
) -> None:
    model = tmp_path / "m.json"
    argv = {
        "deltab": ["deltab", "--train-features", files["cohort"], "--feature-num", 4,
                   "--save", model, "--predict-output", tmp_path / "d.txt"],
        "predict": ["predict", "--model", model, "--data", files["cohort"],
                    "--output", tmp_path / "p.csv"],
        "synth": ["synth", "--subjects", 10, "--features", 3, "--output", tmp_path / "s.csv"],
    }  # fmt: skip
    probe = _IMPORT_PROBE.format(commands=_COMMANDS)
    if command == "predict":
        setup = subprocess.run(
            [sys.executable, "-c", probe, *map(str, argv["deltab"])],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert setup.returncode == 0, setup.stderr
    done = subprocess.run(
        [sys.executable, "-c", probe, *map(str, argv[command])],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout


def test_constant_feature_is_named_in_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "const.csv"
    data.write_text("age,a,b,c\n60,1,5,2\n65,2,5,1\n70,3,5,4\n75,5,5,3\n")
    status, err = _call(capsys, "deltab", "--train-features", data, "--predict-model", "unbiased",
                        "--predict-output", tmp_path / "d.txt")  # fmt: skip
    assert status == 0
    assert "zerosum deltab: warning: 1 feature(s) of" in err
    assert "left out of the model: 'b'." in err
