"""From the sweep's tables to means, confidence intervals and the headline checks.

Intervals are two-sided 95 % Student-t intervals over repetitions,
mean ± t_{0.975, n−1}·s/√n, computed over the finite values (a failed fit
counts as missing and is reported separately).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
from scipy.stats import t as student_t

from simulations.config import SimConfig, UtilityParams
from simulations.schemes import Variant
from simulations.sweep import TABLES, read_table

__all__ = [
    "Estimate",
    "Tables",
    "axis_series",
    "estimate",
    "load_tables",
    "must_show",
    "num",
    "variant_of",
    "whole",
]

Row = dict[str, object]


def _parse(value: str) -> object:
    try:
        if value.lstrip("-").isdigit():
            return int(value)
        return float(value)
    except ValueError:
        return value


@dataclass(frozen=True)
class Tables:
    """The merged tables of a sweep, values parsed to numbers where they are numbers."""

    utility: list[Row]
    attack: list[Row]
    reconstruction: list[Row]
    overtheair: list[Row]


def load_tables(out_dir: str | Path) -> Tables:
    out = Path(out_dir)
    loaded: dict[str, list[Row]] = {}
    for kind, name in TABLES.items():
        path = out / name
        rows = read_table(path) if path.exists() else []
        loaded[kind] = [{k: _parse(v) for k, v in row.items()} for row in rows]
    return Tables(
        utility=loaded["utility"],
        attack=loaded["attack"],
        reconstruction=loaded["reconstruction"],
        overtheair=loaded["overtheair"],
    )


@dataclass(frozen=True)
class Estimate:
    """Mean and 95 % t-interval of a sample; ``n`` counts the finite values used."""

    mean: float
    lo: float
    hi: float
    n: int
    missing: int

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2.0

    def text(self, digits: int = 3) -> str:
        if self.n == 0:
            return "—"
        if math.isinf(self.mean):
            return "∞"
        if self.n == 1 or not math.isfinite(self.half_width):
            return f"{self.mean:.{digits}g}"
        return f"{self.mean:.{digits}g} ± {self.half_width:.2g}"


def estimate(values: Iterable[object]) -> Estimate:
    """Mean and t-interval over the finite values."""
    array = np.array([_as_float(v) for v in values], dtype=np.float64)
    finite = array[np.isfinite(array)]
    missing = int(array.size - finite.size)
    if finite.size == 0:
        infinite = array[np.isinf(array)]
        if infinite.size:
            value = float(infinite[0])
            return Estimate(value, value, value, int(infinite.size), missing - int(infinite.size))
        return Estimate(math.nan, math.nan, math.nan, 0, missing)
    mean = float(finite.mean())
    if finite.size == 1:
        return Estimate(mean, mean, mean, 1, missing)
    half = float(
        student_t.ppf(0.975, finite.size - 1) * finite.std(ddof=1) / math.sqrt(finite.size)
    )
    return Estimate(mean, mean - half, mean + half, int(finite.size), missing)


def _as_float(value: object) -> float:
    return float(value) if isinstance(value, int | float) else float(str(value))


def num(row: Mapping[str, object], key: str) -> float:
    """``row[key]`` as a float (numbers as parsed, anything else through its text)."""
    return _as_float(row[key])


def whole(row: Mapping[str, object], key: str) -> int:
    """``row[key]`` as an int."""
    value = row[key]
    return int(value) if isinstance(value, int | float) else int(str(value))


def variant_of(row: Mapping[str, object]) -> Variant:
    return Variant(str(row["scheme"]), str(row["construction"]))


_PARAM_NAMES = tuple(f.name for f in fields(UtilityParams))


def _matches(row: Mapping[str, object], point: UtilityParams) -> bool:
    values = asdict(point)
    for name in _PARAM_NAMES:
        if name not in row:
            continue
        expected = values[name]
        if isinstance(expected, float):
            if not math.isclose(num(row, name), expected, rel_tol=1e-12):
                return False
        elif row[name] != expected:
            return False
    return True


def axis_series(
    rows: Sequence[Row], config: SimConfig, axis: str, metric: str
) -> dict[Variant, list[tuple[float, Estimate]]]:
    """Per variant, (axis value, estimate of ``metric``) along one axis around the base point."""
    values = sorted({float(v) for v in config.axis(axis)} | {float(getattr(config.base, axis))})
    out: dict[Variant, list[tuple[float, Estimate]]] = {}
    for value in values:
        cast = int(value) if isinstance(getattr(config.base, axis), int) else value
        point = UtilityParams(**{**asdict(config.base), axis: cast})
        selected = [r for r in rows if _matches(r, point)]
        by_variant: dict[Variant, list[object]] = {}
        for r in selected:
            by_variant.setdefault(variant_of(r), []).append(r[metric])
        for variant, sample in by_variant.items():
            out.setdefault(variant, []).append((value, estimate(sample)))
    return out


@dataclass(frozen=True)
class Check:
    """One headline claim, whether the run supports it, and the numbers behind it."""

    claim: str
    passed: bool
    detail: str


def _cell_means(rows: Sequence[Row], metric: str) -> dict[tuple[str, Variant], Estimate]:
    grouped: dict[tuple[str, Variant], list[object]] = {}
    for r in rows:
        grouped.setdefault((str(r["cell"]), variant_of(r)), []).append(r[metric])
    return {key: estimate(sample) for key, sample in grouped.items()}


def _cell_params(rows: Sequence[Row]) -> dict[str, Row]:
    return {str(r["cell"]): r for r in rows}


def must_show(tables: Tables, config: SimConfig | None = None) -> list[Check]:
    """The issue's acceptance claims, evaluated on this run (the K-axis claim needs ``config``)."""
    found = [
        _zerosum_matches_none(tables.utility),
        _independent_clearly_worse(tables.utility),
        None if config is None else _residual_is_one_over_k(tables.utility, config),
        _attacks_within_bound(tables.attack) if tables.attack else None,
    ]
    return [check for check in found if check is not None]


def _zerosum_matches_none(rows: Sequence[Row]) -> Check:
    mae = _cell_means(rows, "mae_years")
    none = Variant("none")
    worst = 0.0
    compared = 0
    for (cell, variant), est in mae.items():
        if variant.scheme != "zerosum" or (cell, none) not in mae:
            continue
        reference = mae[(cell, none)].mean
        worst = max(worst, abs(est.mean - reference) / reference)
        compared += 1
    return Check(
        "zerosum MAE within 2% of none",
        compared > 0 and worst <= 0.02,
        f"largest relative difference over {compared} cell×construction means: {worst:.2e}",
    )


def _independent_clearly_worse(rows: Sequence[Row]) -> Check | None:
    params = _cell_params(rows)
    # Within a repetition every scheme sees the same federation, so compare paired.
    paired: dict[str, dict[str, dict[int, float]]] = {}
    for r in rows:
        if r["scheme"] in ("none", "independent"):
            by_rep = paired.setdefault(str(r["cell"]), {}).setdefault(str(r["scheme"]), {})
            by_rep[whole(r, "rep")] = num(r, "mae_years")
    ratios, lower_bounds, exceptions = [], [], []
    for cell, schemes in paired.items():
        p = params[cell]
        if not (num(p, "epsilon") <= 1.0 and whole(p, "n_nodes") >= 5):
            continue
        reps = sorted(set(schemes.get("none", {})) & set(schemes.get("independent", {})))
        if len(reps) < 2:
            continue
        ind = np.array([schemes["independent"][i] for i in reps])
        ref = np.array([schemes["none"][i] for i in reps])
        difference = estimate(ind - ref)
        ratio = float(np.mean(ind) / np.mean(ref))
        ratios.append(ratio)
        lower_bounds.append(difference.lo)
        if difference.lo <= 0.0:
            exceptions.append(
                f"K={whole(p, 'n_nodes')} ε={num(p, 'epsilon'):g} N={whole(p, 'n_per_node')} "
                f"P={whole(p, 'n_features')} (ratio {ratio:.2f}, lower bound "
                f"{difference.lo:.2f})"
            )
    if not ratios:
        return None
    significant = len(ratios) - len(exceptions)
    detail = (
        f"MAE independent/none: median ratio {float(np.median(ratios)):.2f} (lowest "
        f"{min(ratios):.2f}); the paired difference's lower 95% bound is above 0 in "
        f"{significant} of {len(ratios)} cells"
    )
    if exceptions:
        detail += "; not in " + ", ".join(exceptions)
    return Check(
        "independent MAE clearly worse at ε ≤ 1 with ≥ 5 nodes",
        not exceptions and float(np.median(ratios)) > 1.1,
        detail,
    )


def _residual_is_one_over_k(rows: Sequence[Row], config: SimConfig) -> Check | None:
    series = axis_series(rows, config, "n_nodes", "aggregate_noise_var")
    independent = dict(series.get(Variant("independent"), []))
    shown: dict[int, list[str]] = {}
    good = True
    for variant, points in series.items():
        if variant.scheme != "zerosum+residual":
            continue
        for k, est in points:
            if k not in independent:
                continue
            scaled = est.mean / independent[k].mean * k
            good = good and abs(scaled - 1.0) < 0.25
            shown.setdefault(int(k), []).append(f"{variant.construction} {scaled:.2f}")
    if not shown:
        return None
    detail = "; ".join(f"K={k}: {', '.join(v)}" for k, v in sorted(shown.items()))
    return Check(
        "zerosum+residual aggregate noise variance ≈ 1/K of independent",
        good,
        f"K × (variance ratio) along the K axis, 1 is exact: {detail}",
    )


def _attacks_within_bound(attack: Sequence[Row]) -> Check:
    violations = [r for r in attack if whole(r, "within_bound") == 0]
    return Check(
        "empirical attack success never above the DP bound (beyond sampling error)",
        not violations,
        f"{len(attack) - len(violations)} of {len(attack)} "
        "(scheme, observer, ε) attacks within the μ-GDP and (ε, δ) bounds at 99.9 % "
        "confidence",
    )
