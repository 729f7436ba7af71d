"""Independent residual Gaussian noise: what keeps the aggregate itself private.

Correlated noise cancels in the sum, so the published aggregate is exact. A
node that also wants the aggregate to be differentially private adds
independent N(0, σ_res²) noise drawn from the operating system's CSPRNG
(through :func:`noise.stream.os_generator`), which no other party can
regenerate or subtract.

CAPE split (Imtiaz, Mohammadi & Sarwate, arXiv 1904.10059, 2019): if each of
K nodes adds residual variance σ²/K, the sum of the K residuals carries
exactly the variance σ² a trusted curator would have added centrally.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np
from numpy.typing import NDArray

from noise.errors import CalibrationError

__all__ = ["cape_residual_variance", "residual_noise"]


def residual_noise(
    shape: int | tuple[int, ...], std: float, *, rng: np.random.Generator | None = None
) -> NDArray[np.float64]:
    """Independent N(0, std²) noise of the given shape.

    ``rng`` defaults to a fresh generator keyed from ``os.urandom``; pass an
    explicit generator only for reproducible tests and simulations.
    ``std = 0`` returns zeros (residual noise switched off).
    """
    if isinstance(std, bool) or not isinstance(std, Real):
        raise CalibrationError("std", std, "must be a real number")
    s = float(std)
    if not (math.isfinite(s) and s >= 0.0):
        raise CalibrationError("std", s, "must be finite and >= 0")
    dims = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative integers; got {shape!r}")
    if rng is None:
        from noise.stream import os_generator  # loads randomgen only when noise is drawn

        rng = os_generator()
    out = rng.standard_normal(tuple(int(d) for d in dims), dtype=np.float64)
    out *= s
    return out


def cape_residual_variance(central_variance: float, n_nodes: int) -> float:
    """Per-node residual variance σ²/K, so the K residuals sum to variance σ².

    ``central_variance`` is the σ² a trusted curator would add to the sum.
    """
    if isinstance(central_variance, bool) or not isinstance(central_variance, Real):
        raise CalibrationError(
            "central_variance",
            central_variance,
            "must be a real number",
        )
    v = float(central_variance)
    if not (math.isfinite(v) and v >= 0.0):
        raise CalibrationError("central_variance", v, "must be finite and >= 0")
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 1:
        raise CalibrationError("n_nodes", n_nodes, "must be a whole number >= 1")
    return v / n_nodes
