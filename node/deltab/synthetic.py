"""Synthetic brain-age cohorts with a known ground truth, one or many sites.

The generator follows the spirit of Simulation 1 of Smith et al. (2019),
"Estimation of brain age delta from brain imaging", NeuroImage 200:528–539:
true ages Y from a bounded, optionally skewed distribution; true deltas
δ ~ N(0, σ_δ²); brain age B = Y + δ drives a few latent *ageing* components, a
larger number of latent components are age-free; the latents are mixed into P
imaging features by a sparse, heavy-tailed mixing matrix (Gaussian entries
raised to the fifth power, as in the paper) and measurement noise is added.

For one subject with brain age b, write u = (b − a_ref) / s_ref (a fixed,
population-level reference, so that every site ages along the *same* curve).
Ageing component k is ℓ_k·u + q_k·(u² − 1); random component r is z_r ~ N(0, 1).
With L = [ageing | random] (subjects × latents) and mixing M (latents × P) whose
columns have unit Euclidean norm, feature j of subject i is

    x_ij = μ_j + σ_j · (s_j^site · ((L M)_ij + ε_ij) + o_j^site),   ε_ij ~ N(0, ν²),

where μ_j, σ_j are population feature means and spreads (IDPs come in arbitrary
units), and (s^site, o^site) are a scanner's per-feature scale and offset — the
site effects that make federated brain-age estimation harder than pooled.

Everything is deterministic by seed: each function derives its own
``numpy.random.Generator(PCG64(...))`` streams from a ``SeedSequence`` built
from the caller's seed (never the global RNG, never a truncated seed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Cohort",
    "Federation",
    "Population",
    "SiteEffect",
    "concatenate_cohorts",
    "feature_names",
    "make_cohort",
    "make_federation_cohorts",
    "write_cohort_csv",
]

FloatArray = NDArray[np.float64]
Seed = int | np.random.SeedSequence

# Default per-site age ranges and skews for a federation: deliberately unequal,
# because age-range mismatch between sites is what biases naive averaging.
_SITE_AGE_RANGES: tuple[tuple[float, float], ...] = (
    (45.0, 75.0),
    (50.0, 82.0),
    (40.0, 70.0),
    (55.0, 85.0),
    (45.0, 80.0),
)
_SITE_AGE_SKEWS: tuple[float, ...] = (0.0, 1.0, -0.5, 0.5, -1.0)


def _seed_sequence(seed: Seed) -> np.random.SeedSequence:
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer; got {seed!r}")
    return np.random.SeedSequence(seed)


def _child(seed: np.random.SeedSequence, index: int) -> np.random.SeedSequence:
    """The ``index``-th child of ``seed``, derived without mutating ``seed``.

    ``SeedSequence.spawn`` counts how often it was called, so calling it twice
    on the same object yields different children; deriving the spawn key
    explicitly keeps every call with the same seed reproducible.
    """
    return np.random.SeedSequence(
        entropy=seed.entropy,
        spawn_key=(*seed.spawn_key, index),
        pool_size=seed.pool_size,
    )


def _generator(seed: np.random.SeedSequence) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def _frozen(array: FloatArray) -> FloatArray:
    array.setflags(write=False)
    return array


def feature_names(n_features: int) -> tuple[str, ...]:
    """Column names ``f0001`` … ``fP`` (zero-padded to at least four digits)."""
    width = max(4, len(str(n_features)))
    return tuple(f"f{j:0{width}d}" for j in range(1, n_features + 1))


@dataclass(frozen=True, eq=False)
class SiteEffect:
    """A scanner's per-feature multiplicative scale and additive offset.

    Applied in standardised feature units: x ↦ scale ⊙ x + offset, before the
    population mean and spread are restored. ``scale`` is positive (a scanner
    compresses or stretches a measure; it does not flip its sign).
    """

    name: str
    offset: FloatArray
    scale: FloatArray

    def __post_init__(self) -> None:
        offset = np.asarray(self.offset, dtype=np.float64)
        scale = np.asarray(self.scale, dtype=np.float64)
        if offset.ndim != 1 or scale.shape != offset.shape:
            raise ValueError(
                f"site {self.name!r}: offset and scale must be 1-D of equal length; "
                f"got shapes {offset.shape} and {scale.shape}"
            )
        if not (np.all(np.isfinite(offset)) and np.all(np.isfinite(scale))):
            raise ValueError(f"site {self.name!r}: offset and scale must be finite")
        if np.any(scale <= 0):
            raise ValueError(f"site {self.name!r}: every scale must be positive")
        object.__setattr__(self, "offset", _frozen(offset.copy()))
        object.__setattr__(self, "scale", _frozen(scale.copy()))

    @property
    def n_features(self) -> int:
        return int(self.offset.shape[0])

    @classmethod
    def draw(
        cls,
        name: str,
        n_features: int,
        seed: Seed,
        *,
        offset_sd: float = 0.5,
        scale_sd: float = 0.1,
    ) -> SiteEffect:
        """Draw offsets o_j ~ N(0, offset_sd²) and log-normal scales s_j = exp(N(0, scale_sd²))."""
        if offset_sd < 0 or scale_sd < 0:
            raise ValueError(
                f"offset_sd and scale_sd must be non-negative; got {offset_sd} and {scale_sd}"
            )
        rng = _generator(_seed_sequence(seed))
        offset = rng.normal(0.0, offset_sd, n_features)
        scale = np.exp(rng.normal(0.0, scale_sd, n_features))
        return cls(name=name, offset=offset, scale=scale)


@dataclass(frozen=True, eq=False)
class Population:
    """The ground truth every site shares: ageing curves, mixing, feature units.

    ``ageing`` holds one (ℓ_k, q_k) row per ageing component; ``mixing`` has
    unit-norm columns so every feature carries unit signal variance when the
    latents do; ``noise_sd`` is ν, the measurement noise in those units.
    """

    ageing: FloatArray
    mixing: FloatArray
    feature_mean: FloatArray
    feature_sd: FloatArray
    noise_sd: float
    reference_age: float = 62.5
    reference_scale: float = 10.0

    @property
    def n_features(self) -> int:
        return int(self.mixing.shape[1])

    @property
    def n_latent(self) -> int:
        return int(self.mixing.shape[0])

    @classmethod
    def draw(
        cls,
        n_features: int,
        seed: Seed,
        *,
        n_ageing: int = 3,
        n_random: int = 12,
        quadratic_sd: float = 0.3,
        noise_sd: float = 0.5,
    ) -> Population:
        """Draw a population.

        Linear ageing loadings ℓ_k have random sign and magnitude in [0.5, 1];
        quadratic loadings q_k ~ N(0, quadratic_sd²); mixing entries are
        g⁵ with g ~ N(0, 1) (Smith et al. 2019, Simulation 1), columns then
        scaled to unit norm; feature means μ_j ~ N(0, 5²) and spreads
        σ_j = exp(N(0, 0.5²)), so that standardisation is not a no-op.
        """
        if n_features < 1:
            raise ValueError(f"n_features must be at least 1; got {n_features}")
        if n_ageing < 1 or n_random < 0:
            raise ValueError(f"need n_ageing >= 1 and n_random >= 0; got {n_ageing} and {n_random}")
        if noise_sd < 0 or quadratic_sd < 0:
            raise ValueError("noise_sd and quadratic_sd must be non-negative")
        rng = _generator(_seed_sequence(seed))
        linear = rng.choice([-1.0, 1.0], n_ageing) * rng.uniform(0.5, 1.0, n_ageing)
        quadratic = rng.normal(0.0, quadratic_sd, n_ageing)
        mixing = rng.standard_normal((n_ageing + n_random, n_features)) ** 5
        norms = np.linalg.norm(mixing, axis=0)
        # A column of g⁵ can underflow to all-tiny values but never exactly zero
        # in practice; guard anyway so no feature becomes pure noise by accident.
        norms[norms == 0] = 1.0
        mixing /= norms
        return cls(
            ageing=_frozen(np.column_stack([linear, quadratic])),
            mixing=_frozen(mixing),
            feature_mean=_frozen(rng.normal(0.0, 5.0, n_features)),
            feature_sd=_frozen(np.exp(rng.normal(0.0, 0.5, n_features))),
            noise_sd=float(noise_sd),
        )

    def latents(self, brain_age: FloatArray, rng: np.random.Generator) -> FloatArray:
        """Latent matrix L: ageing components of brain age, then N(0, 1) components."""
        u = (brain_age - self.reference_age) / self.reference_scale
        ageing = np.outer(u, self.ageing[:, 0]) + np.outer(u * u - 1.0, self.ageing[:, 1])
        n_random = self.n_latent - self.ageing.shape[0]
        random = rng.standard_normal((brain_age.shape[0], n_random))
        return np.hstack([ageing, random])


@dataclass(frozen=True, eq=False)
class Cohort:
    """One site's subjects: ids, true ages, features (subjects × P), true deltas."""

    site: str
    ids: tuple[str, ...]
    age: FloatArray
    features: FloatArray
    true_delta: FloatArray
    feature_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.age.shape != (n,) or self.true_delta.shape != (n,):
            raise ValueError(f"cohort {self.site!r}: age and true_delta must have {n} entries")
        if self.features.ndim != 2 or self.features.shape[0] != n:
            raise ValueError(f"cohort {self.site!r}: features must have {n} rows")
        if not self.feature_names:
            object.__setattr__(self, "feature_names", feature_names(self.features.shape[1]))
        for array in (self.age, self.features, self.true_delta):
            array.setflags(write=False)

    @property
    def n_subjects(self) -> int:
        return len(self.ids)

    @property
    def n_features(self) -> int:
        return int(self.features.shape[1])

    @property
    def brain_age(self) -> FloatArray:
        """The gold-standard brain age B = Y + δ."""
        return self.age + self.true_delta


@dataclass(frozen=True, eq=False)
class Federation:
    """Several sites drawn from one population, plus a holdout from the same scanners."""

    population: Population
    sites: tuple[Cohort, ...]
    site_effects: tuple[SiteEffect, ...]
    holdout: Cohort

    def pooled(self) -> Cohort:
        """All training sites concatenated (the data a pooled fit would see)."""
        return concatenate_cohorts(self.sites, site="pooled")


def _draw_ages(
    rng: np.random.Generator, n: int, age_range: tuple[float, float], skew: float
) -> FloatArray:
    """Ages on [lo, hi]: uniform for skew 0, else lo + (hi − lo)·Beta.

    skew > 0 uses Beta(1, 1 + skew) (more young subjects, right-skewed);
    skew < 0 uses Beta(1 + |skew|, 1) (more old subjects, left-skewed).
    """
    lo, hi = age_range
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"age_range must be finite with low < high; got {age_range}")
    if not math.isfinite(skew):
        raise ValueError(f"age_skew must be finite; got {skew}")
    if skew == 0:
        unit = rng.random(n)
    elif skew > 0:
        unit = rng.beta(1.0, 1.0 + skew, n)
    else:
        unit = rng.beta(1.0 - skew, 1.0, n)
    return lo + (hi - lo) * unit


def make_cohort(
    n_subjects: int,
    n_features: int,
    *,
    seed: Seed,
    population: Population | None = None,
    population_seed: Seed | None = None,
    site: SiteEffect | None = None,
    age_range: tuple[float, float] = (45.0, 80.0),
    age_skew: float = 0.0,
    delta_sd: float = 2.0,
    missing_fraction: float = 0.0,
    name: str | None = None,
) -> Cohort:
    """Draw one cohort of ``n_subjects`` with ``n_features`` features.

    ``seed`` draws the subjects (ages, deltas, latents, noise). The
    population — ageing curves, mixing, feature units — is ``population`` if
    given, else drawn from ``population_seed``, else from ``seed`` (so a single
    call is self-contained). Cohorts are comparable, i.e. one model fits them
    all, only when they share the population: pass the same ``population`` or
    the same ``population_seed`` and vary ``seed``. The population of seed s is
    child 0 of ``SeedSequence(s)`` and the subjects use child 1, so
    ``population_seed=s`` with ``seed=s`` is the same cohort as ``seed=s``
    alone. ``site`` applies a scanner effect (none by default).
    ``missing_fraction`` of feature cells, chosen uniformly, become NaN.
    Subject ids are ``<name>-000001`` …; ``name`` defaults to the site's name
    or ``"site"``.
    """
    if n_subjects < 1:
        raise ValueError(f"n_subjects must be at least 1; got {n_subjects}")
    if delta_sd < 0 or not math.isfinite(delta_sd):
        raise ValueError(f"delta_sd must be a non-negative number; got {delta_sd}")
    if not 0.0 <= missing_fraction < 1.0:
        raise ValueError(f"missing_fraction must be in [0, 1); got {missing_fraction}")
    root = _seed_sequence(seed)
    if population is not None and population_seed is not None:
        raise ValueError("give population or population_seed, not both")
    if population is None:
        source = root if population_seed is None else _seed_sequence(population_seed)
        population = Population.draw(n_features, _child(source, 0))
    if population.n_features != n_features:
        raise ValueError(
            f"population has {population.n_features} features but n_features is {n_features}"
        )
    if site is not None and site.n_features != n_features:
        raise ValueError(
            f"site {site.name!r} has effects for {site.n_features} features; expected {n_features}"
        )
    rng = _generator(_child(root, 1))
    age = _draw_ages(rng, n_subjects, age_range, age_skew)
    delta = rng.normal(0.0, delta_sd, n_subjects)
    signal = population.latents(age + delta, rng) @ population.mixing
    signal += rng.normal(0.0, population.noise_sd, signal.shape)
    if site is not None:
        signal *= site.scale
        signal += site.offset
    signal *= population.feature_sd
    signal += population.feature_mean
    if missing_fraction > 0:
        signal[rng.random(signal.shape) < missing_fraction] = np.nan
    label = name if name is not None else (site.name if site is not None else "site")
    return Cohort(
        site=label,
        ids=tuple(f"{label}-{i:06d}" for i in range(1, n_subjects + 1)),
        age=age,
        features=signal,
        true_delta=delta,
    )


def concatenate_cohorts(cohorts: Sequence[Cohort], *, site: str) -> Cohort:
    """Stack cohorts subject-wise (they must share the feature names)."""
    if not cohorts:
        raise ValueError("need at least one cohort to concatenate")
    names = cohorts[0].feature_names
    for cohort in cohorts[1:]:
        if cohort.feature_names != names:
            raise ValueError(
                f"cohort {cohort.site!r} has different features from {cohorts[0].site!r}"
            )
    return Cohort(
        site=site,
        ids=tuple(i for c in cohorts for i in c.ids),
        age=np.concatenate([c.age for c in cohorts]),
        features=np.vstack([c.features for c in cohorts]),
        true_delta=np.concatenate([c.true_delta for c in cohorts]),
        feature_names=names,
    )


def _split_proportionally(total: int, weights: Sequence[int]) -> list[int]:
    """Integer parts of ``total`` proportional to ``weights`` (largest remainder)."""
    weight_sum = sum(weights)
    exact = [total * w / weight_sum for w in weights]
    parts = [math.floor(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda k: exact[k] - parts[k], reverse=True)
    for k in order[: total - sum(parts)]:
        parts[k] += 1
    return parts


def make_federation_cohorts(
    sizes: Sequence[int],
    n_features: int,
    seed: Seed,
    *,
    holdout_size: int = 500,
    age_ranges: Sequence[tuple[float, float]] | None = None,
    age_skews: Sequence[float] | None = None,
    offset_sd: float = 0.5,
    scale_sd: float = 0.1,
    delta_sd: float = 2.0,
) -> Federation:
    """Sites ``site1`` … ``siteK`` of the given sizes from one shared population.

    Each site gets its own scanner effect and age distribution (by default
    cycling through deliberately unequal ranges and skews). The holdout has
    ``holdout_size`` subjects split across the sites in proportion to their
    sizes, each part drawn through its site's scanner and age distribution —
    new subjects from the same scanners, the realistic test set.
    """
    if not sizes:
        raise ValueError("sizes must name at least one site")
    if any(s < 1 for s in sizes):
        raise ValueError(f"every site needs at least one subject; got sizes {list(sizes)}")
    if holdout_size < 0:
        raise ValueError(f"holdout_size must be non-negative; got {holdout_size}")
    k = len(sizes)
    ranges = (
        list(age_ranges)
        if age_ranges is not None
        else [_SITE_AGE_RANGES[i % len(_SITE_AGE_RANGES)] for i in range(k)]
    )
    skews = (
        list(age_skews)
        if age_skews is not None
        else [_SITE_AGE_SKEWS[i % len(_SITE_AGE_SKEWS)] for i in range(k)]
    )
    if len(ranges) != k or len(skews) != k:
        raise ValueError(
            f"{k} sites need {k} age ranges and skews; got {len(ranges)} and {len(skews)}"
        )
    root = _seed_sequence(seed)
    population = Population.draw(n_features, _child(root, 0))
    effects: list[SiteEffect] = []
    sites: list[Cohort] = []
    holdout_parts: list[Cohort] = []
    holdout_sizes = _split_proportionally(holdout_size, sizes)
    for i in range(k):
        site_seed = _child(root, i + 1)
        name = f"site{i + 1}"
        effect = SiteEffect.draw(
            name, n_features, _child(site_seed, 0), offset_sd=offset_sd, scale_sd=scale_sd
        )
        effects.append(effect)
        for size, child, label, into in (
            (sizes[i], 1, name, sites),
            (holdout_sizes[i], 2, f"holdout-{name}", holdout_parts),
        ):
            if size:
                into.append(
                    make_cohort(
                        size,
                        n_features,
                        seed=_child(site_seed, child),
                        population=population,
                        site=effect,
                        age_range=ranges[i],
                        age_skew=skews[i],
                        delta_sd=delta_sd,
                        name=label,
                    )
                )
    if holdout_parts:
        holdout = concatenate_cohorts(holdout_parts, site="holdout")
    else:
        empty = np.empty(0)
        holdout = Cohort(
            site="holdout",
            ids=(),
            age=empty,
            features=np.empty((0, n_features)),
            true_delta=empty.copy(),
        )
    return Federation(
        population=population, sites=tuple(sites), site_effects=tuple(effects), holdout=holdout
    )


def _delimiter_for(path: Path) -> str:
    return "\t" if path.suffix.lower() in {".tsv", ".tab"} else ","


def write_cohort_csv(
    cohort: Cohort,
    path: str | Path,
    include_id: bool = True,
    *,
    include_age: bool = True,
    include_features: bool = True,
    header: bool = True,
    delimiter: str | None = None,
) -> Path:
    """Write ``id`` (optional), ``age``, then one column per feature (f0001 …).

    The delimiter is a tab for ``.tsv``/``.tab`` files and a comma otherwise,
    unless given. Values are written with 7 significant digits (ages with 6
    decimals), NaN as an empty cell. ``include_age=False`` or
    ``include_features=False`` write the two halves a ``deltab``-style run
    takes as separate files.
    """
    target = Path(path)
    sep = delimiter if delimiter is not None else _delimiter_for(target)
    columns: list[str] = []
    formats: list[str] = []
    blocks: list[FloatArray] = []
    if include_age:
        columns.append("age")
        formats.append("%.6f")
        blocks.append(cohort.age[:, None])
    if include_features:
        columns.extend(cohort.feature_names)
        formats.extend(["%.7g"] * cohort.n_features)
        blocks.append(cohort.features)
    if not columns and not include_id:
        raise ValueError("nothing to write: every column was excluded")
    values = np.hstack(blocks) if blocks else np.empty((cohort.n_subjects, 0))
    row_format = sep.join(formats)
    with target.open("w", encoding="utf-8", newline="") as out:
        if header:
            out.write(sep.join((["id"] if include_id else []) + columns) + "\n")
        for i in range(cohort.n_subjects):
            # Missing cells are written empty, the convention of R and spreadsheets.
            cells = (row_format % tuple(values[i])).replace("nan", "") if formats else ""
            if include_id:
                cells = f"{cohort.ids[i]}{sep}{cells}" if formats else cohort.ids[i]
            out.write(cells + "\n")
    return target
