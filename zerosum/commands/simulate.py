"""`zerosum simulate`: correlated vs independent noise — utility, privacy, attacks, report."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DESCRIPTION = """\
Simulate federated brain-age fits under each noise scheme and write results and a report:

  none              no noise (the exact federated fit)
  independent       every node noises its own release at the per-egress target
  zerosum           zero-sum correlated masks (pairwise and CAPE constructions)
  zerosum+residual  the same plus CAPE-split residual noise (aggregate at the central level)
  seed_fedavg       the deltab DP page's path: noised local coefficients averaged by N

Outputs in DIR: results.csv (utility), attacks.csv (membership inference against the
DP bound), reconstruction.csv, overtheair.csv, report.md and figures/. Finished cells
are kept in DIR/cells/, so an interrupted run picks up where it stopped.
"""

EPILOG = """\
examples:
  zerosum simulate --out sim-quick                   # quick preset, a few minutes at most
  zerosum simulate --preset full --jobs 2 --out sim  # the full sweep (K up to 1000)
  zerosum simulate --config sim.toml --out sim       # preset overridden by a TOML file
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
        "--jobs",
        type=int,
        default=_default_jobs(),
        metavar="N",
        help="worker processes (default: the CPUs available to this process)",
    )
    parser.add_argument("--no-report", action="store_true", help="write the tables only")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        print(
            f"zerosum simulate: error: --jobs must be at least 1; got {args.jobs}", file=sys.stderr
        )
        return 2
    # One BLAS thread per process: parallelism comes from --jobs, and several BLAS
    # threads per process on small matrices only contend. Set before numpy loads.
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    from simulations.config import ConfigError, load_config
    from simulations.sweep import Progress, run_sweep

    try:
        config = load_config(args.preset, args.config)
    except ConfigError as exc:
        print(f"zerosum simulate: error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()

    def start(total: int, resumed: int) -> Progress | None:
        return None if args.quiet else Progress(total, resumed)

    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"zerosum simulate: error: cannot create --out {args.out}: {exc}", file=sys.stderr)
        return 2
    outcome = run_sweep(config, args.out, jobs=args.jobs, on_start=start)
    wall = time.monotonic() - started
    print(
        f"simulate: {len(outcome.cells)} cells ({len(outcome.ran)} run, "
        f"{len(outcome.resumed)} resumed) in {wall:.1f} s"
    )
    for path in outcome.tables.values():
        print(f"  {path}")
    if not args.no_report:
        from simulations.report import write_report  # matplotlib loads only for the report

        report = write_report(args.out, config, outcome, jobs=args.jobs, wall_seconds=wall)
        print(f"  {report}")
    return 0
