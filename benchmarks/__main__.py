"""`make bench`: run every benchmark module and write their figures to one JSON file.

Each module in ``MODULES`` exposes ``run(repeats: int) -> dict[str, float]``.
Figures are medians of at least five runs; throughput figures come with a
ratio against a baseline measured in the same process, because the machines
are shared and absolute numbers drift.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

MODULES: list[str] = [
    "benchmarks.memory_bench",
    "benchmarks.noise_bench",
    "benchmarks.deltab_bench",
    "benchmarks.session_bench",
    "benchmarks.live_bench",
    "benchmarks.ukb_bench",
    "benchmarks.round_walk",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench.json"), help="JSON file to write")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (median; >= 5)")
    parser.add_argument("--only", action="append", default=[], help="run only these modules")
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error(f"--repeats must be at least 5 (medians of >= 5 runs); got {args.repeats}")
    results: dict[str, object] = {}
    if args.out.exists():
        try:
            results = json.loads(args.out.read_text())
        except json.JSONDecodeError:
            results = {}
    figures = results.setdefault("figures", {})
    assert isinstance(figures, dict)
    for name in MODULES:
        if args.only and not any(o in name for o in args.only):
            continue
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        module = importlib.import_module(name)
        figures.update(module.run(args.repeats))
        print(f"[bench] {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    results["machine"] = {
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "system": platform.system(),
    }
    results["repeats"] = args.repeats
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
