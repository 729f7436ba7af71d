"""`zerosum node` refuses bad local input with one sentence and exit 2, before any contact."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import pytest

from node.plans.deltab.cohort import LocalDataError, load_cohort
from proto.federation import load_federation
from zerosum.commands import federation as federation_command
from zerosum.commands import node as node_command


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fed")
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    args = parser.parse_args(
        [
            "init",
            "--nodes",
            "a,b",
            "--out",
            str(out),
            "--synthetic",
            "--seed",
            "1",
            "--force",
            "--n-features",
            "5",
            "--n-components",
            "2",
            "--cohort-sizes",
            "120,130",
            # Nothing listens here: the node must stop before it tries to connect.
            "--coordinator",
            "127.0.0.1:9",
        ]
    )
    assert federation_command.run(args) == 0
    return out


def _run(fed: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    parser = argparse.ArgumentParser()
    node_command.add_arguments(parser)
    args = parser.parse_args(
        ["--federation", str(fed), "--node-id", "a", "--data", str(data), "--out", str(fed / "o")]
    )
    started = time.monotonic()
    code = node_command.run(args)
    return code, capsys.readouterr().err.strip(), time.monotonic() - started


def _lines(fed: Path) -> list[str]:
    return (fed / "nodes" / "a" / "data.csv").read_text().splitlines()


def test_valid_cohort_loads(fed: Path) -> None:
    config = load_federation(fed / "federation.toml")
    cohort = load_cohort(fed / "nodes" / "a" / "data.csv", config)
    assert cohort.n_subjects == 120
    assert cohort.ids[0] == "site1-000001"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda rows: [rows[0], rows[1].replace(rows[1].split(",")[1], "", 1), *rows[2:]],
            "line 2 has no age",
        ),
        (lambda rows: [*rows[:5], rows[5] + ",1.0", *rows[6:]], "line 6 has 8 fields"),
        (lambda rows: rows[:50], "has 49 subjects; the federation requires at least 100"),
        (lambda rows: [",".join(r.split(",")[:-1]) for r in rows], "has 4 feature columns"),
    ],
    ids=["missing-age", "ragged", "too-few", "wrong-width"],
)
def test_bad_data_exits_2_with_one_sentence(
    fed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: object, message: str
) -> None:
    data = tmp_path / "data.csv"
    data.write_text("\n".join(edit(_lines(fed))) + "\n")  # type: ignore[operator]
    code, err, seconds = _run(fed, data, capsys)
    assert code == 2
    assert message in err
    assert err.count("\n") == 0
    assert seconds < 5.0
    assert not (fed / "o" / "ledger.json").exists()


def test_missing_data_file_exits_2(
    fed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err, _ = _run(fed, tmp_path / "nowhere.csv", capsys)
    assert code == 2
    assert "does not exist" in err


def test_nan_features_are_allowed_but_an_empty_feature_is_not(fed: Path, tmp_path: Path) -> None:
    config = load_federation(fed / "federation.toml")
    rows = _lines(fed)
    with_gap = [rows[0], *[r.rsplit(",", 1)[0] + "," for r in rows[1:3]], *rows[3:]]
    data = tmp_path / "gap.csv"
    data.write_text("\n".join(with_gap) + "\n")
    assert load_cohort(data, config).n_subjects == 120
    empty = [rows[0], *[r.rsplit(",", 1)[0] + "," for r in rows[1:]]]
    data.write_text("\n".join(empty) + "\n")
    with pytest.raises(LocalDataError, match="feature 'f0005' has no observed value"):
        load_cohort(data, config)


def test_a_node_drawing_other_streams_than_the_federation_exits_2(
    fed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A copy of the federation whose pinned reference stream is not this
    # installation's: as if it had been made where numpy draws differently.
    copy = tmp_path / "fed"
    shutil.copytree(fed, copy)
    text = (copy / "federation.toml").read_text()
    pinned = load_federation(fed / "federation.toml").stream_check
    assert pinned is not None and pinned in text
    (copy / "federation.toml").write_text(text.replace(pinned, "0" * 64))
    code, err, seconds = _run(copy, copy / "nodes" / "a" / "data.csv", capsys)
    assert code == 2
    assert "stream_check" in err and "would not cancel" in err and "numpy " in err
    assert seconds < 10


def test_help_teaches_the_state_folder(capsys: pytest.CaptureFixture[str]) -> None:
    from zerosum import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["node", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--state DIR" in text
    assert "default: the federation folder's nodes/<id>/state" in text
    assert "STATE/ledger.json is the node's one privacy ledger across all its sessions" in text
    assert "a coordinator that reuses one is replaying that session" in text
    assert "OUT/ledger.json is a copy of the ledger" in text


def test_the_state_folder_must_not_be_the_output_folder(
    fed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = fed / "same"
    parser = argparse.ArgumentParser()
    node_command.add_arguments(parser)
    args = ["--federation", str(fed), "--node-id", "a", "--out", str(same), "--state", str(same)]
    assert node_command.run(parser.parse_args(args)) == 2
    assert "the state folder and the output folder are both" in capsys.readouterr().err
