"""A sweep on a local Dask cluster gives the local run's bytes, and resumes the same way."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest

from simulations.cluster import ClusterError, DaskTarget, map_on_dask
from simulations.config import load_config
from simulations.sweep import TABLES, plan_cells, run_sweep

pytest.importorskip(
    "distributed", reason="dask.distributed is not installed (pip install 'zerosum[cluster]')"
)

# Dropout and over-the-air cells: several kinds, small enough for a few seconds.
SMALL = """\
seed = 41
scenarios = ["dropout", "overtheair", "reconstruction"]

[reconstruction]
targets = 20

[overtheair]
reps = 3
iterations = 40

[dropout]
n_nodes = [10, 40]
rates = [0.0, 0.1, 0.3]
collusion_thresholds = [1, 2]
reps = 25
"""

# Past this a test fails instead of hanging; the cells take about a second.
DEADLINE = 120.0


def _files(folder: Path) -> dict[str, bytes]:
    found = {p.name: p.read_bytes() for p in (folder / "cells").glob("*.csv")}
    found.update({n: (folder / n).read_bytes() for n in TABLES.values() if (folder / n).exists()})
    return found


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    folder = tmp_path_factory.mktemp("local")
    path = folder / "small.toml"
    path.write_text(SMALL, encoding="utf-8")
    run_sweep(load_config("quick", path), folder / "out")
    return path, _files(folder / "out")


def _threads() -> DaskTarget:
    return DaskTarget(local_workers=2, processes=False, timeout=DEADLINE)


def test_a_local_dask_cluster_reproduces_the_local_run(
    tmp_path: Path, small: tuple[Path, dict[str, bytes]]
) -> None:
    config = load_config("quick", small[0])
    outcome = run_sweep(config, tmp_path / "out", cluster=_threads())
    assert len(outcome.ran) == len(plan_cells(config)) and not outcome.resumed
    files = _files(tmp_path / "out")
    assert set(files) == set(small[1])
    assert files == small[1]
    assert {"dropout.csv", "overtheair.csv", "reconstruction.csv"} <= set(files)


def test_a_dask_sweep_resumes_what_is_missing(
    tmp_path: Path, small: tuple[Path, dict[str, bytes]]
) -> None:
    config = load_config("quick", small[0])
    out = tmp_path / "out"
    run_sweep(config, out)  # locally first, then finish on Dask
    cells = sorted((out / "cells").glob("*.csv"))
    removed = {cells[0].name, cells[-1].name}
    for name in removed:
        (out / "cells" / name).unlink()
    again = run_sweep(config, out, cluster=_threads())
    assert set(again.ran) == removed
    assert _files(out) == small[1]


@pytest.mark.integration  # worker processes on 127.0.0.1
def test_worker_processes_on_loopback_give_the_same_bytes(
    tmp_path: Path, small: tuple[Path, dict[str, bytes]]
) -> None:
    config = load_config("quick", small[0])
    target = DaskTarget(local_workers=2, processes=True, timeout=DEADLINE)
    run_sweep(config, tmp_path / "out", cluster=target)
    assert _files(tmp_path / "out") == small[1]


@pytest.mark.integration  # a worker process on 127.0.0.1
def test_a_local_cluster_needs_no_fixed_port() -> None:
    """Dask's default dashboard port taken (by another sweep, say): the run still starts."""
    with contextlib.ExitStack() as held:
        holder = held.enter_context(socket.socket())
        with contextlib.suppress(OSError):  # already taken by someone else: as good
            holder.bind(("127.0.0.1", 8787))
            holder.listen()
        target = DaskTarget(local_workers=1, processes=True, timeout=DEADLINE)
        got = dict(map_on_dask(target, _square, [3, 4], ["three", "four"]))
    assert got == {0: 9, 1: 16}


def _square(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative input {x}")
    return x * x


def test_results_come_back_per_item_and_errors_surface() -> None:
    items = [3, 1, 4, 1, 5]
    keys = [f"square-{i}" for i in range(len(items))]
    got = dict(map_on_dask(_threads(), _square, items, keys))
    assert got == {i: x * x for i, x in enumerate(items)}
    with pytest.raises(ValueError, match="negative input -2"):
        list(map_on_dask(_threads(), _square, [2, -2], ["ok", "bad"]))
    with pytest.raises(ValueError, match="keys must name every item once"):
        list(map_on_dask(_threads(), _square, [2, 3], ["same", "same"]))


def test_an_unreachable_scheduler_is_one_clear_error() -> None:
    with socket.socket() as probe:  # a loopback port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    target = DaskTarget(scheduler=f"tcp://127.0.0.1:{port}", connect_timeout=1.0)
    with pytest.raises(
        ClusterError, match=f"cannot reach the Dask scheduler tcp://127.0.0.1:{port}"
    ):
        list(map_on_dask(target, _square, [1], ["one"]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give either a scheduler address or a number of local workers"),
        ({"scheduler": "tcp://127.0.0.1:1", "local_workers": 2}, "not both or neither"),
        ({"scheduler": "127.0.0.1:8786"}, "scheduler must be an address such as tcp://"),
        ({"local_workers": 2, "timeout": 0.0}, "timeout must be > 0 seconds; got 0.0"),
    ],
)
def test_bad_targets_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DaskTarget(**kwargs)  # type: ignore[arg-type]
