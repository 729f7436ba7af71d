"""Reconstruction from the difference of two releases: what the noise prevents.

A small node releases its sums-round sums twice — once without and once with
one new subject (a second session after a recruitment, say). Without noise
the difference of the two ``sum_x`` tensors *is* the subject's pre-scaled
feature vector c = (x − m)/h (m, h: the public bounds' centre and half-range),
so the features come back exactly: x̂ = m + h·ĉ. This is the analytic
counterpart of gradient inversion (the CVB paper's threat: reconstruct a
training example from what a client sends). The sums are uncentred, so
nothing else changes between the two sessions.

The attacker knows the design, so it knows the variance σ² of the noise on
the difference, and it knows the other subjects, so it has a prior for c
(their mean c̄ and variance v per feature). It uses the linear minimum-mean-
square-error estimate ĉ = c̄ + w(Δ − c̄) with w = v/(v + σ²) — exact when
σ² = 0, the prior mean when the noise swamps the signal — clipped to the
public range [-1, 1] of pre-scaled values.

Observers: ``outsider`` differences node 0's two egresses; ``coordinator``
differences the two *aggregates* (every other node's data unchanged), which
for zero-sum noise without residual is exact — the per-egress guarantee says
nothing about the aggregate. Masks are fresh per session, so the two releases'
noise is independent. The attacker clips ĉ to [-1, 1] before mapping back.

Scores, in units of the population feature standard deviations: RMSE of x̂
against x, and an attack success rate in the style of the CVB paper (success
when the reconstruction matches the truth at a similarity of at least 0.5,
here the correlation across features of the standardised x̂ and x — random
guessing reaches it a few per cent of the time with 20 features).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from node.deltab.sums import SUMS, sensitivity
from noise.accounting import gaussian_mu
from simulations.cohorts import clip_features, make_federation, public_bounds
from simulations.config import ReconstructionParams
from simulations.egress_noise import draw_zero_sum
from simulations.schemes import (
    CONSTRUCTIONS,
    Variant,
    effective_collusion_threshold,
    unit_plan,
    variants,
)
from simulations.seeding import child, generator
from simulations.utility import FlatLayout, entry_scales

__all__ = ["RECONSTRUCTION_SCHEMES", "SUCCESS_CORRELATION", "reconstruction_attack"]

FloatArray = NDArray[np.float64]

RECONSTRUCTION_SCHEMES = ("none", "independent", "zerosum", "zerosum+residual")
SUCCESS_CORRELATION = 0.5


def _session_noise(
    variant: Variant,
    params: ReconstructionParams,
    size: int,
    trials: int,
    rng: np.random.Generator,
) -> FloatArray:
    """Unit noise of every node for ``trials`` sessions: (trials, K, size)."""
    k = params.n_nodes
    if variant.scheme == "none":
        return np.zeros((trials, k, size))
    if variant.scheme == "independent":
        return rng.standard_normal((trials, k, size))
    threshold = effective_collusion_threshold(variant.construction, k, params.collusion_threshold)
    plan = unit_plan(variant.construction, k, threshold, variant.residual)
    masks = draw_zero_sum(plan.design, size, rng, batch=(trials,)).noise
    residual = math.sqrt(plan.residual_variance) * rng.standard_normal((trials, k, size))
    return masks + residual


def _difference_variance(variant: Variant, params: ReconstructionParams, observer: str) -> float:
    """Unit-scale variance of the noise on the difference of two sessions, per entry."""
    k = params.n_nodes
    if variant.scheme == "none":
        return 0.0
    if variant.scheme == "independent":
        return 2.0 * (1.0 if observer == "outsider" else k)
    threshold = effective_collusion_threshold(variant.construction, k, params.collusion_threshold)
    plan = unit_plan(variant.construction, k, threshold, variant.residual)
    if observer == "outsider":
        return 2.0 * (plan.design.variance(plan.design.node_ids[0]) + plan.residual_variance)
    return 2.0 * k * plan.residual_variance


def _correlations(a: FloatArray, b: FloatArray) -> FloatArray:
    da = a - a.mean(axis=1, keepdims=True)
    db = b - b.mean(axis=1, keepdims=True)
    denominator = np.sqrt(np.sum(da * da, axis=1) * np.sum(db * db, axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, np.sum(da * db, axis=1) / denominator, 0.0)


def reconstruction_attack(
    params: ReconstructionParams, seed: np.random.SeedSequence
) -> list[dict[str, object]]:
    """One row per (variant, observer): mean RMSE, success rate, and the no-information baseline."""
    fed = make_federation(
        n_nodes=params.n_nodes,
        n_per_node=params.n_per_node,
        n_features=params.n_features,
        site_offset_sd=params.site_offset_sd,
        holdout_size=params.targets,
        seed=child(seed, 0),
    )
    population = fed.population
    bounds = public_bounds(population, params.site_offset_sd)
    layout = FlatLayout.of(SUMS, params.n_features)
    mu_star = gaussian_mu(params.epsilon, params.delta)
    scales = entry_scales(layout, sensitivity(SUMS, bounds), mu_star)
    offset = sum(layout.sizes[: layout.names.index("sum_x")])
    sum_x = slice(offset, offset + params.n_features)
    scale_x = scales[sum_x]
    # The targets' true contributions to sum_x: pre-scaled features.
    targets_x, _ = clip_features(fed.holdout.features, fed.holdout.age, bounds)
    centre, half = bounds.feature_centre, bounds.feature_half
    truth_c = (targets_x - centre) / half
    truth_z = (targets_x - population.feature_mean) / population.feature_sd
    known_x = np.vstack([clip_features(c.features, c.age, bounds)[0] for c in fed.sites])
    known_c = (known_x - centre) / half
    prior_c, prior_v = known_c.mean(axis=0), known_c.var(axis=0)
    prior_z = (centre + half * prior_c - population.feature_mean) / population.feature_sd
    prior_rmse = float(np.mean(np.sqrt(np.mean((truth_z - prior_z) ** 2, axis=1))))
    n = truth_c.shape[0]
    rows: list[dict[str, object]] = []
    chosen = variants(RECONSTRUCTION_SCHEMES, CONSTRUCTIONS)
    for vi, variant in enumerate(chosen):
        rng = generator(child(child(seed, 1), vi))
        # Two sessions per target, every node's sum_x noise in each.
        first = _session_noise(variant, params, params.n_features, n, rng) * scale_x
        second = _session_noise(variant, params, params.n_features, n, rng) * scale_x
        for observer in ("outsider", "coordinator"):
            if observer == "outsider":
                noise = second[:, 0] - first[:, 0]
            else:
                noise = second.sum(axis=1) - first.sum(axis=1)
            variance = _difference_variance(variant, params, observer) * scale_x**2
            weight = prior_v / (prior_v + variance)
            difference = truth_c + noise
            estimate_c = np.clip(prior_c + weight * (difference - prior_c), -1.0, 1.0)
            estimate_z = (centre + half * estimate_c - population.feature_mean) / (
                population.feature_sd
            )
            rmse = np.sqrt(np.mean((estimate_z - truth_z) ** 2, axis=1))
            success = _correlations(estimate_z, truth_z) >= SUCCESS_CORRELATION
            rows.append(
                {
                    "scheme": variant.scheme,
                    "construction": variant.construction,
                    "observer": observer,
                    "targets": n,
                    "rmse_sd": float(rmse.mean()),
                    "rmse_sd_se": float(rmse.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan,
                    "success_rate": float(success.mean()),
                    "successes": int(success.sum()),
                    "prior_rmse_sd": prior_rmse,
                }
            )
    return rows
