"""Cohorts in real units (volumes in mm³, thickness in mm) and a federation made for them.

The synthetic generator's features are mapped affinely onto the scales of
FreeSurfer-style measures, so that the bounds a real federation needs are
nothing like −10..10: hippocampal volumes in the thousands, grey matter in
the hundreds of thousands, cortical thickness around 2.5 mm. The federation
is made by ``zerosum federation init`` exactly as an operator would, with
either bounds that fit these data (``fitted``) or the −10..10 that used to be
the silent default (``unfitted``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from node.deltab.synthetic import Cohort, make_federation_cohorts, write_cohort_csv
from zerosum.commands import federation as federation_command

# name, typical value, spread (one SD) — in the units of each measure.
MEASURES: tuple[tuple[str, float, float], ...] = (
    ("lh_hippocampus_mm3", 4000.0, 400.0),
    ("rh_hippocampus_mm3", 4100.0, 420.0),
    ("lateral_ventricles_mm3", 25000.0, 6000.0),
    ("total_grey_mm3", 600000.0, 40000.0),
    ("mean_thickness_mm", 2.5, 0.12),
    ("wm_hypointensities_mm3", 3000.0, 600.0),
)
NAMES = tuple(name for name, _, _ in MEASURES)
VOLUMES = tuple(name for name in NAMES if name.endswith("_mm3"))
# Bounds that fit: 8 SD either side, more than any subject drawn here reaches.
FITTED_WIDTH = 8.0


def real_unit_cohorts(sizes: Sequence[int], seed: int) -> list[Cohort]:
    """One cohort per size, features in the units of :data:`MEASURES`."""
    federation = make_federation_cohorts(list(sizes), len(MEASURES), seed, holdout_size=0)
    pooled = np.vstack([site.features for site in federation.sites])
    mean, sd = pooled.mean(axis=0), pooled.std(axis=0)
    typical = np.array([m[1] for m in MEASURES])
    spread = np.array([m[2] for m in MEASURES])
    return [
        dataclasses.replace(
            site,
            features=typical + spread * (site.features - mean) / sd,
            feature_names=NAMES,
        )
        for site in federation.sites
    ]


def bounds_csv(path: Path, *, fitted: bool) -> Path:
    """``feature,low,high`` per measure: fitted to the units, or −10..10 for all."""
    rows = ["feature,low,high"]
    for name, typical, spread in MEASURES:
        low, high = (
            (typical - FITTED_WIDTH * spread, typical + FITTED_WIDTH * spread)
            if fitted
            else (-10.0, 10.0)
        )
        rows.append(f"{name},{low!r},{high!r}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def real_federation(
    out: Path,
    *,
    fitted: bool,
    sizes: Sequence[int] = (120, 130),
    seed: int = 3,
    extra: Sequence[str] = (),
) -> Path:
    """``zerosum federation init`` for nodes a, b, …; real-unit cohorts in nodes/<id>/data.csv."""
    nodes = [chr(ord("a") + i) for i in range(len(sizes))]
    out.parent.mkdir(parents=True, exist_ok=True)
    bounds = bounds_csv(out.parent / f"{out.name}-bounds.csv", fitted=fitted)
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    argv = [
        "init", "--nodes", ",".join(nodes), "--out", str(out),
        "--feature-bounds", str(bounds), "--n-components", "3", "--nan-policy", "drop",
        "--coordinator", "127.0.0.1:1", "--join-deadline", "60", "--round-deadline", "90",
        *extra,
    ]  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = federation_command.run(parser.parse_args(argv))
    assert code == 0, printed.getvalue()
    for node_id, cohort in zip(nodes, real_unit_cohorts(sizes, seed), strict=True):
        write_cohort_csv(cohort, out / "nodes" / node_id / "data.csv")
    return out
