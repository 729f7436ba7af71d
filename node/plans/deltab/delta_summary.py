"""A node's differentially private summary of its subjects' brain-age delta (discrete Laplace).

Once the federated model is built, each node may release, as an output of its
own, the mean, standard deviation and quantiles of its subjects' delta
δ̂ᵢ = (brain age − age) under the Laplace mechanism (Dwork, McSherry, Nissim &
Smith 2006). The configuration, ``[plan.delta_summary]``, fixes everything the
noise depends on, so it is public and the same on every node:

* the declared delta range [L, H] (years), width W = H − L: each δ̂ᵢ is
  clipped to it;
* N₀ = ``min_cohort_size``: a node with fewer subjects releases nothing, so of
  two neighbouring cohorts that can release, the smaller has N ≥ N₀;
* ε, split equally over three queries.

Neighbouring cohorts differ by adding or removing one subject, as for every
other release of the node. For values in [L, H] with centre c = (L + H)/2 and
a smaller cohort of N ≥ N₀ subjects, one subject x more changes

* the mean m by (x − m)/(N + 1), at most W/(N + 1) < W/N₀;
* the second moment about the centre, s = Σ(xᵢ − c)²/N, by
  ((x − c)² − s)/(N + 1), both terms in [0, W²/4], so by less than W²/(4N₀);
* a histogram of the clipped deltas over B public bins by one count (L1).

Each query is released on a published grid g (10⁻⁴ years for the mean,
10⁻⁴ years² for the second moment, one count for the histogram): the node
rounds the exact value to the nearest multiple, k = round(value/g), and adds
an integer drawn from the discrete Laplace distribution Lap_Z(b), P[y] ∝
exp(−|y|/b) (``noise.discrete.discrete_laplace``, from the node's private
keyed stream). Rounding moves k by at most one more than the value moves in
grid units, so k has L1 sensitivity Δ_g = ⌊Δ/g⌋ + 1 (Δ_g = 1 for the counts);
with b = Δ_g/(ε/3) each release is (ε/3)-DP (the discrete Laplace mechanism,
Canonne, Kamath & Steinke 2020, §2) and the three together ε-DP (basic
composition). The released value is g·(k + y): an integer times the grid, so
no low-order bits of a floating-point sample exist to leak (Mironov 2012, CCS).
The variance is max(s̃ − (m̃ − c)², 0), the
standard deviation its square root, and the quantiles are read off the
noised histogram (its counts floored at 0, then the cumulative count
interpolated linearly inside a bin): post-processing, no further cost.

These bounds need a model that does not depend on the subject: the node
passes the deltas under the model fitted on the other nodes' sums (the plan's
``summary_deltas``, docs/design.md §8), so one subject changes its own delta
only and the summary is ε-DP in the cohort against any observer (the ledger
adds its ε to every class).

Limits. The noise scale uses N₀, not the node's own N:
a node with N ≫ N₀ pays more noise than its N would need, the price of a
scale that reveals nothing about N.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from noise.discrete import discrete_laplace
from noise.residual import private_noise_key
from proto.federation.checks import ConfigError, finite, positive, whole

__all__ = [
    "DEFAULT_QUANTILES",
    "DeltaSummary",
    "DeltaSummarySettings",
    "Query",
    "quantiles_from_histogram",
    "summarise",
]

DEFAULT_QUANTILES: Final = (0.05, 0.25, 0.5, 0.75, 0.95)
_KEYS: Final = ("enabled", "epsilon", "delta_low", "delta_high", "bins", "quantiles")
_TABLE: Final = "plan.delta_summary"
# The published grid of the mean (years) and second moment (years²); counts are whole.
ROUNDING: Final = 1e-4
GRIDS: Final = {"mean": ROUNDING, "second_moment": ROUNDING, "histogram": 1.0}
# The private stream's purpose for the summary's draws (noise.residual).
NOISE_PURPOSE: Final = "delta-summary"
QUERIES: Final = ("mean", "second_moment", "histogram")

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class DeltaSummarySettings:
    """``[plan.delta_summary]``: whether to release, ε, the public delta range, bins, quantiles."""

    enabled: bool = False
    epsilon: float = 1.0
    delta_low: float = -15.0
    delta_high: float = 15.0
    bins: int = 30
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> DeltaSummarySettings:
        for key, value in table.items():
            if key not in _KEYS:
                raise ConfigError(
                    f"{_TABLE}.{key}", value, f"unknown setting; expected one of {', '.join(_KEYS)}"
                )
        enabled = table.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{_TABLE}.enabled", enabled, "must be true or false")
        epsilon = positive(f"{_TABLE}.epsilon", table.get("epsilon", cls.epsilon))
        if epsilon > 100:
            raise ConfigError(f"{_TABLE}.epsilon", epsilon, "must be at most 100")
        low = finite(f"{_TABLE}.delta_low", table.get("delta_low", cls.delta_low))
        high = finite(f"{_TABLE}.delta_high", table.get("delta_high", cls.delta_high))
        if not high > low:
            raise ConfigError(f"{_TABLE}.delta_high", high, f"must exceed delta_low = {low!r}")
        if high - low > 200:
            raise ConfigError(
                f"{_TABLE}.delta_high", high, "delta_high − delta_low must be at most 200 years"
            )
        bins = whole(f"{_TABLE}.bins", table.get("bins", cls.bins), 2, 1000)
        raw = table.get("quantiles", list(DEFAULT_QUANTILES))
        if not isinstance(raw, list | tuple) or not raw:
            raise ConfigError(f"{_TABLE}.quantiles", raw, "must be a non-empty list of numbers")
        quantiles = tuple(finite(f"{_TABLE}.quantiles[{i}]", q) for i, q in enumerate(raw))
        for i, q in enumerate(quantiles):
            if not 0 < q < 1:
                raise ConfigError(f"{_TABLE}.quantiles[{i}]", q, "must lie strictly in (0, 1)")
        if list(quantiles) != sorted(set(quantiles)):
            raise ConfigError(f"{_TABLE}.quantiles", list(raw), "must be increasing, no repeats")
        return cls(enabled, epsilon, low, high, bins, quantiles)

    def to_table(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "epsilon": self.epsilon,
            "delta_low": self.delta_low,
            "delta_high": self.delta_high,
            "bins": self.bins,
            "quantiles": list(self.quantiles),
        }

    @property
    def width(self) -> float:
        return self.delta_high - self.delta_low

    def queries(self, n_floor: int) -> tuple[Query, ...]:
        """The three noised queries: sensitivity, ε share and Laplace scale of each."""
        if n_floor < 1:
            raise ValueError(f"the public minimum cohort size must be at least 1; got {n_floor}")
        share = self.epsilon / len(QUERIES)
        w = self.width
        return (
            Query("mean", w / n_floor, share, f"W/N₀ = {w:g}/{n_floor}", GRIDS["mean"]),
            Query(
                "second_moment",
                w * w / (4 * n_floor),
                share,
                f"W²/(4N₀) = {w:g}²/(4·{n_floor})",
                GRIDS["second_moment"],
            ),
            Query("histogram", 1.0, share, "one count (L1), add or remove one subject", 1.0),
        )


@dataclass(frozen=True)
class Query:
    """One discrete-Laplace query on its grid g: L1 sensitivity, ε, and the scale.

    ``sensitivity`` is Δ in the statistic's units; on the grid the rounded
    value moves by at most Δ_g = ⌊Δ/g⌋ + 1 units (1 for counts, which need no
    rounding), and the noise Lap_Z(b) has b = Δ_g/ε grid units; ``scale`` is
    b·g in the statistic's units.
    """

    name: str
    sensitivity: float
    epsilon: float
    derivation: str
    grid: float = 1.0

    @property
    def grid_sensitivity(self) -> int:
        """Δ_g in grid units (module docstring)."""
        if self.grid == 1.0 and float(self.sensitivity).is_integer():
            return int(self.sensitivity)
        return math.floor(self.sensitivity / self.grid) + 1

    @property
    def scale_units(self) -> float:
        """b in grid units."""
        return self.grid_sensitivity / self.epsilon

    @property
    def scale(self) -> float:
        return self.scale_units * self.grid


@dataclass(frozen=True)
class DeltaSummary:
    """What one node releases (noised) and what stays in the TRE (exact, draws)."""

    settings: DeltaSummarySettings
    n_subjects: int
    n_floor: int
    clipped: int
    queries: tuple[Query, ...]
    released: Mapping[str, float]
    exact: Mapping[str, float]
    noised_histogram: tuple[float, ...]
    exact_histogram: tuple[int, ...]

    @property
    def edges(self) -> FloatArray:
        s = self.settings
        return np.linspace(s.delta_low, s.delta_high, s.bins + 1)


def _quantile_name(q: float) -> str:
    return f"q{100 * q:g}"


def quantiles_from_histogram(
    counts: ArrayLike, edges: ArrayLike, quantiles: Sequence[float]
) -> FloatArray:
    """Quantiles read off a histogram: counts floored at 0, linear inside a bin.

    With no positive count left every quantile is the middle of the range.
    """
    c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    e = np.asarray(edges, dtype=np.float64)
    total = float(c.sum())
    if total <= 0:
        return np.full(len(quantiles), 0.5 * (e[0] + e[-1]))
    cumulative = np.concatenate([[0.0], np.cumsum(c)])
    out = np.empty(len(quantiles))
    for i, q in enumerate(quantiles):
        target = q * total
        b = int(np.searchsorted(cumulative, target, side="left"))
        b = min(max(b, 1), c.size)
        inside = c[b - 1]
        frac = 0.0 if inside <= 0 else (target - cumulative[b - 1]) / inside
        out[i] = e[b - 1] + min(max(frac, 0.0), 1.0) * (e[b] - e[b - 1])
    return out


def _rounded(value: float) -> float:
    return round(value / ROUNDING) * ROUNDING


def _noised(query: Query, values: ArrayLike, seed: bytes) -> FloatArray:
    """g·(round(values/g) + y), y ~ Lap_Z(b) from the private stream (module docstring)."""
    exact = np.atleast_1d(np.asarray(values, dtype=np.float64))
    units = np.rint(exact / query.grid).astype(np.int64)
    key = private_noise_key(seed, purpose=NOISE_PURPOSE, round_index=0, tensor=query.name)
    units += discrete_laplace(key, query.scale_units, units.size)
    out: FloatArray = units.astype(np.float64) * query.grid
    return out


def summarise(
    deltas: ArrayLike,
    settings: DeltaSummarySettings,
    *,
    n_floor: int,
    seed: bytes,
) -> DeltaSummary:
    """Clip, compute the three queries, add discrete Laplace noise; derive SD and quantiles.

    ``seed`` keys the node's private noise stream (``noise.residual.private_noise_seed``):
    the same seed gives the same draws, so a restarted node releases the same values.
    """
    d = np.asarray(deltas, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"deltas must be a non-empty vector; got shape {d.shape}")
    if not np.isfinite(d).all():
        raise ValueError("deltas must be finite (the model predicted NaN or infinity)")
    if d.size < n_floor:
        raise ValueError(
            f"{d.size} subjects is below the minimum cohort size {n_floor}; nothing is released"
        )
    low, high = settings.delta_low, settings.delta_high
    clipped_count = int(np.count_nonzero((d < low) | (d > high)))
    c = np.clip(d, low, high)
    centre = 0.5 * (low + high)
    mean = float(c.mean())
    second = float(np.mean((c - centre) ** 2))
    edges = np.linspace(low, high, settings.bins + 1)
    exact_hist, _ = np.histogram(c, bins=edges)
    queries = settings.queries(n_floor)
    by_name = {q.name: q for q in queries}
    noisy_mean = float(_noised(by_name["mean"], mean, seed)[0])
    noisy_second = float(_noised(by_name["second_moment"], second, seed)[0])
    noisy_hist = _noised(by_name["histogram"], exact_hist, seed)

    def derived(m: float, s: float, hist: ArrayLike) -> dict[str, float]:
        variance = max(s - (m - centre) ** 2, 0.0)
        values = {"mean": m, "second_moment": s, "variance": variance, "sd": math.sqrt(variance)}
        for q, value in zip(
            settings.quantiles,
            quantiles_from_histogram(hist, edges, settings.quantiles),
            strict=True,
        ):
            values[_quantile_name(q)] = float(value)
        return values

    noised = derived(noisy_mean, noisy_second, noisy_hist)
    released = {k: _rounded(v) for k, v in noised.items()}
    exact = derived(mean, second, exact_hist)
    # The exact quantiles of the clipped deltas themselves, for the checker's comparison.
    for q, value in zip(settings.quantiles, np.quantile(c, settings.quantiles), strict=True):
        exact[_quantile_name(q)] = float(value)
    return DeltaSummary(
        settings=settings,
        n_subjects=int(d.size),
        n_floor=n_floor,
        clipped=clipped_count,
        queries=queries,
        released=released,
        exact=exact,
        noised_histogram=tuple(float(x) for x in noisy_hist),
        exact_histogram=tuple(int(x) for x in exact_hist),
    )


def statistic_meaning(name: str) -> str:
    """One sentence on what a released statistic is."""
    if name == "mean":
        return "mean brain-age delta of the node's subjects (years), discrete-Laplace-noised"
    if name == "second_moment":
        return (
            "mean squared distance of the delta from the centre of the declared range "
            "(years²), discrete-Laplace-noised"
        )
    if name == "variance":
        return (
            "variance of the delta (years², divisor N): max(second moment − (mean − centre)², "
            "0), post-processing"
        )
    if name == "sd":
        return "standard deviation of the delta (years): √variance, post-processing"
    if name.startswith("q"):
        return (
            f"{name[1:]}th percentile of the delta (years), read off the noised "
            "histogram: post-processing"
        )
    raise ValueError(f"unknown statistic {name!r}")
