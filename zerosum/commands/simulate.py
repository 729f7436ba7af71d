"""`zerosum simulate`: correlated vs independent noise — utility, privacy, attacks, report."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulations.cluster import DaskTarget

DESCRIPTION = """\
Simulate federated brain-age fits under each noise scheme and write results and a report:

  none              no noise (the exact federated fit)
  independent       every node noises its own release at the per-egress target
  zerosum           zero-sum correlated masks (pairwise and CAPE constructions)
  zerosum+residual  the same plus CAPE-split residual noise (aggregate at the central level)
  seed_fedavg       the deltab DP page's path: noised local coefficients averaged by N

Scenarios (--scenario, default all): utility, attack, reconstruction, overtheair, and
dropout (rounds with dropouts on complete and Harary graphs: infeasible rounds, the ε
survivors keep, the aggregate's noise).

Outputs in DIR: results.csv (utility), attacks.csv (membership inference against the
DP bound), reconstruction.csv, overtheair.csv, dropout.csv, report.md and figures/.
Finished cells are kept in DIR/cells/, so an interrupted run picks up where it stopped.
Cells run in local processes (--jobs) or on a Dask cluster (--scheduler, --dask-local;
needs the cluster extra), with identical results.
"""

EPILOG = """\
examples:
  zerosum simulate --out sim-quick                   # quick preset, a few minutes at most
  zerosum simulate --preset full --jobs 2 --out sim  # the full sweep (K up to 1000)
  zerosum simulate --config sim.toml --out sim       # preset overridden by a TOML file
  zerosum simulate --preset full --scenario dropout --out sim-drop
  zerosum simulate --scheduler tcp://127.0.0.1:8786 --out sim   # on a running Dask cluster
  zerosum simulate --dask-local 2 --out sim          # a Dask cluster started for this run
"""


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - platforms without sched_getaffinity
        return max(1, os.cpu_count() or 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument(
        "--preset", choices=["quick", "full"], default="quick", help="sweep size (default quick)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML file overriding the preset's settings",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--scenario",
        action="append",
        default=None,
        metavar="NAME",
        help="run only this scenario (repeatable): utility, attack, reconstruction, "
        "overtheair, dropout",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="local worker processes (default: the CPUs available to this process)",
    )
    cluster = parser.add_mutually_exclusive_group()
    cluster.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run the cells on the Dask scheduler at ADDRESS (e.g. tcp://127.0.0.1:8786)",
    )
    cluster.add_argument(
        "--dask-local",
        type=int,
        default=None,
        metavar="N",
        help="start a local Dask cluster of N worker processes (127.0.0.1) for this run",
    )
    parser.add_argument("--no-report", action="store_true", help="write the tables only")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def _error(message: str) -> int:
    print(f"zerosum simulate: error: {message}", file=sys.stderr)
    return 2


def _option_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with --jobs or --dask-local, or None."""
    if args.jobs is not None and (args.scheduler is not None or args.dask_local is not None):
        return "--jobs sets local processes; a Dask cluster brings its own workers"
    if args.jobs is not None and args.jobs < 1:
        return f"--jobs must be at least 1; got {args.jobs}"
    if args.dask_local is not None and args.dask_local < 1:
        return f"--dask-local must be at least 1 worker; got {args.dask_local}"
    return None


def _target(args: argparse.Namespace) -> DaskTarget | None:
    """The Dask cluster --scheduler or --dask-local names, or None to run locally."""
    from simulations.cluster import DaskTarget

    if args.scheduler is not None:
        return DaskTarget(scheduler=args.scheduler)
    if args.dask_local is not None:
        return DaskTarget(local_workers=args.dask_local)
    return None


def run(args: argparse.Namespace) -> int:
    problem = _option_problem(args)
    if problem is not None:
        return _error(problem)
    jobs = _default_jobs() if args.jobs is None else args.jobs
    # One BLAS thread per process: parallelism comes from --jobs, and several BLAS
    # threads per process on small matrices only contend. Set before numpy loads.
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    from simulations.cluster import ClusterError, ClusterTargetError
    from simulations.config import SimulationConfigError, load_config
    from simulations.sweep import Progress, run_sweep

    try:
        config = load_config(args.preset, args.config, scenarios=args.scenario)
        target = _target(args)
        args.out.mkdir(parents=True, exist_ok=True)
    except SimulationConfigError as exc:
        return _error(str(exc))
    except ClusterTargetError as exc:
        return _error(f"--scheduler: {exc}")
    except OSError as exc:
        return _error(f"cannot create --out {args.out}: {exc}")
    started = time.monotonic()

    def start(total: int, resumed: int) -> Progress | None:
        return None if args.quiet else Progress(total, resumed)

    try:
        outcome = run_sweep(config, args.out, jobs=jobs, on_start=start, cluster=target)
    except ClusterError as exc:
        print(f"zerosum simulate: error: {exc}", file=sys.stderr)
        return 1
    wall = time.monotonic() - started
    print(
        f"simulate: {len(outcome.cells)} cells ({len(outcome.ran)} run, "
        f"{len(outcome.resumed)} resumed) in {wall:.1f} s"
    )
    for path in outcome.tables.values():
        print(f"  {path}")
    if not args.no_report:
        from simulations.report import write_report  # matplotlib loads only for the report

        engine = None if target is None else target.description
        report = write_report(
            args.out, config, outcome, jobs=jobs, wall_seconds=wall, engine=engine
        )
        print(f"  {report}")
    return 0
