"""Whole-process cost of `zerosum deltab` (train + predict) against scikit-learn.

What a TRE job pays is a whole process: interpreter start, imports, reading
the CSV files, the fit, the prediction, writing the output. So each
measurement here is one fresh child process, timed from the outside
(wall clock) and reporting its own peak resident set size
(``VmHWM`` of /proc/self/status) just before it exits, so that every
figure belongs to exactly one process.

Data: a synthetic cohort (``node.deltab.synthetic``) with P = 1000 features,
written once per size as an ``age`` file and a features CSV with a header.
Both contenders read the same two files and reduce to 20 principal components:

* zerosum:  ``zerosum deltab --train-ages A --train-features X --feature-num 20
  --predict-model simple --predict age`` (the simple model is the one that
  matches the baseline: age regressed on the component scores);
* baseline: ``numpy.loadtxt`` + ``StandardScaler`` + ``PCA(n_components=20,
  svd_solver="full")`` + ``LinearRegression``, fit and predict on the same
  subjects, predictions written with ``numpy.savetxt``.

Figures (medians over ``repeats`` runs): ``deltab_seconds_n{N}_p1000``,
``deltab_peak_rss_mb_n{N}_p1000``, ``deltab_ratio_vs_sklearn_n{N}_p1000``
(zerosum time / baseline time) and the baseline's own seconds and peak RSS,
for N = 500 and N = 20,000. Targets: peak RSS at N = 500 at most 70 MB and a
ratio of at most 1.0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from node.deltab.synthetic import make_cohort, write_cohort_csv

N_FEATURES = 1000
N_COMPONENTS = 20
SIZES = (500, 20_000)
SEED = 20190528  # any fixed seed: the data only needs to be the same for both contenders

_RSS_MARK = "peak-rss-kb:"

# Runs the real dispatcher; registers the subcommand only if the table lacks it,
# so the measurement does not depend on the order in which modules were wired up.
# Peak RSS of this process alone: VmHWM of its own address space. (getrusage's
# ru_maxrss is not used: Linux carries the parent's peak over fork + exec, so a
# child of a large benchmark process would report the parent's size.)
_PEAK_RSS_KB = """\
def _peak_rss_kb():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""

_ZEROSUM_CHILD = f"""\
import sys
{_PEAK_RSS_KB}
import zerosum.cli as cli
status = cli.main(sys.argv[1:])
print("{_RSS_MARK}", _peak_rss_kb())
sys.exit(status)
"""

_SKLEARN_CHILD = f"""\
import sys
{_PEAK_RSS_KB}
import numpy as np
from sklearn.decomposition import PCA
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
ages_path, features_path, output = sys.argv[1:4]
age = np.loadtxt(ages_path, skiprows=1, ndmin=1)
features = np.loadtxt(features_path, delimiter=",", skiprows=1, ndmin=2)
pipeline = make_pipeline(
    StandardScaler(), PCA(n_components={N_COMPONENTS}, svd_solver="full"), LinearRegression()
)
pipeline.fit(features, age)
np.savetxt(output, pipeline.predict(features))
print("{_RSS_MARK}", _peak_rss_kb())
"""


def _measure(argv: Sequence[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one child process."""
    start = time.perf_counter()
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(
            f"benchmark child failed with status {done.returncode}: {done.stderr.strip()}"
        )
    marks = [line for line in done.stdout.splitlines() if line.startswith(_RSS_MARK)]
    if not marks:
        raise RuntimeError(f"benchmark child did not report its peak RSS: {done.stdout!r}")
    kilobytes = float(marks[-1].split()[1])  # Linux reports ru_maxrss in KiB
    return seconds, kilobytes / 1024.0


def _write_data(directory: Path, n_subjects: int) -> tuple[Path, Path]:
    cohort = make_cohort(n_subjects, N_FEATURES, seed=SEED)
    ages = write_cohort_csv(cohort, directory / "ages.csv", False, include_features=False)
    features = write_cohort_csv(cohort, directory / "features.csv", False, include_age=False)
    return ages, features


def measure_size(n_subjects: int, repeats: int) -> dict[str, float]:
    """Median figures for one cohort size (data written once into a temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="deltab-bench-") as folder:
        directory = Path(folder)
        ages, features = _write_data(directory, n_subjects)
        zerosum_argv = [
            sys.executable,
            "-c",
            _ZEROSUM_CHILD,
            "deltab",
            "--train-ages",
            str(ages),
            "--train-features",
            str(features),
            "--feature-num",
            str(N_COMPONENTS),
            "--predict-model",
            "simple",
            "--predict",
            "age",
            "--predict-output",
            str(directory / "zerosum.txt"),
            "--overwrite",
        ]
        sklearn_argv = [
            sys.executable,
            "-c",
            _SKLEARN_CHILD,
            str(ages),
            str(features),
            str(directory / "sklearn.txt"),
        ]
        ours: list[tuple[float, float]] = []
        theirs: list[tuple[float, float]] = []
        for _ in range(repeats):
            # Interleaved, so that drift in machine load hits both contenders alike.
            ours.append(_measure(zerosum_argv))
            theirs.append(_measure(sklearn_argv))
    seconds = statistics.median(s for s, _ in ours)
    baseline = statistics.median(s for s, _ in theirs)
    tag = f"n{n_subjects}_p{N_FEATURES}"
    return {
        f"deltab_seconds_{tag}": seconds,
        f"deltab_peak_rss_mb_{tag}": statistics.median(r for _, r in ours),
        f"deltab_ratio_vs_sklearn_{tag}": seconds / baseline,
        f"deltab_sklearn_seconds_{tag}": baseline,
        f"deltab_sklearn_peak_rss_mb_{tag}": statistics.median(r for _, r in theirs),
    }


def run(repeats: int, sizes: Sequence[int] = SIZES) -> dict[str, float]:
    figures: dict[str, float] = {}
    for n_subjects in sizes:
        figures.update(measure_size(n_subjects, repeats))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.deltab_bench", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (median)")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(SIZES), help="numbers of subjects"
    )
    args = parser.parse_args(argv)
    print(json.dumps(run(args.repeats, args.sizes), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
