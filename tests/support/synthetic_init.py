"""`zerosum federation init --synthetic` run in this process: a federation folder for tests."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from zerosum.commands import federation as federation_command


def synthetic_flags(
    nodes: Sequence[str], *, seed: int, n_features: int, n_components: int, cohort_sizes: str
) -> list[str]:
    """The flags of ``federation init`` that make a synthetic federation of ``nodes``."""
    return [
        "--nodes",
        ",".join(nodes),
        "--synthetic",
        "--seed",
        str(seed),
        "--n-features",
        str(n_features),
        "--n-components",
        str(n_components),
        "--cohort-sizes",
        cohort_sizes,
    ]


def init_synthetic(
    out: Path,
    nodes: Sequence[str],
    *,
    seed: int,
    n_features: int,
    n_components: int,
    cohort_sizes: str,
    options: Sequence[str] = (),
) -> Path:
    """A synthetic federation of ``nodes`` written under ``out``; ``options`` are further flags."""
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    flags = synthetic_flags(
        nodes,
        seed=seed,
        n_features=n_features,
        n_components=n_components,
        cohort_sizes=cohort_sizes,
    )
    args = parser.parse_args(["init", "--out", str(out), *flags, *options])
    assert federation_command.run(args) == 0
    return out
