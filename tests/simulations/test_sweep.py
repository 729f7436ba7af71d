"""Sweeps are deterministic, resumable after deletion or a hard kill, and report progress."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulations.config import load_config
from simulations.sweep import TABLES, Progress, plan_cells, run_sweep
from tests.support.sweeps import write_tiny_config

REQUIRED_COLUMNS = (
    "scheme,construction,n_nodes,epsilon,delta,n_per_node,n_features,rep,mae_years,delta_corr,"
    "param_rel_error,aggregate_noise_var,egress_epsilon_outsider,egress_epsilon_coordinator,"
    "egress_epsilon_coalition"
)


def _tables(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in TABLES.values()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """One uninterrupted in-process run of the tiny sweep."""
    folder = tmp_path_factory.mktemp("reference")
    config = load_config("quick", write_tiny_config(folder))
    outcome = run_sweep(config, folder / "out")
    assert len(outcome.ran) == len(outcome.cells) and not outcome.resumed
    return folder / "tiny.toml", _tables(folder / "out")


def test_results_have_the_documented_columns_and_seeds(
    reference: tuple[Path, dict[str, bytes]],
) -> None:
    results = reference[1]["results.csv"].decode()
    header, *lines = results.splitlines()
    assert header.startswith(REQUIRED_COLUMNS)
    assert "seed" in header.split(",") and "cell" in header.split(",")
    config = load_config("quick", reference[0])
    per_rep = 7  # variants: none, independent, 2 × zerosum, 2 × zerosum+residual, seed_fedavg
    assert len(lines) == len(config.utility_cells()) * config.reps * per_rep


def test_deleted_cells_rerun_and_nothing_else(
    tmp_path: Path, reference: tuple[Path, dict[str, bytes]]
) -> None:
    config = load_config("quick", reference[0])
    out = tmp_path / "out"
    run_sweep(config, out)
    cells = sorted((out / "cells").glob("*.csv"))
    assert len(cells) == len(plan_cells(config))
    removed = {cells[1].name, cells[-1].name}
    for name in removed:
        (out / "cells" / name).unlink()
    (out / "results.csv").unlink()
    again = run_sweep(config, out)
    assert set(again.ran) == removed
    assert len(again.resumed) == len(cells) - len(removed)
    assert _tables(out) == reference[1]


def test_a_killed_sweep_resumes_to_the_uninterrupted_result(
    tmp_path: Path, reference: tuple[Path, dict[str, bytes]]
) -> None:
    config_path = write_tiny_config(tmp_path)
    config = load_config("quick", config_path)
    out = tmp_path / "out"
    script = (
        "import sys; from zerosum.cli import SUBCOMMANDS, main; "
        "SUBCOMMANDS.setdefault('simulate', ('zerosum.commands.simulate', 'simulate')); "
        "sys.exit(main(sys.argv[1:]))"
    )
    command = [sys.executable, "-c", script, "simulate", "--config", str(config_path)]
    command += ["--out", str(out), "--jobs", "1", "--no-report", "--quiet"]
    process = subprocess.Popen(
        command,
        cwd=Path(__file__).resolve().parents[2],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    cells_dir = out / "cells"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if cells_dir.exists() and any(cells_dir.glob("*.csv")):
                break
            time.sleep(0.01)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL, process.stderr.read() if process.stderr else ""
    process.stderr.close()  # type: ignore[union-attr]
    finished = {p.name for p in cells_dir.glob("*.csv")}
    total = len(plan_cells(config))
    assert 0 < len(finished) < total
    assert not (out / "results.csv").exists()
    resumed = run_sweep(config, out)
    assert set(resumed.resumed) == finished
    assert len(resumed.ran) == total - len(finished)
    assert _tables(out) == reference[1]


@pytest.mark.slow
def test_two_jobs_give_the_serial_result(
    tmp_path: Path, reference: tuple[Path, dict[str, bytes]]
) -> None:
    config = load_config("quick", reference[0])
    outcome = run_sweep(config, tmp_path / "out", jobs=2)
    assert len(outcome.ran) == len(outcome.cells)
    assert _tables(tmp_path / "out") == reference[1]


def test_cell_seeds_depend_on_parameters_and_sweep_seed(
    reference: tuple[Path, dict[str, bytes]],
) -> None:
    config = load_config("quick", reference[0])
    digests = [c.digest for c in plan_cells(config)]
    assert len(set(digests)) == len(digests)
    reseeded = load_config("quick", reference[0]).__class__(
        **{**config.__dict__, "seed": config.seed + 1}
    )
    assert not set(digests) & {c.digest for c in plan_cells(reseeded)}


def test_progress_line_counts_cells_and_estimates_time() -> None:
    stream = io.StringIO()
    progress = Progress(total=4, resumed=1, stream=stream)
    progress.update("utility K=4")
    progress.update("attack K=4")
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("simulate: 2/4 cells (1 resumed) | elapsed ")
    assert "eta" in lines[0] and lines[0].endswith("utility K=4")
    assert lines[1].startswith("simulate: 3/4 cells")


def test_jobs_must_be_positive(tmp_path: Path, reference: tuple[Path, dict[str, bytes]]) -> None:
    config = load_config("quick", reference[0])
    with pytest.raises(ValueError, match="jobs must be a whole number >= 1; got 0"):
        run_sweep(config, tmp_path, jobs=0)
