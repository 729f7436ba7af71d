"""Cross-check the exact GDP accounting against Google's privacy-loss-distribution accountant.

dp-accounting's PLDAccountant composes discretised privacy-loss distributions
(Koskela et al. 2020; Doroshenko et al. 2022), an independent route to the
same numbers: for the Gaussian mechanism composed r times the exact answer is
μ = sqrt(r)/σ-GDP, and the PLD estimate is a slightly pessimistic upper bound.
"""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting import pld

from noise.accounting import compose_mu, gaussian_epsilon

# A 1e-3 grid agrees with the exact ε to ~1e-5 here and keeps the test fast
# (1e-4 agrees to ~1e-8 but takes ~10 s).
_INTERVAL = 1e-3


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("rounds", [1, 2, 10])
def test_epsilon_agrees_with_pld_accountant(sigma: float, rounds: int) -> None:
    accountant = pld.PLDAccountant(value_discretization_interval=_INTERVAL)
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=sigma), rounds)
    mu = compose_mu([1.0 / sigma] * rounds)
    for delta in (1e-5, 1e-6):
        reference = accountant.get_epsilon(delta)
        exact = gaussian_epsilon(mu, delta)
        assert exact == pytest.approx(reference, rel=0.01)
        # the discretised PLD bound is pessimistic: never below the exact value
        assert exact <= reference * (1 + 1e-9)
