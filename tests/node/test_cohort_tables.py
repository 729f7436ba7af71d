"""A node's cohort file: spreadsheet layouts and duplicate ids are refused with the reason."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from node.plans.deltab.cohort import LocalDataError, load_cohort
from proto.federation import FederationConfig, load_federation
from zerosum.commands import federation as federation_command


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> tuple[FederationConfig, list[str]]:
    out = tmp_path_factory.mktemp("fed")
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    argv = ["init", "--nodes", "a,b", "--out", str(out), "--synthetic", "--seed", "1",
            "--n-features", "5", "--n-components", "2", "--cohort-sizes", "120,130",
            "--coordinator", "127.0.0.1:9"]  # fmt: skip
    assert federation_command.run(parser.parse_args(argv)) == 0
    rows = (out / "nodes" / "a" / "data.csv").read_text().splitlines()
    return load_federation(out / "federation.toml"), rows


def _load(tmp_path: Path, config: FederationConfig, rows: list[str]) -> None:
    data = tmp_path / "data.csv"
    data.write_text("\n".join(rows) + "\n")
    load_cohort(data, config)


def test_a_semicolon_separated_cohort_is_named_as_such(
    tmp_path: Path, fed: tuple[FederationConfig, list[str]]
) -> None:
    config, rows = fed
    with pytest.raises(LocalDataError, match=r"data.csv looks semicolon-separated"):
        _load(tmp_path, config, [r.replace(",", ";") for r in rows])


def test_a_cohort_without_header_row_says_so(
    tmp_path: Path, fed: tuple[FederationConfig, list[str]]
) -> None:
    config, rows = fed
    with pytest.raises(
        LocalDataError,
        match=r"data.csv has no 'age' column: it has no header row \(line 1 holds data, not "
        r"column names\); a node's data needs a header with an 'age' column\.",
    ):
        _load(tmp_path, config, rows[1:])


def test_a_subject_listed_twice_is_refused(
    tmp_path: Path, fed: tuple[FederationConfig, list[str]]
) -> None:
    config, rows = fed
    twice = [*rows, rows[3]]
    subject = rows[3].split(",")[0]
    with pytest.raises(
        LocalDataError,
        match=rf"the subject id '{subject}' appears twice \(lines 4 and {len(twice)}\)",
    ):
        _load(tmp_path, config, twice)
