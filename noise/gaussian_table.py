"""The discrete Gaussian as a table: integer bin weights, an alias draw, one acceptance test.

``noise.discrete`` draws N_Z(0, σ²) with the proposal built here; this module
owns the table, the vectorised proposals and the exact decisions behind them.

**Target.** P[Y = y] ∝ π(y) = exp(−y²/(2σ²)) on the integers. The sampler draws
a magnitude X ≥ 0 and a sign bit, so it needs P[X = 0] ∝ π(0)/2 and
P[X = x] ∝ π(x) for x ≥ 1. Where a bin holds one value (σ < 64) the value 0
is proposed with half its weight and its acceptance halved; where bins are
wider, (X = 0, sign 1) is rejected once, which halves the mass of 0 as
Canonne, Kamath & Steinke (2020, Algorithm 2) do.

**Envelope.** Cut [0, B) into ``bins`` bins of width h = 2^j (2^j ≤ σ/32, so
π changes little across one), with B = bins·h ≥ 8σ; give bin v the integer
weight c_v = ⌊S·π(v·h)⌋ + 1 > S·max π over the bin (π falls on x ≥ 0), and
give the rest of the line, x ≥ B, one more weight c_T (the tail, below). S is
a whole number fixed by σ alone so that Σ c_v + c_T ≤ n·2^32 for n = 2^k
columns; what is left over is added to c_0. A proposal picks an outcome v with
probability c_v/(n·2^32) from Walker's alias table (Walker 1977; Vose 1991),
built in integers: a column i uniform on k keystream bits, then a 32-bit
uniform r against the column's integer threshold T_i (r < T_i keeps i, else
its alias A_i), which is exact because every threshold is a whole number of
2^-32. Then X = v·h + U with U uniform on j bits, and X is accepted with
probability a = S·π(X)/c_v ≤ 1. The accepted X has mass
(c_v/(n·2^32))·(1/h)·S·π(X)/c_v = S·π(X)/(n·2^32·h) ∝ π(X), the same constant
for every bin.

**The tail.** The outcome T stands for x ≥ B with a geometric envelope: a
count K with P[K = k] = 2^-(k+1) (the zero bits before the first one), then
X = B + K·W + U' with W = 2^jt ≥ σ and U' uniform on [0, W), accepted with
probability S·π(X)·2^(K+1)·W/(c_T·h). That has the same accepted mass
S·π(X)/(n·2^32·h) as the bins, and stays ≤ 1 because c_T = ⌊2·S·π(B)·W/h⌋ + 1
and π(x + W)/π(x) ≤ exp(−B·W/σ²) ≤ e^(−1) < 1/2 on x ≥ B (B ≥ σ, W ≥ σ), so
π ≤ π(B)·2^(−k) on tail bin k. With B ≥ 8σ the tail is proposed about once in
2^40 proposals; it is drawn in Python from a side stream. So, given uniform
bits, X follows π on all of Z≥0, without truncation.

**Exact decisions.** The alias step compares integers. The acceptance test
"u < a" takes u = (w + r')/2^31 from 31 keystream bits w (the 32nd is the
sign) and the rest r' of an infinite-precision uniform. numpy computes
p̂ = exp(ln(S/c_v) − X²/(2σ²)) and d = (p̂ + 2^20) − (2^20 + w/2^31), both
doubles on the grid 2^-32 in [2^20, 2^21): the second is exact, the first
rounds by at most 2^-33, so |d − (a − w/2^31)| ≤ 2^-33 + |p̂ − a|. With
|p̂ − a| ≤ 2^-44 (below) the test is decided for every r' when
d ≥ 2^-31 + 2^-32 (accept) or d ≤ −2^-32 (reject); otherwise (about three
words w in 2^32) it is decided in exact arithmetic with Python's ``decimal``
(correctly rounded ln at 60 digits and more until the comparison is certain),
r' taken as 256 further bits from a side stream. Float error: X < 2^53 is
exact; X², the product with the rounded 1/(2σ²), ln(S/c_v) and the sum carry
relative errors of a few 2^-53 on terms of size at most 33 (X < B ≤ 8σ + h,
S < 2^43), so the exponent is off by less than 2^-45 and, with exp's own error of a few
ulp, |p̂ − a| < 2^-44. Floating point therefore only chooses between "decided"
and "decide exactly", never the outcome. The table itself (S, every c_v, c_T,
every threshold and alias) is a function of σ² alone, computed in integers
and with ``decimal`` wherever a float could round the other way, so two
installations build the same table bit for bit.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["GaussianTable", "gaussian_table", "propose"]

#: B ≥ REACH·σ: beyond it the tail outcome takes over (about 2^-40 of proposals).
REACH = 8
#: Bin width h = 2^j ≤ σ/2^_BIN_BITS.
_BIN_BITS = 5
_COLUMN_BITS = 32
#: √(π/2) rounded up (1.2533141373155002…).
_ROOT_HALF_PI_UP = Fraction(1_253_314_137_316, 10**12)
_TAIL_LABEL = b"zerosum/v3/discrete-gaussian-tail"
_ACCEPT_BITS = 31 + 256  # the acceptance uniform's keystream word and its side fraction
_TWO20 = 2.0**20
_TWO20_BITS = np.uint64(0x4130000000000000)  # the bits of the double 2^20
_TWO52_BITS = np.uint64(0x4330000000000000)  # the bits of the double 2^52
_TWO53 = 2.0**53
_EVEN32 = np.uint64(0xFFFFFFFE)  # the acceptance word w, as 2w/2^32 on the 2^20 grid
_U63 = np.uint64(63)
_NOT_ONE = np.uint64(~1 & ((1 << 64) - 1))
#: Half-width of an acceptance test's undecided band, in units of 2^-32 (module docstring).
GUARD32 = 1.0
_TWO32 = float(2**32)


def _ceil_sqrt(value: Fraction) -> int:
    """The smallest whole m ≥ 0 with m² ≥ value."""
    whole = math.ceil(value)
    return 0 if whole <= 0 else math.isqrt(whole - 1) + 1


def _scaled_weight(scale: int, exponent: Fraction) -> int:
    """⌊scale·exp(−exponent)⌋ + 1, exactly (exponent ≥ 0)."""
    if exponent == 0:
        return scale + 1
    precision = 60
    while precision <= 4000:
        with localcontext() as ctx:
            ctx.prec = precision
            value = (
                Decimal(scale)
                * (-(Decimal(exponent.numerator) / Decimal(exponent.denominator))).exp()
            )
            floor = int(value)
            margin = Decimal(10) ** (-(precision - 25)) * (value + 1)
            # exp(−exponent) > 0, so a floor of 0 needs no margin below.
            if (floor == 0 or value - floor > margin) and floor + 1 - value > margin:
                return floor + 1
        precision *= 2
    raise ArithmeticError("an exact weight did not resolve")  # pragma: no cover


def _pi_up(exponent: Fraction) -> Fraction:
    """An upper bound on exp(−exponent), within 10^-40 of it."""
    with localcontext() as ctx:
        ctx.prec = 60
        value = (-(Decimal(exponent.numerator) / Decimal(exponent.denominator))).exp()
    return Fraction(value) + Fraction(1, 10**40)


def _float_weights(scale: int, variance: Fraction, width: int, bins: int) -> list[int]:
    """c_v = ⌊S·π(v·h)⌋ + 1 for every bin: in float64 where that is certain, else exactly."""
    xs = np.arange(bins, dtype=np.float64) * float(width)
    values = float(scale) * np.exp(-(xs * xs) / (2.0 * float(variance)))
    floors = np.floor(values)
    # The float value is within a few 2^-50 of the true one (relative): its floor is the
    # true floor unless it lies that close to a whole number.
    slack = values * 2.0**-40 + 2.0**-40
    unsure = (values - floors <= slack) | (floors + 1.0 - values <= slack)
    weights = [int(f) + 1 for f in floors.tolist()]
    for v in np.flatnonzero(unsure).tolist():
        weights[v] = _scaled_weight(scale, Fraction(v * width) ** 2 / (2 * variance))
    return weights


def _alias(weights: list[int], column: int) -> tuple[list[int], list[int]]:
    """Walker's alias table in integers: thresholds T_i ∈ [0, column] and aliases A_i.

    ``weights`` sum to len(weights)·column; column i yields i with probability
    T_i/column, else A_i, so outcome v has probability weights[v]/Σ weights exactly.
    """
    n = len(weights)
    left = list(weights)
    thresholds = [column] * n
    aliases = list(range(n))
    small = [i for i, w in enumerate(left) if w < column]
    large = [i for i, w in enumerate(left) if w >= column]
    while small and large:
        s = small.pop()
        big = large.pop()
        thresholds[s] = left[s]
        aliases[s] = big
        left[big] -= column - left[s]
        (small if left[big] < column else large).append(big)
    if any(left[i] != column for i in small + large):  # pragma: no cover - Σ is n·column
        raise ArithmeticError("alias weights do not sum to whole columns")
    return thresholds, aliases


@dataclass(frozen=True)
class GaussianTable:
    """The proposal for N_Z(0, σ²): bins of width 2^j up to B, a tail, an alias table.

    ``weights`` are c_0 … c_(bins−1), then c_T, then zeros up to 2^k outcomes;
    ``scale`` is S. The numpy arrays are what the vectorised proposals read,
    two entries per column: the column's threshold shifted to the top 32 bits
    twice (``b < tops[2i]`` ⟺ r < T_i), then, at 2i its alias's and at 2i + 1
    its own outcome's v·2^j − 2^52 (−2^62 for the tail, which marks it) and
    ln(S/c_v).
    """

    variance: Fraction
    j: int
    k: int
    bins: int
    tail_bits: int  # W = 2^tail_bits ≥ σ
    scale: int
    weights: tuple[int, ...]
    aliases: tuple[int, ...]
    tops: NDArray[np.uint64]
    offsets: NDArray[np.float64]
    log_ratios: NDArray[np.float64]
    neg_half_precision: float  # −1/(2σ²), rounded

    @property
    def reach(self) -> int:
        """B = bins·2^j: the tail starts here."""
        return self.bins << self.j

    def outcome(self, pair: int) -> int:
        """The outcome at entry ``pair`` of the pair tables (2i + 1: column i, 2i: its alias)."""
        column = pair >> 1
        return column if pair & 1 else self.aliases[column]

    def exponent(self, x: int) -> Fraction:
        """x²/(2σ²), exactly."""
        return Fraction(x * x) / (2 * self.variance)

    def exact_accept(self, v: int, x: int, word31: int, side: int) -> bool:
        """Whether u < S·π(x)/c_v for u = (word31 + side/2^256)/2^31, exactly."""
        twos = -1 if self.j == 0 and v == 0 else 0  # the value 0 alone: S·π(0)/(2·c_0)
        return _accept_log(
            self.exponent(x), self.weights[v], self.scale, twos, (word31 << 256) | side
        )

    def tail(self, bits: Callable[[int], int]) -> tuple[bool, int]:
        """One tail proposal from the side bits ``bits(count)``: (accepted, X)."""
        k = 0
        while bits(1) == 0:
            k += 1
        x = self.reach + (k << self.tail_bits) + bits(self.tail_bits)
        # a = S·π(x)·2^(k+1)·W/(c_T·h), W = 2^tail_bits and h = 2^j.
        accepted = _accept_log(
            self.exponent(x),
            self.weights[self.bins],
            self.scale,
            k + 1 + self.tail_bits - self.j,
            bits(_ACCEPT_BITS),
        )
        return accepted, x


def _accept_log(exponent: Fraction, weight: int, scale: int, twos: int, numerator: int) -> bool:
    """u < (scale·2^twos/weight)·exp(−exponent) for u = numerator/2^287, exactly."""
    if numerator == 0:  # pragma: no cover - probability 2^-287
        return True
    precision = 60
    while precision <= 4000:
        with localcontext() as ctx:
            ctx.prec = precision
            neg_log_u = -(Decimal(numerator) / (Decimal(2) ** _ACCEPT_BITS)).ln()
            limit = (
                Decimal(exponent.numerator) / Decimal(exponent.denominator)
                + _ln(weight, precision)
                - _ln(scale, precision)
                - twos * _ln(2, precision)
            )
            gap = neg_log_u - limit
            if abs(gap) > Decimal(10) ** (-(precision - 30)) * (abs(limit) + neg_log_u + 1):
                return gap > 0
        precision *= 2
    raise ArithmeticError("an exact comparison did not resolve")  # pragma: no cover


@functools.lru_cache(maxsize=512)
def _ln(value: int, precision: int) -> Decimal:
    """ln(``value``) to ``precision`` digits: the same Decimal every time it is asked for.

    Decimal's ln is correctly rounded (half-even) whatever the context's
    rounding, so it depends on ``precision`` alone and a value kept from an
    earlier call is the one a new call would compute. A tail proposal needs
    ln of the table's weight and scale and of 2, constants of its table.
    """
    with localcontext() as ctx:
        ctx.prec = precision
        return Decimal(value).ln()


def gaussian_table(variance: Fraction) -> GaussianTable:
    """The table for N_Z(0, σ²), σ² = ``variance`` (exact), with B ≥ :data:`REACH`·σ."""
    return _table(variance, REACH)


@functools.lru_cache(maxsize=128)
def _table(variance: Fraction, reach: int) -> GaussianTable:
    if variance <= 0:
        raise ValueError(f"variance must be > 0; got {variance}")
    if reach < 1:
        raise ValueError(f"reach must be >= 1; got {reach}")
    # h = 2^j ≤ σ/32 (j = 0 below σ = 64): ⌊log2 σ⌋ from the integer square root.
    j = max(0, math.isqrt(math.floor(variance)).bit_length() - 1 - _BIN_BITS)
    width = 1 << j
    bins = max(1, _ceil_sqrt(Fraction(reach * reach) * variance / (width * width)))
    if bins << j > 1 << 53:
        raise ValueError(f"variance {float(variance):.4g} is too large for exact bins")
    k = max(1, bins.bit_length())  # 2^k ≥ bins + 1 outcomes
    tail_bits = max(0, _ceil_sqrt(variance) - 1).bit_length()  # 2^tail_bits ≥ σ
    # S from an upper bound on Σ_(v < bins) π(v·h): 1/2 + s·√(π/2)·(1 + 10^-8) for s = σ/h ≥ 1
    # (Poisson summation; the correction is below 2·e^(−2π²) there), the sum itself below.
    s_up = Fraction(math.isqrt(math.ceil(variance * 4**40 / (width * width))) + 1, 2**40)
    if s_up >= 1:
        sum_up = Fraction(1, 2) + s_up * _ROOT_HALF_PI_UP * (1 + Fraction(1, 10**8))
    else:
        sum_up = sum((_pi_up(Fraction(v * v) / (2 * variance)) for v in range(bins)), Fraction(0))
    if j == 0:  # bins of one value: the value 0 is proposed with half its weight (no sign)
        sum_up -= Fraction(1, 2)
    # With the tail's 2·(W/h)·π(B), Σ c ≤ S·(that bound) + bins + 1 ≤ total.
    tail_exponent = Fraction((bins << j) ** 2) / (2 * variance)
    sum_up += 2 * Fraction(1 << tail_bits, width) * _pi_up(tail_exponent)
    total = (1 << k) << _COLUMN_BITS
    scale = math.floor(total * (1 - Fraction(1, 2**20)) / sum_up)
    weights = _float_weights(scale, variance, width, bins)
    if j == 0:
        weights[0] = scale // 2 + 1  # ⌊S·π(0)/2⌋ + 1
    # 2·S·W/h is whole: h = 1, or h ≤ σ/32 < W (both powers of two).
    tail_weight = _scaled_weight(2 * scale * (1 << tail_bits) // width, tail_exponent)
    weights.append(tail_weight)
    left = total - sum(weights)
    if left < 0:  # pragma: no cover - S leaves room by construction
        raise ArithmeticError("the bin weights exceed the table")
    weights[0] += left
    weights.extend([0] * ((1 << k) - len(weights)))
    thresholds, aliases = _alias(weights, 1 << _COLUMN_BITS)
    top = (1 << 64) - 1
    offsets = [float((v << j) - (1 << 52)) for v in range(bins)] + [-(2.0**62)]
    offsets.extend([0.0] * ((1 << k) - len(offsets)))
    log_ratios = [math.log(scale / w) if w else -math.inf for w in weights]
    if j == 0:
        log_ratios[0] = math.log(scale / (2 * weights[0]))
    # Pair tables: entry 2i + 1 is column i's own outcome, entry 2i its alias.
    pair_outcomes = [v for i in range(1 << k) for v in (aliases[i], i)]
    return GaussianTable(
        variance=variance,
        j=j,
        k=k,
        bins=bins,
        tail_bits=tail_bits,
        scale=scale,
        weights=tuple(weights),
        aliases=tuple(aliases),
        tops=np.array([min(t << 32, top) for t in thresholds for _ in (0, 1)], dtype=np.uint64),
        offsets=np.array([offsets[v] for v in pair_outcomes], dtype=np.float64),
        log_ratios=np.array([log_ratios[v] for v in pair_outcomes], dtype=np.float64),
        neg_half_precision=-1.0 / (2.0 * float(variance)),
    )


def tail_bits(key: bytes, block: int, index: int) -> Callable[[int], int]:
    """A reader of side bits for a tail proposal: SHA-256 blocks of (key, block, index, counter)."""
    state = {"buffer": 0, "held": 0, "counter": 0}

    def read(count: int) -> int:
        while state["held"] < count:
            digest = hashlib.sha256(
                _TAIL_LABEL + key + struct.pack(">QQQ", block, index, state["counter"])
            ).digest()
            state["counter"] += 1
            state["buffer"] = (state["buffer"] << 256) | int.from_bytes(digest, "big")
            state["held"] += 256
        state["held"] -= count
        value = state["buffer"] >> state["held"]
        state["buffer"] &= (1 << state["held"]) - 1
        return value

    return read


class Workspace:
    """Buffers for one batch of proposals, reused from batch to batch."""

    def __init__(self, size: int) -> None:
        self.pairs = np.empty(size, dtype=np.uint64)
        self.tops = np.empty(size, dtype=np.uint64)
        self.keep = np.empty(size, dtype=np.bool_)
        self.bits = np.empty(size, dtype=np.uint64)
        self.x = np.empty(size, dtype=np.float64)
        self.p = np.empty(size, dtype=np.float64)
        self.z = np.empty(size, dtype=np.float64)
        self.accepted = np.empty(size, dtype=np.bool_)
        self.unsure = np.empty(size, dtype=np.bool_)
        self._views: dict[int, tuple[Any, ...]] = {}

    def views(self, m: int) -> tuple[Any, ...]:
        """The buffers cut to m proposals (cut once per size: most batches have the same)."""
        cut = self._views.get(m)
        if cut is None:
            cut = tuple(
                buffer[:m]
                for buffer in (
                    self.pairs,
                    self.tops,
                    self.keep,
                    self.bits,
                    self.x,
                    self.p,
                    self.z,
                    self.accepted,
                    self.unsure,
                )
            )
            self._views[m] = cut
        return cut


def propose(  # noqa: PLR0917 - one call site, every argument needed
    table: GaussianTable,
    a: NDArray[np.uint64],
    b: NDArray[np.uint64],
    side: Callable[[int], int],
    tail: Callable[[int], Callable[[int], int]],
    work: Workspace,
) -> tuple[NDArray[np.float64], list[tuple[int, int]]]:
    """The accepted values among the proposals made from words a[i], b[i], in order.

    Proposal i takes its column from the top k bits of a[i] and U from its low
    j bits; from b[i] the alias uniform (top 32 bits), the acceptance word
    (bits 1–31) and the sign (bit 0). Values come back as float64 holding
    whole numbers exactly, with (position, value) pairs for tail values of
    2^53 or more, which the caller writes in as integers. ``side(i)`` gives
    the 256 side bits of proposal i's acceptance test, ``tail(i)`` a reader
    of side bits for a tail proposal.
    """
    m = a.size
    pairs, tops, keep, bits, x, p, z, accepted, unsure = work.views(m)
    # t = 2·column + (a's next bit): both entries of a column's pair hold its threshold.
    np.right_shift(a, np.uint64(63 - table.k), out=pairs)
    index = pairs.view(np.int64)
    np.take(table.tops, index, out=tops, mode="clip")
    np.less(b, tops, out=keep)  # r < T_i: the column's own outcome
    # Entry 2i + 1 of the outcome tables is column i's own outcome, entry 2i its alias.
    pairs &= _NOT_ONE
    np.add(pairs, keep, out=pairs, casting="unsafe")
    # X = (2^52 + U) + (v·2^j − 2^52): U's j bits under 2^52's exponent, both doubles exact.
    np.bitwise_and(a, np.uint64((1 << table.j) - 1), out=bits)
    bits |= _TWO52_BITS
    np.take(table.offsets, index, out=x, mode="clip")
    x += bits.view(np.float64)
    np.multiply(x, x, out=p)
    p *= table.neg_half_precision
    np.take(table.log_ratios, index, out=z, mode="clip")
    p += z
    np.exp(p, out=p)  # p̂ ≈ S·π(X)/c_v
    # d = (p̂ + 2^20) − (2^20 + w/2^31), w = bits 1–31 of b: exact but for p̂'s rounding.
    p += _TWO20
    np.bitwise_and(b, _EVEN32, out=bits)
    bits |= _TWO20_BITS
    p -= bits.view(np.float64)
    np.greater_equal(p, (2.0 + GUARD32) / _TWO32, out=accepted)
    np.greater(p, -GUARD32 / _TWO32, out=unsure)
    if np.count_nonzero(unsure) == np.count_nonzero(accepted):
        unsure_at: list[int] = []
    else:
        unsure ^= accepted
        unsure_at = np.flatnonzero(unsure).tolist()
    large: dict[int, int] = {}
    lowest = float(np.minimum.reduce(x))  # < 0: a tail proposal (x ≈ −2^62 marks it)
    for i in unsure_at:
        if x[i] >= 0.0:
            accepted[i] = table.exact_accept(
                table.outcome(int(pairs[i])), int(x[i]), (int(b[i]) & 0xFFFFFFFF) >> 1, side(i)
            )
    tails: list[int] = np.flatnonzero(x < 0.0).tolist() if lowest < 0.0 else []
    for i in tails:  # drawn from side bits
        accepted[i], value = table.tail(tail(i))
        if value >= 1 << 53:
            large[i] = value
            x[i] = _TWO53
        else:
            x[i] = float(value)
    # The sign is b's lowest bit, set as the double's sign bit; −0 is rejected (X = 0 once).
    if table.j and lowest <= 0.0 and np.minimum.reduce(x) == 0.0:
        zero = np.flatnonzero(x == 0.0)
        accepted[zero[(b[zero] & np.uint64(1)) == 1]] = False
    np.left_shift(b, _U63, out=bits)
    signed = x.view(np.uint64)
    np.bitwise_or(signed, bits, out=signed)
    patches = [
        (int(np.count_nonzero(accepted[:i])), -value if int(b[i]) & 1 else value)
        for i, value in sorted(large.items())
        if accepted[i]
    ]
    return np.compress(accepted, x), patches
