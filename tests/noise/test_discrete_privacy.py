"""The receipts' (ε, δ) for discrete Gaussian noise, checked against exact privacy-loss sums.

docs/design.md §6.4 claims that adding integer noise N_Z(0, V) — or a sum of
independent discrete Gaussians of total variance V — to an integer query of
L2 sensitivity Δ is (ε, δ_G(ε; Δ/√V) + (1 + e^ε)·η)-DP, with δ_G the Gaussian
tradeoff's δ (noise.accounting.gaussian_delta) and η = 1/(8V) (+ τ of
Kairouz, Liu & Steinke for a sum). At small V the exact δ(ε) of the discrete
mechanism is a finite sum over its support, Σ_y max(0, P(y) − e^ε·P(y − Δ)),
computed here in exact-enough floating point over ±60σ; the claim must bound
it at every ε tried. It is also checked against dp_accounting's own
discrete-Gaussian privacy-loss distribution, an independent implementation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from noise.accounting import gaussian_delta
from noise.discrete import discretisation_tv, sum_tv

EPSILONS = (0.1, 0.5, 1.0, 2.0, 4.0)


def _pmf(variance: float) -> tuple[np.ndarray, np.ndarray]:
    half = int(60 * math.sqrt(variance)) + 10
    support = np.arange(-half, half + 1)
    weights = np.exp(-(support.astype(np.float64) ** 2) / (2.0 * variance))
    return support, weights / math.fsum(weights)


def _exact_delta(pmf: np.ndarray, shift: int, epsilon: float) -> float:
    """δ(ε) of adding noise with this pmf to a query that moves by ``shift`` (both directions)."""
    p = pmf
    q = np.zeros_like(pmf)
    q[shift:] = pmf[: pmf.size - shift]
    forward = math.fsum(np.maximum(p - math.exp(epsilon) * q, 0.0))
    backward = math.fsum(np.maximum(q - math.exp(epsilon) * p, 0.0))
    return max(forward, backward)


def _claimed(delta_shift: int, variance: float, epsilon: float, eta: float) -> float:
    return (
        gaussian_delta(delta_shift / math.sqrt(variance), epsilon) + (1 + math.exp(epsilon)) * eta
    )


@pytest.mark.parametrize("variance", [1.0, 4.0, 25.0])
@pytest.mark.parametrize("shift", [1, 2])
def test_one_discrete_gaussian_is_within_the_claim(variance: float, shift: int) -> None:
    _, pmf = _pmf(variance)
    eta = discretisation_tv(variance)
    for epsilon in EPSILONS:
        exact = _exact_delta(pmf, shift, epsilon)
        assert exact <= _claimed(shift, variance, epsilon, eta) * (1 + 1e-9) + 1e-15, epsilon


@pytest.mark.parametrize("parts", [(0.5, 0.5), (1.0, 2.0, 3.0), (4.0, 4.0)])
def test_a_sum_of_discrete_gaussians_is_within_the_claim(parts: tuple[float, ...]) -> None:
    support, pmf = _pmf(parts[0])
    total = pmf
    for v in parts[1:]:
        _, other = _pmf(v)
        total = np.convolve(total, other)
    variance = sum(parts)
    eta = sum_tv(list(parts)) + discretisation_tv(variance)
    for epsilon in EPSILONS:
        exact = _exact_delta(total, 1, epsilon)
        assert exact <= _claimed(1, variance, epsilon, eta) * (1 + 1e-9) + 1e-15, epsilon
    assert support.size > 0


def test_the_claim_is_not_vacuous_and_the_exact_sum_is_right() -> None:
    # At V = 25 the discrete mechanism's δ is within a few per cent of the Gaussian's: the
    # claim is close to tight, and the exact sum agrees with dp_accounting's PLD.
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import privacy_loss_distribution

    _, pmf = _pmf(25.0)
    pld = privacy_loss_distribution.from_discrete_gaussian_mechanism(
        sigma=5.0, sensitivity=1, value_discretization_interval=1e-4
    )
    for epsilon in (0.05, 0.1, 0.2):
        exact = _exact_delta(pmf, 1, epsilon)
        gaussian = gaussian_delta(1 / 5.0, epsilon)
        assert abs(exact - gaussian) <= 0.05 * gaussian
        assert pld.get_delta_for_epsilon(epsilon) == pytest.approx(exact, rel=2e-2, abs=1e-9)
    assert dp_accounting is not None


def test_the_discretisation_terms_underflow_at_real_scales() -> None:
    assert discretisation_tv(1e20) == pytest.approx(1.25e-21)
    assert sum_tv([1e20, 1e20, 5e19]) == 0.0
    assert sum_tv([0.5, 0.5]) > 0.0
