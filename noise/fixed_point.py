"""Fixed-point codec: float64 <-> uint64 two's complement with scale 2^-F.

A value x is encoded as the integer q(x) = round(x · 2^F) (round half to even)
stored modulo 2^64 as uint64, i.e. the two's complement bit pattern of an
int64. Addition of encodings in uint64 wraps modulo 2^64, which is exactly
addition in Z/2^64Z, so

    decode(Σ_k q(x_k) mod 2^64) = Σ_k q(x_k) · 2^-F     whenever |Σ_k q(x_k)| < 2^63,

with rounding error at most K · 2^-(F+1) for K summands. Masks that cancel in
Z/2^64Z (noise/masks.py) therefore cancel bit for bit, however much the
individual masked egresses wrap. This is the usual encoding for secure
aggregation over a ring (Bonawitz et al. 2017, "Practical secure aggregation
for privacy-preserving machine learning", ACM CCS).

Default F = 32 (:data:`DEFAULT_FRAC_BITS`): resolution 2^-32 ≈ 2.3e-10 and
magnitudes up to 2^31 ≈ 2.1e9. Features are pre-scaled to [-1, 1] by public
clipping bounds, so each entry of the sums a node sends (Σ x, Σ x xᵀ, Σ x·age)
is at most N in magnitude (N·age_max for age terms: 10^6 subjects of age ≤ 120
give 1.2e8); sums over up to ~10^6 subjects plus noise of any sensible scale
stay far below 2.1e9, while 2.3e-10 is far below any statistically meaningful
difference. Smaller F buys headroom, larger F buys resolution; F must lie in
[1, 62].

Headroom rule: every value a node encodes *and the aggregate over all nodes*
must stay below :attr:`FixedPointCodec.max_abs` in magnitude. The codec checks
each encoded value (raising :class:`FixedPointError`); the aggregate cannot be
checked after the fact, because a sum that overflows wraps silently into a
wrong value of the right type. Choose F so that the largest possible aggregate
(from the public clipping bounds and the total N) fits.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from noise.errors import FixedPointError

__all__ = ["DEFAULT_FRAC_BITS", "MAX_FRAC_BITS", "MIN_FRAC_BITS", "FixedPointCodec", "wrapping_sum"]

DEFAULT_FRAC_BITS = 32
MIN_FRAC_BITS = 1
MAX_FRAC_BITS = 62

_MAGIC_RANGE_BITS = 51
_MAGIC = 1.5 * 2.0**52
_MAGIC_BITS = np.int64(np.array(_MAGIC).view(np.int64))


@dataclass(frozen=True)
class FixedPointCodec:
    """Encode float64 arrays as uint64 with ``frac_bits`` fractional bits (scale 2^-F)."""

    frac_bits: int = DEFAULT_FRAC_BITS

    def __post_init__(self) -> None:
        bits = self.frac_bits
        if isinstance(bits, bool) or not isinstance(bits, int | np.integer):
            raise TypeError(f"frac_bits must be an integer; got {bits!r}.")
        if not MIN_FRAC_BITS <= bits <= MAX_FRAC_BITS:
            raise ValueError(
                f"frac_bits must be between {MIN_FRAC_BITS} and {MAX_FRAC_BITS} "
                f"(fractional bits of a 64-bit fixed-point number); got {bits}."
            )
        object.__setattr__(self, "frac_bits", operator.index(bits))

    @property
    def scale(self) -> float:
        """2^F: the encoded integer is round(value · scale)."""
        return math.ldexp(1.0, self.frac_bits)

    @property
    def resolution(self) -> float:
        """2^-F: the spacing of representable values (rounding error ≤ resolution / 2)."""
        return math.ldexp(1.0, -self.frac_bits)

    @property
    def max_abs(self) -> float:
        """Largest float64 magnitude that encodes: the float just below 2^(63-F)."""
        return math.nextafter(self._limit, 0.0)

    @property
    def _limit(self) -> float:
        # |x| < 2^(63-F) ⇔ |x · 2^F| < 2^63 exactly (scaling by a power of two is exact),
        # and rounding such a product to an integer never reaches 2^63.
        return math.ldexp(1.0, 63 - self.frac_bits)

    def encode_scaled_int(self, values: ArrayLike, *, tensor: str = "value") -> NDArray[np.int64]:
        """round(values · 2^F) as int64; :class:`FixedPointError` for NaN, ±Inf or |x| > max_abs.

        Integer inputs above 2^53 in magnitude are first rounded to float64.
        """
        x = _as_float64(values, tensor)
        limit = self._limit
        lowest = highest = 0.0
        if x.size:
            lowest, highest = float(x.min()), float(x.max())
            if not (lowest > -limit and highest < limit):
                # NaN makes min/max NaN and both comparisons false: one check covers all.
                raise self._first_bad(x, tensor)
        encoded = np.empty(x.shape, dtype=np.int64)
        # Work inside the output buffer (one allocation, like a plain multiply):
        # scale as float64 in place, then turn the floats into integers in place.
        flat = encoded.reshape(-1)
        scratch = flat.view(np.float64)
        np.multiply(x.reshape(-1), self.scale, out=scratch)
        fast = math.ldexp(1.0, _MAGIC_RANGE_BITS - self.frac_bits)
        if -fast < lowest and highest < fast:
            # For |v| < 2^51, v + 1.5·2^52 lies in [2^52, 2^53) where doubles are spaced
            # by 1, so the addition itself rounds v half-to-even (as rint would) and
            # the integer sits in the low mantissa bits. Two vectorised passes instead
            # of a rint pass and a scalar float-to-int conversion loop.
            np.add(scratch, _MAGIC, out=scratch)
            np.subtract(flat, _MAGIC_BITS, out=flat)
        else:
            np.rint(scratch, out=scratch)
            # 1-D, same item size, identical addresses: numpy converts element by
            # element without an intermediate copy, each read before it is written.
            np.copyto(flat, scratch, casting="unsafe")
        return encoded

    def encode(self, values: ArrayLike, *, tensor: str = "value") -> NDArray[np.uint64]:
        """q(values) as uint64 (two's complement of round(values · 2^F))."""
        return self.encode_scaled_int(values, tensor=tensor).view(np.uint64)

    def decode(self, encoded: NDArray[np.uint64]) -> NDArray[np.float64]:
        """Reinterpret uint64 as int64 and divide by 2^F."""
        array = np.asarray(encoded)
        if array.dtype != np.uint64:
            raise TypeError(f"decode expects a uint64 array; got dtype {array.dtype}.")
        return np.multiply(array.view(np.int64), self.resolution, dtype=np.float64)

    def _first_bad(self, x: NDArray[np.float64], tensor: str) -> FixedPointError:
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(x) < self._limit)
        flat_index = int(np.argmax(bad.reshape(-1)))
        index = tuple(int(i) for i in np.unravel_index(flat_index, x.shape))
        value = float(x.reshape(-1)[flat_index])
        if math.isnan(value):
            reason = "it is not a number (NaN), which fixed point cannot represent."
        elif math.isinf(value):
            reason = "it is infinite, which fixed point cannot represent."
        else:
            reason = (
                f"its magnitude exceeds {self.max_abs:.6g}, the largest value fixed point "
                f"with {self.frac_bits} fractional bits can hold; check the clipping bounds "
                "or lower frac_bits."
            )
        return FixedPointError(tensor, index, value, reason)


def _as_float64(values: ArrayLike, tensor: str) -> NDArray[np.float64]:
    array = np.asarray(values)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"tensor {tensor!r} must hold real numbers; got dtype {array.dtype}.")
    return array.astype(np.float64, copy=False)


def wrapping_sum(arrays: Iterable[NDArray[np.uint64]]) -> NDArray[np.uint64]:
    """Σ arrays modulo 2^64, exactly (uint64 addition wraps; no warnings, no overflow)."""
    total: NDArray[np.uint64] | None = None
    for position, item in enumerate(arrays):
        array = np.asarray(item)
        if array.dtype != np.uint64:
            raise TypeError(
                f"wrapping_sum adds uint64 arrays; array {position} has dtype {array.dtype}."
            )
        if total is None:
            total = array.copy()
        elif array.shape != total.shape:
            raise ValueError(
                f"wrapping_sum needs arrays of one shape; array {position} has shape "
                f"{array.shape}, expected {total.shape}."
            )
        else:
            np.add(total, array, out=total)
    if total is None:
        raise ValueError("wrapping_sum needs at least one array; got none.")
    return total
