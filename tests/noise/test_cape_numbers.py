"""Reproduce the CAPE numbers (Imtiaz, Mohammadi & Sarwate, arXiv 1904.10059) for K = 10, τ = 1.

Each node's zero-sum term has variance τ²(1 − 1/K) = 0.9 and its residual
τ²/K = 0.1, so each release carries 1.0, as much as independent noise; yet
the aggregate mean carries only 0.1/K = 0.01 instead of 1.0/K = 0.1. When m
other nodes collude, an honest node keeps 0.1·(K − m) under the pairwise
construction and τ²(1 − 1/n_H) + 0.1 with n_H = K − m under CAPE.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from noise.designs import (
    Design,
    cape_design,
    complete_design,
    conditional_covariance,
    explicit_design,
    remaining_variance,
)
from noise.residual import cape_residual_variance, residual_noise

K = 10
TAU2 = 1.0
IDS = [f"site{i:02d}" for i in range(K)]
RESIDUAL = cape_residual_variance(TAU2, K)

PUBLISHED = {
    "pairwise": {3: 0.7, 5: 0.5, 9: 0.1},
    "cape": {3: 0.957, 5: 0.900, 9: 0.100},
}


def _design(construction: str) -> Design:
    if construction == "cape":
        return cape_design(IDS, TAU2)
    return complete_design(IDS, TAU2 * (1 - 1 / K))


@pytest.mark.parametrize("construction", ["pairwise", "cape"])
def test_per_release_and_aggregate_variances(construction: str) -> None:
    design = _design(construction)
    assert math.isclose(RESIDUAL, 0.1, rel_tol=1e-15)
    for node in IDS:
        assert design.variance(node) == pytest.approx(0.9, rel=1e-14)
        assert design.variance(node) + RESIDUAL == pytest.approx(1.0, rel=1e-14)
    # the zero-sum part cancels: the aggregate mean carries K residuals / K²
    r = design.covariance()
    ones = np.ones(K)
    assert abs(ones @ r @ ones) < 1e-13
    aggregate_mean = (ones @ (r + RESIDUAL * np.eye(K)) @ ones) / K**2
    assert aggregate_mean == pytest.approx(0.01, rel=1e-12)
    independent_mean = (ones @ np.eye(K) @ ones) / K**2  # same 1.0 per release
    assert independent_mean == pytest.approx(0.1, rel=1e-15)


def test_pairwise_construction_is_the_complete_graph_with_tau2_over_k() -> None:
    pairs = {(a, b): TAU2 / K for a, b in itertools.combinations(IDS, 2)}
    explicit = explicit_design(IDS, pairs)
    assert np.allclose(explicit.covariance(), _design("pairwise").covariance(), rtol=0, atol=1e-15)
    assert np.allclose(explicit.covariance(), _design("cape").covariance(), rtol=0, atol=1e-15)


@pytest.mark.parametrize("construction", ["pairwise", "cape"])
@pytest.mark.parametrize("colluders", [3, 5, 9])
def test_honest_node_remaining_variance(construction: str, colluders: int) -> None:
    design = _design(construction)
    coalition = IDS[K - colluders :]
    left = remaining_variance(design, coalition, RESIDUAL)
    assert round(left[IDS[0]], 3) == PUBLISHED[construction][colluders]
    assert len(left) == K - colluders


def _regression_residual_variance(target: np.ndarray, known: np.ndarray) -> float:
    """Variance left in ``target`` after the best linear prediction from ``known``.

    For jointly Gaussian noise the linear prediction is the conditional mean,
    so this is what a coalition holding ``known`` cannot explain.
    """
    coef, *_ = np.linalg.lstsq(known, target, rcond=None)
    return float(np.mean((target - known @ coef) ** 2))


def _tolerance(variance: float, n: int) -> float:
    return 5 * variance * math.sqrt(2 / n)  # 5 standard errors of a sample variance


def test_cape_simulation_matches_published_numbers() -> None:
    n = 100_000
    rng = np.random.default_rng(19041005)
    draws = rng.standard_normal((n, K)) * math.sqrt(TAU2)  # ê_k
    total = draws.sum(axis=1)  # the secure sum Σê
    zero_sum = draws - total[:, None] / K  # e_k = ê_k − Σê/K
    residual = residual_noise((n, K), math.sqrt(RESIDUAL), rng=rng)
    release = zero_sum + residual
    assert np.allclose(zero_sum.sum(axis=1), 0.0, atol=1e-12)
    for k in range(K):
        assert abs(zero_sum[:, k].var() - 0.9) < _tolerance(0.9, n)
        assert abs(residual[:, k].var() - 0.1) < _tolerance(0.1, n)
        assert abs(release[:, k].var() - 1.0) < _tolerance(1.0, n)
    assert abs(release.mean(axis=1).var() - 0.01) < _tolerance(0.01, n)
    independent = rng.standard_normal((n, K))
    assert abs(independent.mean(axis=1).var() - 0.1) < _tolerance(0.1, n)
    for colluders, published in PUBLISHED["cape"].items():
        coalition = list(range(K - colluders, K))
        known = np.column_stack([draws[:, coalition], total])  # own ê_j and Σê
        left = _regression_residual_variance(release[:, 0], known)
        assert abs(left - published) < _tolerance(published, n) + 5e-4  # + rounding to 3 dp


def test_pairwise_simulation_matches_published_numbers() -> None:
    n = 60_000
    rng = np.random.default_rng(20190423)
    design = _design("pairwise")
    pairs = list(itertools.combinations(range(K), 2))
    z = rng.standard_normal((n, len(pairs)))
    zero_sum = np.zeros((n, K))
    for column, (i, j) in enumerate(pairs):
        term = design.pair_std(IDS[i], IDS[j]) * z[:, column]
        zero_sum[:, i] += term
        zero_sum[:, j] -= term
    release = zero_sum + residual_noise((n, K), math.sqrt(RESIDUAL), rng=rng)
    assert np.allclose(zero_sum.sum(axis=1), 0.0, atol=1e-12)
    assert abs(zero_sum[:, 0].var() - 0.9) < _tolerance(0.9, n)
    assert abs(release.mean(axis=1).var() - 0.01) < _tolerance(0.01, n)
    for colluders, published in PUBLISHED["pairwise"].items():
        coalition = set(range(K - colluders, K))
        seen = [c for c, (i, j) in enumerate(pairs) if i in coalition or j in coalition]
        left = _regression_residual_variance(release[:, 0], z[:, seen])
        assert abs(left - published) < _tolerance(published, n)


def test_coalition_learns_less_under_cape_than_pairwise() -> None:
    """Same marginal covariance, but CAPE colluders know only their own ê, not shared pair terms."""
    for colluders in range(1, K - 1):
        coalition = IDS[K - colluders :]
        _, cape = conditional_covariance(_design("cape"), coalition, RESIDUAL)
        _, pairwise = conditional_covariance(_design("pairwise"), coalition, RESIDUAL)
        assert cape[0, 0] > pairwise[0, 0]
