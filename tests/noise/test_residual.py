"""Independent residual noise and the CAPE variance split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from noise.errors import CalibrationError
from noise.residual import cape_residual_variance, residual_noise


def test_residual_noise_shape_and_scale() -> None:
    rng = np.random.default_rng(20240611)
    draws = residual_noise((400, 250), 3.0, rng=rng)
    assert draws.shape == (400, 250)
    assert draws.dtype == np.float64
    n = draws.size
    # sample variance of n = 1e5 normals has standard error σ²·sqrt(2/n)
    assert abs(draws.var() - 9.0) < 5 * 9.0 * math.sqrt(2 / n)
    assert abs(draws.mean()) < 5 * 3.0 / math.sqrt(n)


def test_explicit_generator_is_reproducible() -> None:
    a = residual_noise(17, 1.5, rng=np.random.default_rng(7))
    b = residual_noise(17, 1.5, rng=np.random.default_rng(7))
    assert a.shape == (17,)
    assert np.array_equal(a, b)


def test_default_generator_is_fresh_os_randomness() -> None:
    a = residual_noise(64, 1.0)
    b = residual_noise(64, 1.0)
    assert not np.array_equal(a, b)
    assert np.all(np.isfinite(a))


def test_zero_std_switches_noise_off() -> None:
    assert np.array_equal(
        residual_noise((2, 3), 0.0, rng=np.random.default_rng(1)), np.zeros((2, 3))
    )
    assert residual_noise(0, 1.0, rng=np.random.default_rng(1)).shape == (0,)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, True, "1"])
def test_residual_noise_rejects_bad_std(bad: object) -> None:
    with pytest.raises(CalibrationError) as info:
        residual_noise(3, bad, rng=np.random.default_rng(1))  # type: ignore[arg-type]
    assert info.value.parameter == "std"


@pytest.mark.parametrize("shape", [-1, (2, -3), (2.0, 3), (True,)])
def test_residual_noise_rejects_bad_shape(shape: object) -> None:
    with pytest.raises(ValueError, match="shape must be non-negative integers"):
        residual_noise(shape, 1.0, rng=np.random.default_rng(1))  # type: ignore[arg-type]


def test_cape_residual_split_restores_central_variance() -> None:
    assert cape_residual_variance(1.0, 10) == pytest.approx(0.1, rel=1e-15)
    assert cape_residual_variance(0.0, 4) == 0.0
    k, central = 8, 2.5
    per_node = cape_residual_variance(central, k)
    rng = np.random.default_rng(99)
    total = np.sum(
        [residual_noise(200_000, math.sqrt(per_node), rng=rng) for _ in range(k)], axis=0
    )
    assert abs(total.var() - central) < 5 * central * math.sqrt(2 / 200_000)


@pytest.mark.parametrize(
    ("args", "parameter"),
    [
        ((-1.0, 3), "central_variance"),
        ((math.nan, 3), "central_variance"),
        ((math.inf, 3), "central_variance"),
        (("1", 3), "central_variance"),
        ((1.0, 0), "n_nodes"),
        ((1.0, 2.0), "n_nodes"),
        ((1.0, True), "n_nodes"),
    ],
)
def test_cape_residual_variance_validation(args: tuple[object, object], parameter: str) -> None:
    with pytest.raises(CalibrationError) as info:
        cape_residual_variance(*args)  # type: ignore[arg-type]
    assert info.value.parameter == parameter
