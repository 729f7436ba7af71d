"""Run a sweep cell by cell: seeded, parallel, resumable, with a progress line.

Every cell is a pure function of its description and the sweep seed
(``simulations.seeding``), so cells can run in any order, in any process.
Each finished cell is written to ``DIR/cells/<kind>-<digest>.csv`` by the
process that ran it, atomically (a temporary file in the same directory, then
``os.replace``), so a killed sweep leaves only complete cell files behind.
A rerun skips every cell whose file exists and runs the rest; the merged
tables (``results.csv`` for utility, ``attacks.csv``, ``reconstruction.csv``,
``overtheair.csv``, ``dropout.csv``) are rebuilt from the cell files in plan order, so an
interrupted and resumed sweep produces the same bytes as an uninterrupted one.

Parallelism: ``jobs`` worker processes (``concurrent.futures``, spawn start
method). Each worker pins its BLAS to one thread — the matrices are small, and
several threads per worker on a shared machine only contend. Alternatively the
same cells run on a Dask cluster (``simulations.cluster``): the workers return
each cell's CSV text and this process writes the cell file, so the workers
need not share its file system; the bytes are the same either way.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from simulations.config import (
    SCENARIOS,
    AttackParams,
    DropoutParams,
    OverTheAirParams,
    ReconstructionParams,
    SimConfig,
    UtilityParams,
)
from simulations.dropout import DROPOUT_SCHEMES
from simulations.seeding import cell_digest, cell_seed, child

if TYPE_CHECKING:
    from numpy.random import SeedSequence

    from simulations.cluster import DaskTarget

__all__ = [
    "FORMAT_VERSION",
    "TABLES",
    "Cell",
    "Progress",
    "SweepOutcome",
    "cell_text",
    "plan_cells",
    "read_table",
    "run_cell",
    "run_sweep",
    "single_threaded_blas",
    "write_atomic",
]

# Part of every cell's digest: bump it when a cell's output would change.
FORMAT_VERSION = 1

KINDS = SCENARIOS
TABLES = {
    "utility": "results.csv",
    "attack": "attacks.csv",
    "reconstruction": "reconstruction.csv",
    "overtheair": "overtheair.csv",
    "dropout": "dropout.csv",
}
BLAS_THREAD_VARIABLES = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
)

Params = UtilityParams | AttackParams | ReconstructionParams | OverTheAirParams | DropoutParams

_UTILITY_LEAD = (
    "scheme",
    "construction",
    "n_nodes",
    "epsilon",
    "delta",
    "n_per_node",
    "n_features",
    "rep",
    "mae_years",
    "delta_corr",
    "param_rel_error",
    "aggregate_noise_var",
    "egress_epsilon_outsider",
    "egress_epsilon_coordinator",
    "egress_epsilon_coalition",
)


@dataclass(frozen=True)
class Cell:
    """One unit of work: a kind, its parameters, repetitions and the schemes it covers."""

    kind: str
    params: Params
    reps: int
    schemes: tuple[str, ...]
    constructions: tuple[str, ...]
    sweep_seed: int

    def description(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "kind": self.kind,
            "params": asdict(self.params),
            "reps": self.reps,
            "schemes": list(self.schemes),
            "constructions": list(self.constructions),
            "seed": self.sweep_seed,
        }

    @property
    def digest(self) -> str:
        return cell_digest(self.description())

    @property
    def file_name(self) -> str:
        return f"{self.kind}-{self.digest[:16]}.csv"

    @property
    def label(self) -> str:
        p = self.params
        if isinstance(p, UtilityParams):
            return (
                f"utility K={p.n_nodes} ε={p.epsilon:g} δ={p.delta:g} N={p.n_per_node} "
                f"P={p.n_features} site sd={p.site_offset_sd:g}"
            )
        if isinstance(p, AttackParams):
            return f"attack K={p.n_nodes} ε={p.epsilon:g}"
        if isinstance(p, ReconstructionParams):
            return f"reconstruction K={p.n_nodes} N={p.n_per_node} ε={p.epsilon:g}"
        if isinstance(p, DropoutParams):
            graph = f"harary d={p.harary_degree}" if p.graph == "harary" else p.graph
            return f"dropout {graph} K={p.n_nodes} r={p.dropout_rate:g} T={p.collusion_threshold}"
        return f"over-the-air K={p.n_users}"

    @property
    def cost(self) -> float:
        """A rough relative run time, to start the longest cells first."""
        p = self.params
        if isinstance(p, UtilityParams):
            return self.reps * p.n_nodes * (p.n_per_node + 200) * (1 + p.n_features / 20)
        if isinstance(p, AttackParams):
            return p.trials * p.n_nodes * 60.0
        if isinstance(p, ReconstructionParams):
            return 1e4
        if isinstance(p, DropoutParams):
            return self.reps * p.n_nodes * (p.n_nodes + 100) * 0.05
        return p.reps * p.iterations * p.n_users * 5.0


def plan_cells(config: SimConfig) -> list[Cell]:
    """Every cell of the sweep, in report order."""

    def make(kind: str, params: Params, reps: int) -> Cell:
        return Cell(kind, params, reps, config.schemes, config.constructions, config.seed)

    cells = [make("utility", p, config.reps) for p in config.utility_cells()]
    cells += [make("attack", p, 1) for p in config.attack_cells()]
    cells.append(make("reconstruction", config.reconstruction, 1))
    cells.append(make("overtheair", config.overtheair, config.overtheair.reps))
    # Dropout cells cover their own schemes, whatever the utility sweep compares.
    cells += [
        Cell("dropout", p, config.dropout.reps, DROPOUT_SCHEMES, ("pairwise",), config.seed)
        for p in config.dropout.cells()
    ]
    return [c for c in cells if c.kind in config.scenarios]


def _param_columns(params: Params) -> dict[str, object]:
    values = asdict(params)
    if "coalition_sizes" in values:
        values["coalition_sizes"] = " ".join(str(m) for m in values["coalition_sizes"])
    return values


Rows = list[dict[str, object]]


def run_cell(cell: Cell) -> Rows:
    """Run one cell in this process and return its rows (parameters, seeds, results)."""
    runner = _CELL_RUNNERS.get(cell.kind)
    if runner is None:
        raise ValueError(f"unknown cell kind {cell.kind!r}; kinds are {list(KINDS)}")
    root = cell_seed(cell.sweep_seed, cell.digest)
    stamp = {"seed": cell.sweep_seed, "cell": cell.digest}
    return runner(cell, root, _param_columns(cell.params), stamp)


def _utility_rows(
    cell: Cell, root: SeedSequence, params: dict[str, object], stamp: dict[str, object]
) -> Rows:
    from simulations.schemes import variants
    from simulations.utility import DATA_FIELDS, utility_rep

    assert isinstance(cell.params, UtilityParams)
    chosen = variants(cell.schemes, cell.constructions)
    data_digest = cell_digest(_data_description(cell, DATA_FIELDS))
    data_root = cell_seed(cell.sweep_seed, data_digest)
    rows: Rows = []
    for rep in range(cell.reps):
        results = utility_rep(cell.params, chosen, child(data_root, rep), child(root, rep))
        for result in results:
            row = {**params, **result, "rep": rep, **stamp, "data_cell": data_digest}
            lead = {k: row[k] for k in _UTILITY_LEAD}
            rows.append({**lead, **{k: v for k, v in row.items() if k not in lead}})
    return rows


def _attack_rows(
    cell: Cell, root: SeedSequence, params: dict[str, object], stamp: dict[str, object]
) -> Rows:
    from simulations.attacks import membership_attack

    assert isinstance(cell.params, AttackParams)
    return [
        {**_lead_scheme(result), **params, **result, **stamp}
        for result in membership_attack(cell.params, child(root, 0))
    ]


def _reconstruction_rows(
    cell: Cell, root: SeedSequence, params: dict[str, object], stamp: dict[str, object]
) -> Rows:
    from simulations.reconstruction import reconstruction_attack

    assert isinstance(cell.params, ReconstructionParams)
    return [
        {**_lead_scheme(result), **params, **result, **stamp}
        for result in reconstruction_attack(cell.params, child(root, 0))
    ]


def _overtheair_rows(
    cell: Cell, root: SeedSequence, params: dict[str, object], stamp: dict[str, object]
) -> Rows:
    from simulations.overtheair import optimality_gaps

    assert isinstance(cell.params, OverTheAirParams)
    return [
        {**params, "rep": rep, **result, **stamp}
        for rep in range(cell.reps)
        for result in optimality_gaps(cell.params, child(root, rep))
    ]


def _dropout_rows(
    cell: Cell, root: SeedSequence, params: dict[str, object], stamp: dict[str, object]
) -> Rows:
    from simulations.dropout import dropout_rows

    assert isinstance(cell.params, DropoutParams)
    return [
        {**_lead_scheme_only(result), **params, **result, **stamp}
        for result in dropout_rows(cell.params, cell.reps, root)
    ]


# Each cell kind's runner: (cell, its seed, its parameter columns, its stamp) -> its rows.
_CELL_RUNNERS: dict[
    str, Callable[[Cell, SeedSequence, dict[str, object], dict[str, object]], Rows]
] = {
    "utility": _utility_rows,
    "attack": _attack_rows,
    "reconstruction": _reconstruction_rows,
    "overtheair": _overtheair_rows,
    "dropout": _dropout_rows,
}


def _data_description(cell: Cell, data_fields: Sequence[str]) -> dict[str, Any]:
    """What decides a utility cell's federations: the data parameters, not the privacy ones."""
    values = asdict(cell.params)
    return {
        "format": FORMAT_VERSION,
        "kind": "utility-data",
        "params": {name: values[name] for name in data_fields},
        "seed": cell.sweep_seed,
    }


def _lead_scheme(result: dict[str, object]) -> dict[str, object]:
    return {"scheme": result["scheme"], "construction": result["construction"]}


def _lead_scheme_only(result: dict[str, object]) -> dict[str, object]:
    return {"scheme": result["scheme"]}


# -- files ----------------------------------------------------------------------------------


def _format(value: object) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _csv_text(rows: Sequence[dict[str, object]]) -> str:
    buffer = io.StringIO()
    if not rows:
        return ""
    writer = csv.writer(buffer, lineterminator="\n")
    header = list(rows[0])
    writer.writerow(header)
    for row in rows:
        writer.writerow([_format(row[k]) for k in header])
    return buffer.getvalue()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("w", encoding="utf-8", newline="") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def read_table(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV written by the sweep (values as strings)."""
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def cell_text(cell: Cell) -> str:
    """The CSV text of a cell's file: what a worker anywhere computes for it."""
    return _csv_text(run_cell(cell))


def _run_and_write(cell: Cell, cells_dir: str) -> str:
    write_atomic(Path(cells_dir) / cell.file_name, cell_text(cell))
    return cell.file_name


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Set the BLAS thread variables to 1 for processes started inside, then restore them.

    They must be in the environment before a worker imports numpy, which
    happens while it unpickles its first task — too early for an initializer.
    """
    saved = {name: os.environ.get(name) for name in BLAS_THREAD_VARIABLES}
    os.environ.update(dict.fromkeys(BLAS_THREAD_VARIABLES, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- progress -------------------------------------------------------------------------------


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "--:--"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """A one-line progress report on a stream: cells done / total, elapsed, ETA.

    On a terminal the line is rewritten in place; otherwise one line per cell.
    """

    def __init__(self, total: int, resumed: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = resumed
        self.resumed = resumed
        self.stream = sys.stderr if stream is None else stream
        self.start = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._width = 0

    def line(self, label: str) -> str:
        elapsed = time.monotonic() - self.start
        ran = self.done - self.resumed
        remaining = self.total - self.done
        eta = elapsed / ran * remaining if ran else math.inf
        resumed = f" ({self.resumed} resumed)" if self.resumed else ""
        return (
            f"simulate: {self.done}/{self.total} cells{resumed} | elapsed {_clock(elapsed)} | "
            f"eta {_clock(eta) if remaining else '0:00'} | {label}"
        )

    def update(self, label: str) -> None:
        self.done += 1
        text = self.line(label)
        if self.tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()


# -- the sweep ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepOutcome:
    """What a call to :func:`run_sweep` did."""

    cells: tuple[Cell, ...]
    ran: tuple[str, ...]
    resumed: tuple[str, ...]
    seconds: float
    tables: dict[str, Path]


def _merge(cells: Iterable[Cell], cells_dir: Path, out_dir: Path) -> dict[str, Path]:
    tables: dict[str, Path] = {}
    for kind, name in TABLES.items():
        chunks = [
            (cells_dir / c.file_name).read_text(encoding="utf-8") for c in cells if c.kind == kind
        ]
        chunks = [c for c in chunks if c]
        if not chunks:
            continue
        header = chunks[0].split("\n", 1)[0]
        body = "".join(c.split("\n", 1)[1] for c in chunks)
        path = out_dir / name
        write_atomic(path, header + "\n" + body)
        tables[kind] = path
    return tables


def _run_pending(
    pending: Sequence[Cell],
    cells_dir: Path,
    *,
    jobs: int,
    cluster: DaskTarget | None,
    progress: Progress | None,
) -> list[str]:
    """Run and write ``pending`` on Dask, in this process or in ``jobs`` processes."""
    ran: list[str] = []
    if cluster is not None:
        from simulations.cluster import map_on_dask

        keys = [f"zerosum-simulate-{c.file_name}" for c in pending]
        for index, text in map_on_dask(cluster, cell_text, pending, keys):
            cell = pending[index]
            write_atomic(cells_dir / cell.file_name, text)
            ran.append(cell.file_name)
            if progress is not None:
                progress.update(cell.label)
    elif jobs == 1 or len(pending) <= 1:
        for cell in pending:
            ran.append(_run_and_write(cell, str(cells_dir)))
            if progress is not None:
                progress.update(cell.label)
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            with single_threaded_blas():
                futures = {pool.submit(_run_and_write, c, str(cells_dir)): c for c in pending}
            for future in as_completed(futures):
                ran.append(future.result())
                if progress is not None:
                    progress.update(futures[future].label)
    return ran


def run_sweep(
    config: SimConfig,
    out_dir: str | Path,
    *,
    jobs: int = 1,
    progress: Progress | None = None,
    on_start: Callable[[int, int], Progress | None] | None = None,
    cluster: DaskTarget | None = None,
) -> SweepOutcome:
    """Run every cell of ``config`` that ``out_dir/cells`` does not hold yet, then merge.

    ``jobs`` = 1 runs in this process; more uses that many worker processes.
    ``cluster`` runs the cells on Dask instead (``jobs`` is then unused).
    ``on_start(total, resumed)`` may return a :class:`Progress` to report on.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1; got {jobs!r}")
    started = time.monotonic()
    out = Path(out_dir)
    cells_dir = out / "cells"
    cells_dir.mkdir(parents=True, exist_ok=True)
    for stale in cells_dir.glob(".*.tmp"):
        stale.unlink()
    cells = plan_cells(config)
    done = {c.file_name for c in cells if (cells_dir / c.file_name).exists()}
    pending = sorted((c for c in cells if c.file_name not in done), key=lambda c: -c.cost)
    if on_start is not None:
        progress = on_start(len(cells), len(done))
    ran = _run_pending(pending, cells_dir, jobs=jobs, cluster=cluster, progress=progress)
    if progress is not None:
        progress.close()
    tables = _merge(cells, cells_dir, out)
    return SweepOutcome(
        cells=tuple(cells),
        ran=tuple(ran),
        resumed=tuple(sorted(done)),
        seconds=time.monotonic() - started,
        tables=tables,
    )
