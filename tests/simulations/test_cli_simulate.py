"""`zerosum simulate` end to end on a tiny sweep, through the CLI dispatcher."""

from __future__ import annotations

from pathlib import Path

import pytest

import zerosum.cli
from zerosum.cli import main

ENTRY = ("zerosum.commands.simulate", "simulate correlated vs independent noise")


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(zerosum.cli.SUBCOMMANDS, "simulate", ENTRY)
    # The command pins BLAS to one thread with os.environ.setdefault; keep that local.
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")


def test_tiny_sweep_writes_tables_figures_and_report(
    tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim"
    assert main(["simulate", "--config", str(tiny_config), "--out", str(out), "--jobs", "1"]) == 0
    captured = capsys.readouterr()
    assert "cells (" in captured.out and "report.md" in captured.out
    assert "simulate: " in captured.err and " cells | elapsed " in captured.err
    for name in ("results.csv", "attacks.csv", "reconstruction.csv", "overtheair.csv"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Headline checks" in report
    assert "| zerosum MAE within 2% of none | yes |" in report
    assert "never above the DP bound (beyond sampling error) | yes |" in report
    for figure in (
        "headline",
        "utility_vs_epsilon",
        "utility_vs_n_nodes",
        "privacy_vs_coalition",
        "tradeoff",
        "attack_vs_bound",
    ):
        path = out / "figures" / f"{figure}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"figures/{figure}.png" in report
    # A second run resumes every cell.
    assert (
        main(
            ["simulate", "--config", str(tiny_config), "--out", str(out), "--no-report", "--quiet"]
        )
        == 0
    )
    assert "(0 run, " in capsys.readouterr().out


def test_bad_settings_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[base]\nepsilon = 0\n", encoding="utf-8")
    assert main(["simulate", "--config", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "base.epsilon = 0.0 must be > 0" in capsys.readouterr().err
    assert main(["simulate", "--out", str(tmp_path / "x"), "--jobs", "0"]) == 2
    assert "--jobs must be at least 1; got 0" in capsys.readouterr().err


def test_the_quick_dropout_scenario_runs_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "drop"
    assert main(["simulate", "--scenario", "dropout", "--out", str(out), "--jobs", "1"]) == 0
    assert "24 cells (24 run, 0 resumed)" in capsys.readouterr().out
    assert not (out / "results.csv").exists()
    header, *rows = (out / "dropout.csv").read_text(encoding="utf-8").splitlines()
    assert header.startswith("scheme,graph,harary_degree,n_nodes,dropout_rate,")
    assert len(rows) == 24 * 50 * 3  # cells × rounds × schemes
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Dropouts at scale" in report and "Scenarios: dropout." in report
    assert "![dropouts](figures/dropout.png)" in report
    assert "## Headline checks" not in report
    assert (out / "figures" / "dropout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Resumed as the other scenarios are.
    assert main(["simulate", "--scenario", "dropout", "--out", str(out), "--quiet"]) == 0
    assert "(0 run, 24 resumed)" in capsys.readouterr().out


@pytest.mark.integration  # a local Dask cluster on 127.0.0.1
def test_dask_local_gives_the_local_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip(
        "distributed", reason="dask.distributed is not installed (pip install 'zerosum[cluster]')"
    )
    config = tmp_path / "drop.toml"
    config.write_text(
        'scenarios = ["dropout"]\n[dropout]\nn_nodes = [12]\nreps = 10\n', encoding="utf-8"
    )
    common = ["simulate", "--config", str(config), "--quiet"]
    assert main([*common, "--out", str(tmp_path / "local"), "--jobs", "1", "--no-report"]) == 0
    assert main([*common, "--out", str(tmp_path / "dask"), "--dask-local", "2"]) == 0
    assert "local Dask cluster of 2 worker processes" in (
        (tmp_path / "dask" / "report.md").read_text(encoding="utf-8")
    )
    capsys.readouterr()
    local = (tmp_path / "local" / "dropout.csv").read_bytes()
    assert local and (tmp_path / "dask" / "dropout.csv").read_bytes() == local


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--jobs", "2", "--dask-local", "2"], "--jobs sets local processes"),
        (["--dask-local", "0"], "--dask-local must be at least 1 worker; got 0"),
        (["--scheduler", "localhost"], "--scheduler: scheduler must be an address such as"),
        (["--scenario", "dropouts"], "scenarios = 'dropouts' is not one of"),
    ],
)
def test_bad_engine_settings_are_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["simulate", "--out", str(tmp_path / "x"), *extra]) == 2
    assert message in capsys.readouterr().err
