"""The dropout scenario's rows (``dropout.csv``) summarised per (graph, K, T, rate, scheme).

Per group of repetitions: the fraction of rounds that end infeasible (with a
95 % Wilson score interval, Wilson 1927), the worst ε any survivor keeps
against an outsider holding the revealed pair terms, the worst survivor's ε
against outsider + T colluders — its median over the rounds that finished
(every survivor revealed) and its worst over all rounds —, the mean share of
survivors left below the per-egress target against T colluders, the
aggregate's noise variance (units of σ_t²) averaged over the finished rounds,
and how many rounds a stricter floor rule (against D and T colluders) ends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

__all__ = ["DropoutSummary", "GroupKey", "graph_label", "summarise_dropout", "wilson_interval"]

Row = Mapping[str, object]


@dataclass(frozen=True, order=True)
class GroupKey:
    """One point of the scenario: graph (with its Harary degree), K, T, dropout rate."""

    graph: str
    harary_degree: int
    n_nodes: int
    collusion_threshold: int
    dropout_rate: float

    @property
    def graph_label(self) -> str:
        return graph_label(self.graph, self.harary_degree)


def graph_label(graph: str, harary_degree: int) -> str:
    return f"harary d={harary_degree}" if graph == "harary" else graph


@dataclass(frozen=True)
class DropoutSummary:
    """What the repetitions of one (point, scheme) show."""

    key: GroupKey
    scheme: str
    rounds: int
    infeasible: int
    infeasible_interval: tuple[float, float]
    infeasible_strict: int
    mean_dropped: float
    epsilon_outsider_worst: float
    epsilon_coalition_finished: float
    epsilon_coalition_worst: float
    exposed_fraction: float
    aggregate_noise_var: float

    @property
    def infeasible_fraction(self) -> float:
        return self.infeasible / self.rounds if self.rounds else math.nan

    @property
    def infeasible_strict_fraction(self) -> float:
        return self.infeasible_strict / self.rounds if self.rounds else math.nan


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson, JASA 1927)."""
    if trials == 0:
        return math.nan, math.nan
    z = float(norm.ppf(0.5 + level / 2.0))
    p = successes / trials
    denominator = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # At p = 0 or 1 the bound is exactly 0 or 1; rounding would leave it a hair inside.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == trials else min(1.0, centre + half)
    return lo, hi


def _float(row: Row, key: str) -> float:
    value = row[key]
    return float(value) if isinstance(value, int | float) else float(str(value))


def _worst(values: Sequence[float]) -> float:
    finite_or_inf = [v for v in values if not math.isnan(v)]
    return max(finite_or_inf) if finite_or_inf else math.nan


def _median(values: Sequence[float]) -> float:
    kept = np.array([v for v in values if not math.isnan(v)])
    return float(np.median(kept)) if kept.size else math.nan


def _mean(values: Sequence[float]) -> float:
    kept = np.array([v for v in values if not math.isnan(v)])
    return float(kept.mean()) if kept.size else math.nan


def summarise_dropout(rows: Sequence[Row]) -> list[DropoutSummary]:
    """One summary per (point, scheme), sorted by point, schemes in the order first seen."""
    groups: dict[tuple[GroupKey, str], list[Row]] = {}
    for r in rows:
        key = GroupKey(
            graph=str(r["graph"]),
            harary_degree=int(_float(r, "harary_degree")),
            n_nodes=int(_float(r, "n_nodes")),
            collusion_threshold=int(_float(r, "collusion_threshold")),
            dropout_rate=_float(r, "dropout_rate"),
        )
        groups.setdefault((key, str(r["scheme"])), []).append(r)
    order = {scheme: i for i, scheme in enumerate(dict.fromkeys(s for _, s in groups))}
    out = []
    for (key, scheme), members in sorted(groups.items(), key=lambda g: (g[0][0], order[g[0][1]])):
        infeasible = sum(int(_float(r, "infeasible")) for r in members)
        out.append(
            DropoutSummary(
                key=key,
                scheme=scheme,
                rounds=len(members),
                infeasible=infeasible,
                infeasible_interval=wilson_interval(infeasible, len(members)),
                infeasible_strict=sum(int(_float(r, "infeasible_strict")) for r in members),
                mean_dropped=_mean([_float(r, "dropped") for r in members]),
                epsilon_outsider_worst=_worst([_float(r, "epsilon_outsider_max") for r in members]),
                epsilon_coalition_finished=_median(
                    [
                        _float(r, "epsilon_coalition_max")
                        for r in members
                        if not int(_float(r, "infeasible"))
                    ]
                ),
                epsilon_coalition_worst=_worst(
                    [_float(r, "epsilon_coalition_max") for r in members]
                ),
                exposed_fraction=_mean([_float(r, "exposed_fraction") for r in members]),
                aggregate_noise_var=_mean([_float(r, "aggregate_noise_var") for r in members]),
            )
        )
    return out
