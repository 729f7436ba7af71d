"""log Φ(x), the logarithm of the standard normal CDF, accurate far into the lower tail.

The accounting (:mod:`noise.accounting`) evaluates δ(ε; μ) from two values of
log Φ whose arguments reach −10^3 and beyond, where Φ itself underflows. It
used to take ``scipy.special.log_ndtr``; importing scipy's special functions
and its optimiser cost every node process about 0.6 s of CPU at start-up, for
two scalar functions. This module computes the same quantity with the
standard library alone:

* x > 0: log Φ(x) = log1p(−Φ(−x)), with Φ(−x) = erfc(x/√2)/2 (so the value
  near 0 keeps its relative accuracy);
* −20 ≤ x ≤ 0: log(erfc(−x/√2)/2); erfc keeps full relative accuracy there
  (its value at x = −20 is about 5·10^-89, far from underflow);
* x < −20: the asymptotic expansion of Mills' ratio (Abramowitz & Stegun
  26.2.12), log Φ(x) = −x²/2 − log(−x) − log(2π)/2 + log Σ_k (−1)^k (2k−1)!!/x^(2k),
  summed until a term no longer changes the sum; at |x| ≥ 20 the terms shrink
  by at least 400/(2k+1) each, so a dozen terms reach double precision.

``tests/noise/test_gaussian_tail.py`` compares it with exact values computed
in high-precision decimal arithmetic across the range, and with scipy where
the test has it.
"""

from __future__ import annotations

import math

__all__ = ["log_ndtr"]

_SQRT_HALF = math.sqrt(0.5)
_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)
# Below this, the asymptotic series; above, erfc (both accurate across the seam).
_SERIES_BELOW = -20.0
# Above this, log1p of the upper tail, so that log Φ near 0 stays accurate.
_UPPER_ABOVE = 0.0


def log_ndtr(x: float) -> float:
    """log Φ(x) for a float ``x`` (−inf at −inf, 0 at +inf, NaN for NaN)."""
    if math.isnan(x):
        return math.nan
    if x > _UPPER_ABOVE:
        return math.log1p(-0.5 * math.erfc(x * _SQRT_HALF))
    if x >= _SERIES_BELOW:
        return math.log(0.5 * math.erfc(-x * _SQRT_HALF))
    if x == -math.inf:
        return -math.inf
    inverse_square = 1.0 / (x * x)
    total = 1.0
    term = 1.0
    k = 1
    while True:
        term *= -(2 * k - 1) * inverse_square
        if total + term == total:
            break
        total += term
        k += 1
    return -0.5 * x * x - math.log(-x) - _HALF_LOG_TWO_PI + math.log(total)
