"""Bounds that fit the data, checked before anything leaves (issue 20, Why 1 and 6).

Cohorts in real units (tests.node.real_cohorts) against a federation made by
``zerosum federation init``: without bounds init refuses; bounds are stored
with their feature names and every node checks its header against them; the
node's pre-flight (``zerosum node --check``, and every start before joining)
reports subjects read and used and the share clipped per feature, and refuses
bounds that clip a feature for more than the threshold — before it opens any
connection — and cohorts the missing-value policy leaves too small.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.plans.deltab.settings import DeltabSettings
from node.session.context import NodeOptions
from proto.federation import load_federation
from tests.node.real_cohorts import MEASURES, NAMES, VOLUMES, real_federation
from zerosum.cli import main
from zerosum.commands import federation as federation_command
from zerosum.commands import node as node_command


def _zerosum(*argv: object) -> tuple[int, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main([str(a) for a in argv])
    return code, printed.getvalue()


def _check(fed: Path, node: str = "a") -> tuple[int, str]:
    return _zerosum("node", "--federation", fed, "--node-id", node, "--check")


@contextlib.contextmanager
def _trap() -> Iterator[socket.socket]:
    """A listening socket standing in for the coordinator: nothing may connect to it."""
    trap = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.setblocking(False)
        yield trap
    finally:
        trap.close()


def _connected(trap: socket.socket) -> bool:
    try:
        conn, _ = trap.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def _rewrite(path: Path, order: list[str], rename: dict[str, str] | None = None) -> None:
    rows = [line.split(",") for line in path.read_text().splitlines()]
    index = [rows[0].index(name) for name in order]
    out = [[row[j] for j in index] for row in rows]
    out[0] = [(rename or {}).get(name, name) for name in out[0]]
    path.write_text("".join(",".join(row) + "\n" for row in out))


# ----------------------------------------------------------------- federation init


def test_init_refuses_a_real_cohort_without_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    out = tmp_path / "fed"
    code = federation_command.run(parser.parse_args(["init", "--nodes", "a,b", "--out", str(out)]))
    assert code == 2
    err = capsys.readouterr().err
    assert "a real cohort needs public bounds that fit its data" in err
    assert "--feature-bounds" in err and "--feature-range" in err and err.count("\n") == 1
    argv = ["init", "--nodes", "a,b", "--out", str(out), "--feature-range=-10,10"]
    assert federation_command.run(parser.parse_args(argv)) == 2
    assert "--feature-range needs --feature-names" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--feature-names", "x,y,x"], "--feature-names names 'x' more than once"),
        (["--feature-names", "x,,y"], "has an empty name"),
        (["--feature-names", "x,age"], "'age', which is the cohort's age column"),
        (["--feature-names", "x,y", "--n-features", "3"], "lists 2 features for --n-features 3"),
        (["--feature-names", "x,y", "--max-clipped-fraction", "1.5"], "must be a fraction"),
    ],
)
def test_bad_feature_names_are_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    out = tmp_path / "fed"
    argv = ["init", "--nodes", "a,b", "--out", str(out), "--feature-range=-1,1"]
    assert federation_command.run(parser.parse_args([*argv, "--n-components", "1", *extra])) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_bounds_are_stored_with_their_feature_names(tmp_path: Path) -> None:
    fed = real_federation(tmp_path / "fed", fitted=True)
    config = load_federation(fed / "federation.toml")
    clipping = DeltabSettings.from_tables(config.plan.settings).clipping
    assert clipping.feature_names == NAMES
    assert clipping.feature_high[NAMES.index("total_grey_mm3")] == 600000.0 + 8 * 40000.0
    assert clipping.max_clipped_fraction == 0.05
    text = (fed / "federation.toml").read_text()
    assert 'feature_names = ["lh_hippocampus_mm3", "rh_hippocampus_mm3", ' in text
    assert "max_clipped_fraction = 0.05" in text
    # Bounds given in code by position only cannot make a config.
    assert DeltabSettings.from_tables(config.plan.settings).n_features == len(MEASURES)


def test_a_config_whose_bounds_name_no_features_is_refused_with_a_sentence(
    tmp_path: Path,
) -> None:
    fed = real_federation(tmp_path / "fed", fitted=True)
    toml = fed / "federation.toml"
    lines = toml.read_text().splitlines(keepends=True)
    toml.write_text("".join(line for line in lines if not line.startswith("feature_names = ")))
    code, printed = _check(fed)
    assert code == 2
    assert "plan.clipping.feature_names" in printed and "is required" in printed
    assert "written before bounds were tied to feature names" in printed


# ----------------------------------------------------------------- the header


@pytest.mark.parametrize(
    ("change", "words"),
    [
        # Two measures swapped: bounds in the config's order would apply to the wrong ones.
        (
            lambda names: (
                ["id", "age", NAMES[1], NAMES[0], *NAMES[2:]],
                {},
            ),
            [
                "has the declared features in another order",
                "'rh_hippocampus_mm3' is feature column 1 but its bounds are for column 2",
            ],
        ),
        (
            lambda names: (["id", "age", *NAMES[:-1]], {}),
            ["lacks 'wm_hypointensities_mm3'", "the file has 5 feature columns"],
        ),
        (
            lambda names: (["id", "age", *NAMES], {"total_grey_mm3": "total_gray_mm3"}),
            [
                "lacks 'total_grey_mm3'",
                "has 'total_gray_mm3', which the federation's bounds do not name",
            ],
        ),
    ],
    ids=["order", "missing", "extra"],
)
def test_a_header_other_than_the_bounds_names_is_refused_naming_the_columns(
    tmp_path: Path, change: object, words: list[str]
) -> None:
    fed = real_federation(tmp_path / "fed", fitted=True)
    order, rename = change(NAMES)  # type: ignore[operator]
    _rewrite(fed / "nodes" / "a" / "data.csv", order, rename)
    code, printed = _check(fed)
    assert code == 2, printed
    for word in words:
        assert word in printed, printed


# ----------------------------------------------------------------- the pre-flight


def test_real_units_against_unfitted_bounds_are_refused_before_joining(tmp_path: Path) -> None:
    """The old default −10..10 on volumes in mm³: refused, naming each feature, no contact."""
    fed = real_federation(tmp_path / "fed", fitted=False)
    with _trap() as trap:
        address = f"127.0.0.1:{trap.getsockname()[1]}"
        code, printed = _zerosum(
            "node", "--federation", fed, "--node-id", "a", "--out", tmp_path / "out",
            "--coordinator", address,
        )  # fmt: skip
        assert code == 2, printed
        assert not _connected(trap), "the node contacted the coordinator before refusing"
    refusals = [line for line in printed.splitlines() if "refused:" in line]
    assert len(refusals) == len(VOLUMES), printed
    for name, line in zip(VOLUMES, refusals, strict=True):
        assert f"'{name}' is clipped for 100.0% of the 120 subjects used" in line
        assert "more than plan.clipping.max_clipped_fraction = 0.05" in line
    # Millimetres fit −10..10, and age fits the default 18..100: the other two columns.
    assert "the other 2 columns: 0 % clipped" in printed
    assert not any("mean_thickness_mm" in line for line in refusals)
    assert "120 subjects read, 120 used" in printed
    assert not (tmp_path / "out").exists()  # nothing written, no session key
    code, checked = _check(fed)
    assert code == 2 and checked.count("refused:") == len(VOLUMES)


def test_fitted_bounds_pass_the_check_listing_every_feature(tmp_path: Path) -> None:
    fed = real_federation(tmp_path / "fed", fitted=True)
    code, printed = _check(fed, "b")
    assert code == 0, printed
    assert "130 subjects read, 130 used" in printed
    for name in ("age", *NAMES):
        assert f"  {name}: 0.0% clipped" in printed
    assert "pre-flight passed" in printed


def test_the_threshold_is_the_configs(tmp_path: Path) -> None:
    """Bounds clipping about half of one feature: refused at 5 %, accepted at 60 %."""
    name, typical, _ = MEASURES[0]
    for threshold, expected in (("0.05", 2), ("0.6", 0)):
        fed = real_federation(
            tmp_path / f"fed-{threshold}",
            fitted=True,
            extra=["--max-clipped-fraction", threshold],
        )
        bounds = tmp_path / f"fed-{threshold}-bounds.csv"
        text = bounds.read_text().replace(
            next(line for line in bounds.read_text().splitlines() if line.startswith(name)),
            f"{name},{typical - 5000.0!r},{typical!r}",
        )
        bounds.write_text(text)
        parser = argparse.ArgumentParser()
        federation_command.add_arguments(parser)
        argv = [
            "init", "--nodes", "a,b", "--out", str(fed), "--force", "--feature-bounds",
            str(bounds), "--n-components", "3", "--max-clipped-fraction", threshold,
        ]  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()):
            assert federation_command.run(parser.parse_args(argv)) == 0
        code, printed = _check(fed)
        assert code == expected, printed
        assert f"  {name}: " in printed and "% clipped (0 below" in printed


def test_subjects_left_out_for_missing_values_are_reported_and_counted(tmp_path: Path) -> None:
    """Why 6: N read and N used at start; too few used is refused in one sentence."""
    fed = real_federation(tmp_path / "fed", fitted=True, sizes=(150, 130))
    data = fed / "nodes" / "a" / "data.csv"
    original = data.read_text().splitlines()

    def blank(rows: int) -> None:
        lines = list(original)
        for k in range(1, rows + 1):
            cells = lines[k].split(",")
            cells[2 + k % len(NAMES)] = ""
            lines[k] = ",".join(cells)
        data.write_text("\n".join(lines) + "\n")

    blank(35)
    code, printed = _check(fed)
    assert code == 0, printed
    assert "150 subjects read, 115 used (nan_policy 'drop' leaves out subjects with a" in printed
    blank(60)
    code, printed = _check(fed)
    assert code == 2, printed
    assert (
        "only 90 of the 150 subjects read are left after the missing-value policy "
        "(plan.model.nan_policy = 'drop'); the federation requires at least 100 per node"
    ) in printed


# ----------------------------------------------------------------- safe by default


def test_the_node_waits_for_a_checker_unless_told_otherwise() -> None:
    """Why 3: --approve manual is the default of the command and of the runner's options."""
    parser = argparse.ArgumentParser()
    node_command.add_arguments(parser)
    args = parser.parse_args(["--federation", "f", "--node-id", "a"])
    assert args.approve == "manual"
    assert NodeOptions().approve == "manual"
    assert parser.parse_args(["--federation", "f", "--node-id", "a", "--approve", "auto"]).approve
