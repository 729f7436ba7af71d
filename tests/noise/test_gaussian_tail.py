"""log Φ without scipy: against 300-bit values across the range, and against scipy."""

from __future__ import annotations

import math
import subprocess
import sys

import mpmath
import numpy as np
import pytest
from scipy.special import log_ndtr as scipy_log_ndtr

from noise.gaussian_tail import log_ndtr

EPS = float(np.finfo(np.float64).eps)


def _exact(x: float) -> float:
    with mpmath.workprec(300):
        value = mpmath.mpf(x)
        if value > 0:
            return float(mpmath.log1p(-mpmath.ncdf(-value)))
        return float(mpmath.log(mpmath.ncdf(value)))


@pytest.mark.parametrize(
    ("low", "high", "ulps"),
    [
        (-1e4, -20.0, 4),  # the asymptotic series
        (-20.0, -5.0, 4),  # erfc, deep in the tail
        (-5.0, 0.0, 4),
        (0.0, 5.0, 32),  # log1p of the upper tail: a value near 0
    ],
)
def test_log_ndtr_matches_high_precision_values(low: float, high: float, ulps: int) -> None:
    rng = np.random.default_rng(20261203)
    for x in rng.uniform(low, high, 400):
        exact = _exact(float(x))
        assert abs(log_ndtr(float(x)) - exact) <= ulps * EPS * abs(exact), x


@pytest.mark.parametrize("x", [-20.0, math.nextafter(-20.0, 0.0), math.nextafter(-20.0, -1.0)])
def test_the_seam_between_the_series_and_erfc_is_continuous(x: float) -> None:
    exact = _exact(x)
    assert abs(log_ndtr(x) - exact) <= 4 * EPS * abs(exact)


def test_agrees_with_scipy_where_the_accounting_evaluates_it() -> None:
    for x in np.concatenate([-np.logspace(-6, 3.5, 300), np.logspace(-6, 0.7, 100)]):
        ours, theirs = log_ndtr(float(x)), float(scipy_log_ndtr(x))
        assert ours == pytest.approx(theirs, rel=64 * EPS, abs=1e-300), x


def test_limits_and_nan() -> None:
    assert log_ndtr(-math.inf) == -math.inf
    assert log_ndtr(math.inf) == 0.0
    assert log_ndtr(0.0) == pytest.approx(math.log(0.5), rel=EPS)
    assert log_ndtr(-1e200) == -math.inf  # Φ underflows past any double
    assert math.isnan(log_ndtr(math.nan))


def test_a_node_starts_without_importing_scipy() -> None:
    """The accounting a node composes its ledger with needs no scipy at import."""
    probe = "import sys, node.runner, noise.accounting; print('scipy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stderr
