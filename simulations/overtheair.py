"""Reproduction: zero-sum perturbations leave gradient descent's optimality gap unchanged.

Liao, Chen & Larsson ("Over-the-air federated learning with privacy protection
via correlated additive perturbations", arXiv 2210.02235, 2022) model K users
sending α_k(∇F_k(w) + n_k) over a channel that adds z ~ N(0, N₀ I); after
channel inversion the server's gradient estimate is

    ĝ = (1/K) Σ_k (∇F_k(w) + n_k) + z/(K·sqrt(η)),

and w ← w − λĝ with λ = 1/L. With perturbations whose covariance R across
users has 1ᵀR1 = 0 the Σ_k n_k term vanishes, so their bound on the expected
optimality gap (their eq. 30) contains only the channel noise; uncorrelated
perturbations (diagonal R) add Σ_k n_k with variance tr(R) per coordinate.

Here (real-valued, channel already inverted): user k holds a ridge-regression
loss F_k(w) = ‖A_k w − b_k‖²/(2n) + ρ‖w‖²/2, so F = (1/K)Σ F_k is
μ-strongly convex and L-smooth with μ, L the extreme eigenvalues of
H = (1/K)Σ A_kᵀA_k/n + ρI. Three runs share the same data, start and channel
noise: no perturbation; zero-sum perturbations from the complete-graph design
of ``noise.designs.complete_design`` (R_kk = σ², drawn by
``simulations.egress_noise``); and uncorrelated ones with R = σ²I (equal
trace). The exact expected gap of each is also computed: with e_t = w_t − w*,
e_{t+1} = (I − λH)e_t − λξ_t and ξ_t ~ N(0, s²I), so in H's eigenbasis the
expected gap after T steps is ½Σ_i h_i[(1 − λh_i)^{2T} e_{0,i}² +
λ²s²(1 − (1 − λh_i)^{2T})/(1 − (1 − λh_i)²)], with s² = N₀/(K²η) for the
channel alone and s² = N₀/(K²η) + σ²/K with uncorrelated perturbations.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from noise.designs import complete_design
from simulations.config import OverTheAirParams
from simulations.egress_noise import draw_zero_sum
from simulations.schemes import node_ids
from simulations.seeding import child, generator

__all__ = ["PERTURBATIONS", "expected_gap", "optimality_gaps"]

FloatArray = NDArray[np.float64]

PERTURBATIONS = ("none", "zero_sum", "uncorrelated")


def _problem(
    params: OverTheAirParams, rng: np.random.Generator
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per-user (A_k, b_k) stacked as (K, n, d) and (K, n), and the true w used to make b."""
    k, n, d = params.n_users, params.samples_per_user, params.dim
    a = rng.standard_normal((k, n, d))
    truth = rng.standard_normal(d)
    b = a @ truth + rng.standard_normal((k, n))
    return a, b, truth


def _hessian(params: OverTheAirParams, a: FloatArray) -> FloatArray:
    n = params.samples_per_user
    gram: FloatArray = np.einsum("knd,kne->de", a, a) / (params.n_users * n)
    return gram + params.ridge * np.eye(params.dim)


def _loss(params: OverTheAirParams, a: FloatArray, b: FloatArray, w: FloatArray) -> float:
    residual = a @ w - b
    n = params.samples_per_user
    return float(np.mean(np.sum(residual**2, axis=1)) / (2 * n) + params.ridge * (w @ w) / 2)


def _optimum(params: OverTheAirParams, a: FloatArray, b: FloatArray) -> FloatArray:
    h = _hessian(params, a)
    rhs = np.einsum("knd,kn->d", a, b) / (params.n_users * params.samples_per_user)
    return np.linalg.solve(h, rhs)


def expected_gap(
    params: OverTheAirParams, a: FloatArray, b: FloatArray, perturbation: str
) -> float:
    """Exact E[F(w_T)] − F* for this problem from w_0 = 0 (module docstring)."""
    h = _hessian(params, a)
    values, vectors = np.linalg.eigh(h)
    step = 1.0 / float(values[-1])
    k = params.n_users
    s2 = params.channel_noise_std**2 / (k * k * params.power_scaling)
    if perturbation == "uncorrelated":
        s2 += params.perturbation_std**2 / k
    e0 = vectors.T @ (np.zeros(params.dim) - _optimum(params, a, b))
    factor = (1.0 - step * values) ** 2
    t = params.iterations
    deterministic = factor**t * e0**2
    stochastic = step * step * s2 * (1.0 - factor**t) / (1.0 - factor)
    return float(0.5 * np.sum(values * (deterministic + stochastic)))


def optimality_gaps(
    params: OverTheAirParams, seed: np.random.SeedSequence
) -> list[dict[str, object]]:
    """F(w_T) − F* for each perturbation kind on one problem, with common channel noise."""
    rng = generator(child(seed, 0))
    a, b, _ = _problem(params, rng)
    k, d, n = params.n_users, params.dim, params.samples_per_user
    h = _hessian(params, a)
    step = 1.0 / float(np.linalg.eigvalsh(h)[-1])
    optimum = _optimum(params, a, b)
    best = _loss(params, a, b, optimum)
    channel = generator(child(seed, 1)).standard_normal((params.iterations, d)) * (
        params.channel_noise_std / math.sqrt(params.power_scaling)
    )
    design = complete_design(node_ids(k), params.perturbation_std**2)
    rows: list[dict[str, object]] = []
    for index, kind in enumerate(PERTURBATIONS):
        draws = generator(child(seed, 2 + index))
        if kind == "zero_sum":
            perturbations = draw_zero_sum(design, d, draws, batch=(params.iterations,)).noise
        elif kind == "uncorrelated":
            perturbations = params.perturbation_std * draws.standard_normal(
                (params.iterations, k, d)
            )
        else:
            perturbations = np.zeros((params.iterations, k, d))
        w = np.zeros(d)
        for t in range(params.iterations):
            gradients = (np.einsum("knd,kn->kd", a, a @ w - b)) / n + params.ridge * w
            estimate = (gradients + perturbations[t]).sum(axis=0) / k + channel[t] / k
            w = w - step * estimate
        rows.append(
            {
                "perturbation": kind,
                "gap": _loss(params, a, b, w) - best,
                "expected_gap": expected_gap(
                    params, a, b, kind if kind == "uncorrelated" else "none"
                ),
                "perturbation_trace": float(
                    0.0
                    if kind == "none"
                    else np.trace(design.covariance())
                    if kind == "zero_sum"
                    else k * params.perturbation_std**2
                ),
                "sum_of_perturbations_max": float(np.max(np.abs(perturbations.sum(axis=1)))),
            }
        )
    return rows
