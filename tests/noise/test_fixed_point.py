"""Fixed-point codec: exact round trips, wrapping sums, and named errors."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from noise.errors import FixedPointError
from noise.fixed_point import DEFAULT_FRAC_BITS, FixedPointCodec, wrapping_sum
from tests.support.strategies import float_arrays, shapes

CODEC = FixedPointCodec()
frac_bits = st.integers(1, 62)


def _reference(values: np.ndarray, bits: int) -> np.ndarray:
    """round-half-even(x · 2^F) as Python ints, reduced modulo 2^64 (no numpy casting)."""
    flat = [int(np.rint(math.ldexp(float(v), bits))) % 2**64 for v in values.reshape(-1)]
    return np.array(flat, dtype=np.uint64).reshape(values.shape)


def _in_range(bits: int, share: float = 1.0) -> st.SearchStrategy[float]:
    bound = FixedPointCodec(bits).max_abs * share
    return st.floats(-bound, bound, allow_nan=False, allow_infinity=False)


# --- parameters ----------------------------------------------------------------------


def test_default_is_32_fractional_bits() -> None:
    assert DEFAULT_FRAC_BITS == 32
    assert CODEC.scale == 2.0**32
    assert CODEC.resolution == 2.0**-32
    assert 2.3e-10 < CODEC.resolution < 2.4e-10
    assert CODEC.max_abs < 2.0**31 < CODEC.max_abs + 1e-6


@pytest.mark.parametrize("bits", [1, 20, 51, 52, 62])
def test_max_abs_is_the_largest_encodable_magnitude(bits: int) -> None:
    codec = FixedPointCodec(bits)
    limit = 2.0 ** (63 - bits)
    assert codec.max_abs == math.nextafter(limit, 0.0)
    edges = np.array([codec.max_abs, -codec.max_abs])
    np.testing.assert_array_equal(codec.decode(codec.encode(edges)), edges)
    for outside in (limit, -limit):
        with pytest.raises(FixedPointError, match="its magnitude exceeds"):
            codec.encode(outside)


@pytest.mark.parametrize("bits", [0, 63, -1, 64])
def test_frac_bits_out_of_range_is_refused(bits: int) -> None:
    with pytest.raises(ValueError, match=f"frac_bits must be between 1 and 62 .*; got {bits}."):
        FixedPointCodec(bits)


@pytest.mark.parametrize("bits", [True, 32.0, "32", None])
def test_frac_bits_must_be_an_integer(bits: object) -> None:
    with pytest.raises(TypeError, match="frac_bits must be an integer"):
        FixedPointCodec(bits)  # type: ignore[arg-type]


def test_numpy_integer_frac_bits_become_int() -> None:
    codec = FixedPointCodec(np.int64(20))  # type: ignore[arg-type]
    assert type(codec.frac_bits) is int
    assert codec == FixedPointCodec(20)


# --- encode / decode -------------------------------------------------------------------


@settings(max_examples=200)
@given(frac_bits.flatmap(lambda b: st.tuples(st.just(b), st.lists(_in_range(b), max_size=20))))
def test_round_trip_within_half_a_step(case: tuple[int, list[float]]) -> None:
    bits, values = case
    codec = FixedPointCodec(bits)
    x = np.array(values, dtype=np.float64)
    encoded = codec.encode(x)
    assert encoded.dtype == np.uint64
    np.testing.assert_array_equal(encoded, _reference(x, bits))
    assert np.all(np.abs(codec.decode(encoded) - x) <= 2.0 ** -(bits + 1))


@settings(max_examples=100)
@given(float_arrays(bound=2.0**30, shape=shapes()))
def test_round_trip_keeps_shape(x: np.ndarray) -> None:
    encoded = CODEC.encode(x)
    assert encoded.shape == x.shape
    np.testing.assert_array_equal(encoded, _reference(x, DEFAULT_FRAC_BITS))
    assert np.all(np.abs(CODEC.decode(encoded) - x) <= 2.0**-33)


@settings(max_examples=200)
@given(frac_bits.flatmap(lambda b: st.tuples(st.just(b), _in_range(b, 0.5), _in_range(b, 0.5))))
def test_wrapping_addition_matches_encoding_of_the_sum(case: tuple[int, float, float]) -> None:
    bits, a, b = case
    codec = FixedPointCodec(bits)
    total = wrapping_sum([codec.encode(a), codec.encode(b)])
    as_int = int(total.view(np.int64))
    # Compare with the exact sum: the float sum a + b may itself be rounded.
    exact = round((Fraction(a) + Fraction(b)) * 2**bits)
    assert abs(as_int - exact) <= 1  # within one unit in the last place
    if Fraction(a + b) == Fraction(a) + Fraction(b):
        assert abs(as_int - int(codec.encode_scaled_int(a + b))) <= 1


def test_negative_numbers_are_twos_complement() -> None:
    x = np.array([-1.0, -0.5, -(2.0**-32), -1234.5678])
    encoded = CODEC.encode(x)
    assert encoded[0] == 2**64 - 2**32
    assert encoded[1] == 2**64 - 2**31
    assert encoded[2] == 2**64 - 1
    np.testing.assert_array_equal(CODEC.encode_scaled_int(x)[:3], [-(2**32), -(2**31), -1])
    assert np.all(np.abs(CODEC.decode(encoded) - x) <= 2.0**-33)


@pytest.mark.parametrize("magnitude", [0.0, 2.0**19])  # fast path and general path
def test_ties_round_half_to_even(magnitude: float) -> None:
    step = 2.0**-32
    x = magnitude + np.array([0.5, 1.5, 2.5, -0.5, -1.5]) * step
    expected = np.array([0, 2, 2, 0, -2]) + int(magnitude * 2**32)
    np.testing.assert_array_equal(CODEC.encode_scaled_int(x), expected)


def test_fast_and_general_paths_agree_at_the_boundary() -> None:
    edge = 2.0**19  # 2^(51-F): below it encode takes the add-a-constant path
    x = np.array([math.nextafter(edge, 0.0), -math.nextafter(edge, 0.0), 0.3, -0.7])
    fast = CODEC.encode(x)
    general = CODEC.encode(np.append(x, edge))[:-1]
    np.testing.assert_array_equal(fast, general)
    np.testing.assert_array_equal(fast, _reference(x, 32))


def test_integer_bool_and_layout_inputs() -> None:
    np.testing.assert_array_equal(CODEC.encode(np.array([3, -2])), CODEC.encode([3.0, -2.0]))
    np.testing.assert_array_equal(CODEC.encode(np.array([True, False])), [2**32, 0])
    matrix = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    np.testing.assert_array_equal(CODEC.encode(matrix.T), CODEC.encode(matrix).T)
    np.testing.assert_array_equal(
        CODEC.encode(matrix.astype(np.float32)), CODEC.encode(matrix.astype(np.float32) * 1.0)
    )
    assert CODEC.encode(np.empty((0, 3))).shape == (0, 3)
    assert CODEC.encode(1.25).shape == ()
    assert CODEC.decode(CODEC.encode(1.25)) == 1.25


def test_encode_does_not_modify_its_input() -> None:
    x = np.array([0.1, -0.2, 3.0])
    before = x.copy()
    CODEC.encode(x)
    np.testing.assert_array_equal(x, before)


# --- errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (math.nan, "it is not a number (NaN)"),
        (math.inf, "it is infinite"),
        (-math.inf, "it is infinite"),
        (3e9, "its magnitude exceeds 2.14748e+09"),
        (-3e9, "its magnitude exceeds 2.14748e+09"),
    ],
)
def test_bad_values_name_tensor_first_index_and_value(bad: float, reason: str) -> None:
    x = np.zeros((3, 4))
    x[1, 2] = bad
    x[2, 0] = math.nan  # a later bad value must not be the one reported
    with pytest.raises(FixedPointError) as info:
        CODEC.encode(x, tensor="sxx")
    error = info.value
    assert error.tensor == "sxx"
    assert error.index == (1, 2)
    assert all(type(i) is int for i in error.index)
    assert error.value == bad or (math.isnan(error.value) and math.isnan(bad))
    assert reason in error.reason
    assert str(error).startswith(f"tensor 'sxx' at index (1, 2) holds {bad!r}: ")


def test_bad_scalar_reports_empty_index() -> None:
    with pytest.raises(FixedPointError) as info:
        FixedPointCodec(50).encode(9000.0, tensor="age")
    assert info.value.index == ()
    assert "50 fractional bits" in str(info.value)


def test_non_numeric_values_are_refused() -> None:
    with pytest.raises(TypeError, match="tensor 'w' must hold real numbers; got dtype complex128"):
        CODEC.encode(np.array([1 + 2j]), tensor="w")
    with pytest.raises(TypeError, match="must hold real numbers"):
        CODEC.encode(np.array(["1.0"]))


def test_decode_requires_uint64() -> None:
    with pytest.raises(TypeError, match="decode expects a uint64 array; got dtype int64"):
        CODEC.decode(np.array([1, 2], dtype=np.int64))


# --- wrapping sums -------------------------------------------------------------------

uint64_arrays = hnp.arrays(np.uint64, 5, elements=st.integers(0, 2**64 - 1))


@settings(max_examples=100)
@given(st.lists(uint64_arrays, min_size=1, max_size=8))
def test_wrapping_sum_is_exact_modulo_2_64(arrays: list[np.ndarray]) -> None:
    originals = [a.copy() for a in arrays]
    total = wrapping_sum(iter(arrays))
    expected = [sum(int(a[i]) for a in arrays) % 2**64 for i in range(5)]
    assert total.dtype == np.uint64
    assert total.tolist() == expected
    for array, original in zip(arrays, originals, strict=True):
        np.testing.assert_array_equal(array, original)


def test_wrapping_sum_of_zero_dimensional_arrays() -> None:
    top = np.array(2**64 - 1, dtype=np.uint64)
    assert int(wrapping_sum([top, top, np.array(3, dtype=np.uint64)])) == 1


@settings(max_examples=50)
@given(float_arrays(bound=1e3, shape=7), float_arrays(bound=1e3, shape=7), st.integers(0, 2**32))
def test_masks_that_cancel_mod_2_64_leave_the_exact_sum(
    a: np.ndarray, b: np.ndarray, seed: int
) -> None:
    # Uniform masks make each masked value wrap arbitrarily; only the sum matters.
    mask = np.random.default_rng(seed).integers(0, 2**64, size=7, dtype=np.uint64, endpoint=False)
    negated = np.subtract(np.zeros(7, dtype=np.uint64), mask)
    masked_a = wrapping_sum([CODEC.encode(a), mask])
    masked_b = wrapping_sum([CODEC.encode(b), negated])
    total = wrapping_sum([masked_a, masked_b])
    np.testing.assert_array_equal(total, wrapping_sum([CODEC.encode(a), CODEC.encode(b)]))
    assert np.all(np.abs(CODEC.decode(total) - (a + b)) <= 2.0**-32)


def test_wrapping_sum_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="needs at least one array; got none"):
        wrapping_sum([])
    with pytest.raises(ValueError, match=r"array 1 has shape \(4,\), expected \(3,\)"):
        wrapping_sum([np.zeros(3, dtype=np.uint64), np.zeros(4, dtype=np.uint64)])
    with pytest.raises(TypeError, match="array 1 has dtype float64"):
        wrapping_sum([np.zeros(3, dtype=np.uint64), np.zeros(3)])  # type: ignore[list-item]
