"""`federation init --plan logreg`: the logistic-regression plan's settings, data and early stop.

With ``--synthetic`` each node gets a share of scikit-learn's bundled
breast-cancer table (Wolberg, Street & Mangasarian 1995, UCI; 569 subjects,
30 features, label 1 = benign), split non-IID: a random fifth is the
holdout, the rest is sorted by the first feature (mean radius) and cut into
one contiguous block per node, so each node sees a different part of the
feature space and a different share of each label. The public clipping
bounds are the ranges the dataset's own documentation lists, widened by
10 %.

Early stop: the T + 1 releases (the count, then T steps) compose in μ-GDP;
when T steps would take a node past ``--epsilon-budget`` against a class the
policy caps, the plan is written with as many steps as the budget admits and
a line says so.
"""

from __future__ import annotations

import argparse
import csv
import io
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from node.plans.logreg import LogregSettings, logreg_plan_spec
from proto.federation import FederationConfig, PlanSpec
from zerosum.commands import init_inputs as inputs
from zerosum.commands.init_inputs import InitError

__all__ = [
    "LogregData",
    "add_arguments",
    "breast_cancer_split",
    "build",
    "fit_budget",
    "settings_from",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logistic regression (--plan logreg)")
    group.add_argument("--rounds", type=int, default=20, help="gradient steps T (default 20)")
    group.add_argument("--learning-rate", type=float, default=2.0, help="step size η (default 2.0)")
    group.add_argument(
        "--clip-norm",
        type=float,
        default=1.0,
        help="each subject's gradient is scaled to at most this L2 norm: the sensitivity "
        "(default 1.0)",
    )
    group.add_argument("--l2", type=float, default=1e-3, help="ridge penalty λ (default 0.001)")


@dataclass(frozen=True)
class LogregData:
    """Per-node tables and the holdout, as CSV bytes, with the public bounds."""

    tables: dict[str, bytes]
    holdout: bytes
    low: tuple[float, ...]
    high: tuple[float, ...]
    n_features: int
    sizes: dict[str, int]


def _csv(ids: Sequence[str], labels: np.ndarray, x: np.ndarray, names: Sequence[str]) -> bytes:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["id", "label", *names])
    for subject, label, row in zip(ids, labels, x, strict=True):
        writer.writerow([subject, int(label), *(repr(float(v)) for v in row)])
    return buffer.getvalue().encode("utf-8")


def breast_cancer_split(node_ids: Sequence[str], seed: int) -> LogregData:
    """The bundled breast-cancer table, split non-IID across ``node_ids`` (module docstring)."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x, y = np.asarray(data.data, dtype=np.float64), np.asarray(data.target, dtype=np.float64)
    names = [str(n).replace(" ", "_") for n in data.feature_names]
    ids = [f"bc{i:03d}" for i in range(len(y))]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    n_holdout = len(y) // 5
    holdout, train = order[:n_holdout], order[n_holdout:]
    train = train[np.argsort(x[train, 0], kind="stable")]
    blocks = np.array_split(train, len(node_ids))
    tables = {
        node: _csv([ids[i] for i in block], y[block], x[block], names)
        for node, block in zip(node_ids, blocks, strict=True)
    }
    span = x.max(axis=0) - x.min(axis=0)
    low = tuple(float(v) for v in np.round(x.min(axis=0) - 0.1 * span, 4))
    high = tuple(float(v) for v in np.round(x.max(axis=0) + 0.1 * span, 4))
    return LogregData(
        tables=tables,
        holdout=_csv([ids[i] for i in holdout], y[holdout], x[holdout], names),
        low=low,
        high=high,
        n_features=x.shape[1],
        sizes={node: len(block) for node, block in zip(node_ids, blocks, strict=True)},
    )


def settings_from(
    args: argparse.Namespace, n_features: int, low: Sequence[float], high: Sequence[float]
) -> LogregSettings:
    return LogregSettings.from_tables(
        {
            "model": {
                "kind": "logistic",
                "n_features": n_features,
                "rounds": args.rounds,
                "learning_rate": args.learning_rate,
                "clip_norm": args.clip_norm,
                "l2": args.l2,
            },
            "clipping": {"feature_low": list(low), "feature_high": list(high)},
        }
    )


def fit_budget(
    config: FederationConfig,
    settings: LogregSettings,
    over_budget: Callable[[FederationConfig], bool],
    say: Callable[[str], None],
) -> FederationConfig:
    """``config`` with as many of the requested steps as the budget admits (early stop)."""

    def with_steps(steps: int) -> FederationConfig:
        shorter = replace(settings, rounds=steps)
        spec = replace(config.plan, rounds=shorter.round_specs(), settings=shorter.to_tables())
        return replace(config, plan=spec)

    if not over_budget(config):
        return config
    low, high = 0, settings.rounds  # with_steps(low) fits or low = 0; with_steps(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        if over_budget(with_steps(middle)):
            high = middle
        else:
            low = middle
    if low == 0:
        raise InitError(
            f"--epsilon-budget {config.privacy.epsilon_budget:g} admits not even one gradient "
            "step after the count; raise the budget or lower --epsilon"
        )
    say(
        f"early stop: the ε budget {config.privacy.epsilon_budget:g} admits {low} of the "
        f"{settings.rounds} requested gradient steps (count + {low} releases per node); the "
        f"plan is written with {low}"
    )
    return with_steps(low)


def data_files(out: Path, data: LogregData) -> dict[Path, bytes]:
    files = {out / "nodes" / node / "data.csv": table for node, table in data.tables.items()}
    files[out / "holdout.csv"] = data.holdout
    return files


def build(
    args: argparse.Namespace, node_ids: Sequence[str], out: Path
) -> tuple[PlanSpec, LogregSettings, dict[Path, bytes], int | None]:
    """The logistic-regression plan, and with --synthetic each node's share of the data."""
    if args.delta_summary is not None:
        raise InitError("--delta-summary is part of the brain-age plan, not of --plan logreg.")
    files: dict[Path, bytes] = {}
    seed: int | None = None
    if args.synthetic:
        if args.feature_range is not None or args.feature_bounds is not None:
            raise InitError("--synthetic sets its own clipping bounds; drop --feature-range.")
        seed = args.seed if args.seed is not None else secrets.randbits(64)
        data = breast_cancer_split(node_ids, seed)
        small = [n for n, size in data.sizes.items() if size < args.min_cohort_size]
        if small:
            raise InitError(
                f"{len(node_ids)} nodes leave node {small[0]!r} with {data.sizes[small[0]]} "
                f"subjects of the 569, below --min-cohort-size {args.min_cohort_size}; use "
                "fewer nodes or a lower --min-cohort-size"
            )
        files = data_files(out, data)
        low, high = list(data.low), list(data.high)
        n_features = data.n_features
    else:
        n_features = args.n_features if args.n_features is not None else 40
        if args.feature_bounds is not None:
            _, low, high = inputs.feature_bounds(args.feature_bounds, n_features)
        else:
            pair = inputs.pair("--feature-range", args.feature_range or "-10,10")
            low, high = [pair[0]] * n_features, [pair[1]] * n_features
    settings = settings_from(args, n_features, low, high)
    return logreg_plan_spec(settings), settings, files, seed
