"""Integer noise from the keyed streams: the discrete Gaussian and the discrete Laplace.

Everything a node adds to its egress is an integer on the fixed-point grid,
drawn here from an AES-128-CTR keystream (``noise.stream``) so that both ends
of a pair draw the same integers. No step maps a float onto the output grid,
so the output has no float-lattice structure at any scale.

**Target laws.** N_Z(0, σ²) has P[Y = y] ∝ exp(−y²/(2σ²)) on the integers
(Canonne, Kamath & Steinke 2020, "The discrete Gaussian for differential
privacy", NeurIPS; arXiv 2004.00010); Lap_Z(b) has P[Y = y] ∝ exp(−|y|/b).

**The discrete Gaussian** is drawn from the proposal of
``noise.gaussian_table`` (integer bin weights, an alias draw and one
acceptance test, about 99 % of proposals accepted); its exactness argument is
in that module. The rest of this docstring is the discrete Laplace's, which
follows Canonne et al.'s Algorithm 2 with a wider split of t; both share the
keystream, the blocks, the batches and the exact comparison on the 2^-32
grid described below.

**Proposal.** Fix t = L·2^j with L a whole number (32 ≤ L < 64 once the scale
reaches 64) and t' = t/L = 2^j.
Draw U uniform on {0, …, t' − 1} (the top j bits of a keystream word), V
geometric with P[V ≥ v] = e^(−v/L), i.e. V = ⌊−L ln u⌋ for a uniform u whose
first 32 bits come from the keystream (decided in float64 unless u's cell of
width 2^-32 straddles a jump of V, then exactly), a sign bit S (the word's
lowest bit), and set X = U + t'·V, Y = ±X. Then
P[U = u, V = v] ∝ e^(−v/L) = e^(−t'v/t), so accepting with probability
e^(−U/t) leaves P[X = x] ∝ e^(−x/t): the proposal is Lap_Z(t) except that 0 is
reached with either sign, which the sampler rejects once (S = 1, X = 0),
exactly as in Canonne et al.'s Algorithm 2. Splitting t into L·t' makes the
first acceptance e^(−U/t) ≥ e^(−1/L): about 99 % of proposals pass it
(the undivided U < t passes 63 %).

**Acceptance.** Both Bernoulli steps are folded into one test with
probability p = exp(−γ), γ = U/t + X·(1/b − 1/t) with b ≤ t ≤ (1 + 1/32)·b,
so the accepted Y has P ∝ e^(−|y|/b). (The same proposal serves the discrete
Gaussian with γ = U/t + (X − σ²/t)²/(2σ²), Canonne et al.'s Algorithm 3, but
accepts only about 76 % there; ``noise.gaussian_table`` accepts about 99 %.)

**Exact decisions from floating point.** A test "u < p" takes its uniform u
from 32 keystream bits, u = (w + r)/2^32 with r ∈ [0, 1) the rest of an
infinite-precision uniform. numpy computes p̂ = exp(−γ̂) in float64 and
d = (p̂ + 2^20) − (2^20 + w/2^32): both doubles lie in [2^20, 2^21), where
the spacing is 2^-32, so the second is exact (2^20's bits OR-ed with w), the
first rounds by at most 2^-33 and the difference is exact; hence
|d − (p − w/2^32)| ≤ 2^-33 + |p̂ − p|. With |p̂ − p| ≤ 2^-49 (below) the
test is decided exactly whenever d ≥ (1 + g)/2^32 (then w + 1 ≤ p·2^32:
accept for every r) or d ≤ −g/2^32 (then w ≥ p·2^32: reject for every r),
with the guard g = 1 > 1/2 + 2^-17. Otherwise (three values of w in 2^32,
so probability about 2^-30 per test) the same test is decided in exact
arithmetic: γ as a fraction, ln u with Python's ``decimal`` (correctly
rounded) at 60 digits and more until the comparison is certain, and the bits
of r from a side stream, SHA-256 of the key, the block, the proposal's index
and the test (ties of V against its thresholds are resolved the same way).
So the sampler draws *exactly* from N_Z(0, σ²) or Lap_Z(b) given uniform
keystream bits, provided numpy's float64 exp and arithmetic stay within
2^-49 of the true p. They do: γ̂ has relative error below 2^-50 (U·2^-k is
exact; X·(1/b − 1/t) is one rounded product of an exact X), p·|γ̂ − γ| ≤
p·γ·2^-50 + … < 2^-50, and float64 exp is accurate to a few ulp (2^-51
absolute on [0, 1]). The value X = U + 2^j·V itself is built in float64
(2^j·V and U are exact, and so is their sum below 2^53); the rare X of 2^53
or more (only for scales above about 2^47) is rebuilt from U and V as a
Python integer and written into the output as one, so no output is ever a
rounded double. :data:`SAMPLER_TV_PER_DRAW` is the total-variation distance
this leaves between the sampler and its target law (see :func:`sampler_delta`).

**Determinism.** The output depends only on the key, the scale (as an exact
fraction) and n: draws are made in blocks of :data:`BLOCK` values, block b on
the keystream whose counter starts at c + b·2^48 (c from the key, as in
``noise.stream``), each block in batches whose sizes depend only on how many
values are still missing (whole blocks are independent of n, but the draws
for n and n' < BLOCK need not share a prefix). Every floating-point value only chooses between
"decided" and "decide exactly", never the outcome, so two installations with
different libm or SIMD code draw the same integers. The keystream words are
randomgen's ``AESCounter`` words, made by OpenSSL (``noise.stream.Keystream``)
because its one-call-per-batch AES is four times faster; each batch is worked
through in buffers reused from batch to batch, which changes where the work
is cached, not what is drawn.
"""

from __future__ import annotations

import functools
import hashlib
import math
import operator
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from numbers import Rational, Real
from typing import Any

import numpy as np
from numpy.typing import NDArray

from noise.errors import CalibrationError
from noise.gaussian_table import GaussianTable, gaussian_table, tail_bits
from noise.gaussian_table import Workspace as GaussianWorkspace
from noise.gaussian_table import propose as gaussian_proposals
from noise.keys import require_bytes
from noise.stream import Keystream

__all__ = [
    "BLOCK",
    "MAX_SCALE",
    "MIN_SCALE",
    "SAMPLER_TV_PER_DRAW",
    "as_fraction",
    "discrete_gaussian",
    "discrete_gaussian_variance",
    "discrete_laplace",
    "discretisation_tv",
    "sampler_delta",
    "sum_tv",
]

#: Values drawn per keystream block (the unit of determinism).
BLOCK = 1 << 16
#: Largest scale (σ or b, in grid units) the samplers accept: U stays below 2^45
#: (exact in float64) and X, σ²/t far below 2^63.
MAX_SCALE = float(2**50)
#: Smallest scale accepted: below a thousandth of a grid unit the noise is no noise.
MIN_SCALE = 1e-3
#: Total-variation distance between one draw and its target law: 0 for the
#: sampler itself, which is exact under the stated guard (module docstring).
SAMPLER_TV_PER_DRAW = 0.0

_KEY_BYTES = 32
_BLOCK_COUNTER_STRIDE = 1 << 48
_TIE_LABEL = b"zerosum/v2/discrete-tie"
#: Half-width of the undecided band of an acceptance test, in units of 2^-32:
#: it covers the 2^-33 of rounding in d and the 2^-49 of float error in p̂.
_GUARD32 = 1.0
_TWO32 = float(2**32)
_TWO20 = 2.0**20
_TWO20_BITS = np.uint64(0x4130000000000000)  # the bits of the double 2^20
_TWO53 = 2.0**53
#: −ln u_pt ≤ 53 ln 2 < 36.74 for every u_pt ≥ 2^-53 (so V ≤ 36.74·L from float).
_MOST_NEG_LOG = 36.74
_BATCH = 1 << 14
_LE_U64 = np.dtype("<u8")
_TWO52 = 2.0**52
_TWO52_BITS = np.uint64(0x4330000000000000)  # the bits of the double 2^52
_ONE_BITS = np.uint64(0x3FF0000000000000)  # the bits of the double 1.0
_U12 = np.uint64(12)
_U63 = np.uint64(63)
_LOW32 = np.uint64(0xFFFFFFFF)
# V's tie test, scaled by 2^-32: (1 + 2^-15)·L/2^32 (module docstring and _proposals).
_V_TIE_BOUND = (1.0 + 2.0**-15) / 2.0**32
_MAX_BATCHES = 10_000


def as_fraction(value: float | Fraction | int, what: str) -> Fraction:
    """``value`` as an exact fraction (a float is taken at its exact binary value)."""
    if isinstance(value, bool) or not isinstance(value, Real | Rational):
        raise CalibrationError(what, value, "must be a real number")
    if isinstance(value, Fraction):
        exact = value
    elif isinstance(value, int):
        exact = Fraction(value)
    else:
        f = float(value)
        if not math.isfinite(f):
            raise CalibrationError(what, f, "must be finite")
        exact = Fraction(f)
    return exact


@dataclass(frozen=True)
class _Law:
    """Lap_Z(b) and its proposal: t = L·2^j, U on j bits, V geometric of ratio e^(−1/L)."""

    j: int  # U is uniform on {0, …, 2^j − 1}
    big_l: int  # L: P[V ≥ v] = e^(−v/L)
    scale: Fraction  # b

    @property
    def t(self) -> int:
        return self.big_l << self.j

    @functools.cached_property
    def shifts(self) -> tuple[np.uint64, float, float, float]:
        """(64 − j as a shift count, 2^j, L, V's tie bound) as the ufuncs take them."""
        big_l = float(self.big_l)
        return (
            np.uint64(64 - self.j),
            float(1 << self.j),
            big_l,
            _V_TIE_BOUND * big_l + 0.5 / _TWO32,
        )

    @functools.cached_property
    def reaches_2_53(self) -> bool:
        """Whether X = U + 2^j·V can reach 2^53 with V from float (then X is fixed up exactly)."""
        most_v = math.floor(_MOST_NEG_LOG * self.big_l)
        return (most_v + 1) << self.j >= 1 << 53

    @functools.cached_property
    def floats(self) -> tuple[float, float]:
        """The floats of γ = U/t + X·(1/b − 1/t): (−(1/b − 1/t), −1/t)."""
        return -float(1 / self.scale - Fraction(1, self.t)), -1.0 / self.t

    def gamma_exact(self, u: int, x: int) -> Fraction:
        """γ with acceptance probability exp(−γ) for the proposal (U, X), exactly."""
        return Fraction(u, self.t) + x * (1 / self.scale - Fraction(1, self.t))


def _shown(value: Fraction) -> float:
    """A fraction as a float for an error message, without overflowing."""
    try:
        return float(value)
    except OverflowError:
        return math.copysign(math.inf, value)


def _check_scale(scale: Fraction, what: str) -> None:
    if not Fraction(MIN_SCALE) <= scale <= Fraction(MAX_SCALE):
        raise CalibrationError(
            what,
            _shown(scale),
            f"must lie between {MIN_SCALE:g} and 2^50 = {MAX_SCALE:.4g} grid units",
        )


def _check_variance(variance: Fraction) -> None:
    if not Fraction(MIN_SCALE) ** 2 <= variance <= Fraction(MAX_SCALE) ** 2:
        raise CalibrationError(
            "variance",
            _shown(variance),
            f"must lie between {MIN_SCALE:g}² and (2^50)² grid units²",
        )


def _laplace_law(scale: Fraction) -> _Law:
    _check_scale(scale, "scale")
    # t ≥ b (the proposal must be wider), within 1/32 of it.
    j = max(0, math.ceil(scale).bit_length() - 6)
    big_l = max(1, math.ceil(scale / (1 << j)))
    return _Law(j, big_l, scale)


def _side_fraction(key: bytes, block: int, index: int, test: int) -> int:
    """256 further bits of the uniform of one test (an integer r with r/2^256 ∈ [0, 1))."""
    digest = hashlib.sha256(_TIE_LABEL + key + struct.pack(">QQB", block, index, test)).digest()
    return int.from_bytes(digest, "big")


def _neg_log(numerator: int, bits: int, precision: int) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = precision
        return -(Decimal(numerator) / (Decimal(2) ** bits)).ln()


def _exact_geometric(big_l: int, word32: int, side: int) -> int:
    """V = ⌊−L·ln u⌋ for the uniform u = (word32 + side/2^256)/2^32, exactly."""
    numerator = (word32 << 256) | side
    if numerator == 0:  # pragma: no cover - probability 2^-288
        raise ArithmeticError("a uniform of zero; the keystream is broken")
    precision = 60
    while precision <= 4000:
        with localcontext() as ctx:
            ctx.prec = precision
            z = _neg_log(numerator, 288, precision) * big_l
            floor = int(z)  # z > 0
            margin = Decimal(10) ** (-(precision - 25))
            if z - floor > margin and floor + 1 - z > margin:
                return floor
        precision *= 2
    raise ArithmeticError("an exact comparison did not resolve")  # pragma: no cover


def _exact_accept(gamma: Fraction, word32: int, side: int) -> bool:
    """Whether u < exp(−γ), i.e. −ln u > γ, for u = (word32 + side/2^256)/2^32, exactly."""
    if gamma == 0:
        return True
    numerator = (word32 << 256) | side
    if numerator == 0:  # pragma: no cover - probability 2^-288
        return True
    precision = 60
    while precision <= 4000:
        z = _neg_log(numerator, 288, precision)
        with localcontext() as ctx:
            ctx.prec = precision
            limit = Decimal(gamma.numerator) / Decimal(gamma.denominator)
            gap = z - limit
            if abs(gap) > Decimal(10) ** (-(precision - 25)) * (abs(limit) + 1):
                return gap > 0
        precision *= 2
    raise ArithmeticError("an exact comparison did not resolve")  # pragma: no cover


class _Workspace:
    """Buffers for one batch of proposals, reused from batch to batch."""

    def __init__(self, size: int) -> None:
        self.u_pt = np.empty(size, dtype=np.float64)
        self.uf = np.empty(size, dtype=np.float64)
        self.z = np.empty(size, dtype=np.float64)
        self.vf = np.empty(size, dtype=np.float64)
        self.xf = np.empty(size, dtype=np.float64)
        self.p = np.empty(size, dtype=np.float64)
        self.bits = np.empty(size, dtype=np.uint64)
        self.v_unsure = np.empty(size, dtype=np.bool_)
        self.unsure = np.empty(size, dtype=np.bool_)
        self.accepted = np.empty(size, dtype=np.bool_)
        self._views: dict[int, tuple[Any, ...]] = {}

    def views(self, m: int) -> tuple[Any, ...]:
        """The buffers cut to m proposals (cut once per size: most batches have the same)."""
        cut = self._views.get(m)
        if cut is None:
            cut = (
                self.u_pt[:m],
                self.z[:m],
                self.vf[:m],
                self.xf[:m],
                self.p[:m],
                self.uf[:m],
                self.bits[:m],
                self.v_unsure[:m],
                self.unsure[:m],
                self.accepted[:m],
            )
            self._views[m] = cut
        return cut


def _proposals(  # noqa: PLR0915, PLR0917 - one vectorised pass over a batch (design §6.2)
    law: _Law,
    a: NDArray[np.uint64],
    b: NDArray[np.uint64],
    key: bytes,
    block: int,
    first_index: int,
    work: _Workspace,
) -> tuple[NDArray[np.float64], list[tuple[int, int]]]:
    """The accepted values among the proposals made from words a[i], b[i], in order.

    Proposal i takes U from the top j bits of a[i] and its sign from a[i]'s
    lowest bit, V's uniform from the top 32 bits of b[i] and the acceptance
    test's from its low 32. The values come back as float64 holding whole
    numbers exactly (X = U + 2^j·V is built in float64, exact below 2^53),
    with a list of (position, value) for the rare values of 2^53 or more,
    which a float cannot hold and the caller writes in as integers. The float
    work runs in ``work``'s buffers, with integer inputs fed straight to float
    ufuncs so that no conversion takes a pass of its own.
    """
    m = a.size
    u_pt, z, vf, xf, p, uf, bits, v_unsure, unsure, accepted = work.views(m)
    u_shift, two_j, big_l, tie_bound = law.shifts
    # V = ⌊−L ln u⌋ for V's uniform u = (w + r)/2^32, w the top 32 bits of b.
    # The double 1 + k/2^52 has the bits of 1.0 OR-ed with a 52-bit k; with k
    # the top 52 bits of b, u_pt = (k + 1/2)/2^52 (exact) lies inside u's cell
    # [w, w + 1)/2^32, over which −L ln u moves by at most L/w from its value
    # at u_pt. V is decided unless that interval holds an integer: with f the
    # fractional part of −L ln u_pt, every undecided cell has
    # min(f, 1 − f)·w ≤ (1 + 2^-15)·L (the 2^-15 covers the float error of
    # −L ln u_pt, a few ulp), hence f(1 − f)·u_pt·2^32 < min(f, 1 − f)·(w + 1)
    # ≤ (1 + 2^-15)·L + 1/2, the test below.
    np.right_shift(b, _U12, out=bits)
    bits |= _ONE_BITS
    np.subtract(bits.view(np.float64), 1.0 - 2.0**-53, out=u_pt)
    np.log(u_pt, out=z)
    z *= -big_l
    np.floor(z, out=vf)
    z -= vf  # f
    np.multiply(z, z, out=p)
    z -= p  # f(1 − f)
    z *= u_pt
    np.less_equal(z, tie_bound, out=v_unsure)
    # U on the top j bits of a, exactly as the double uf (U < 2^45); X = U + 2^j·V.
    if law.j:
        np.right_shift(a, u_shift, out=bits)
    else:
        bits.fill(0)
    bits |= _TWO52_BITS
    np.subtract(bits.view(np.float64), _TWO52, out=uf)
    np.multiply(vf, two_j, out=xf)  # exact
    xf += uf  # X, exact while below 2^53 (otherwise rounded once, and fixed below)
    slope, linear = law.floats
    np.multiply(xf, slope, out=p)
    np.multiply(uf, linear, out=z)
    p += z
    np.exp(p, out=p)  # p̂ ≈ exp(−γ)
    # d = (p̂ + 2^20) − (2^20 + w'/2^32), w' the low 32 bits of b: both doubles
    # lie on the grid 2^-32 (2^20 + w'/2^32 is 2^20's bits OR-ed with w', exact;
    # p̂ + 2^20 rounds by at most 2^-33), so d = p̂ − w'/2^32 within 2^-33.
    # Accept for every r when d ≥ (1 + guard)/2^32, reject when d ≤ −guard/2^32,
    # otherwise (or when V was undecided) decide exactly.
    p += _TWO20
    np.bitwise_and(b, _LOW32, out=bits)
    bits |= _TWO20_BITS
    p -= bits.view(np.float64)
    np.greater_equal(p, (1.0 + _GUARD32) / _TWO32, out=accepted)
    np.greater(p, -_GUARD32 / _TWO32, out=unsure)
    unsure ^= accepted  # −guard < d·2^32 < 1 + guard
    unsure |= v_unsure
    large: dict[int, int] = {}
    if law.reaches_2_53 and xf.max() >= _TWO53:
        for i in np.flatnonzero(xf >= _TWO53):
            large[int(i)] = (int(a[i]) >> (64 - law.j)) + (int(vf[i]) << law.j)
    if np.count_nonzero(unsure):
        for i in np.flatnonzero(unsure):
            index = first_index + int(i)
            u_i = int(a[i]) >> (64 - law.j)
            b_i = int(b[i])
            if v_unsure[i]:
                v_i = _exact_geometric(law.big_l, b_i >> 32, _side_fraction(key, block, index, 0))
            else:
                v_i = int(vf[i])
            x_i = u_i + (v_i << law.j)
            xf[i] = float(x_i)
            if x_i >= 1 << 53:
                large[int(i)] = x_i
            else:
                large.pop(int(i), None)
            accepted[i] = _exact_accept(
                law.gamma_exact(u_i, x_i), b_i & 0xFFFFFFFF, _side_fraction(key, block, index, 1)
            )
    # The sign is a's lowest bit, set as the double's sign bit; +0 and −0 are
    # the same value, so −0 is rejected.
    if np.minimum.reduce(xf) == 0.0:  # xf ≥ 0 here
        zero = np.flatnonzero(xf == 0.0)
        accepted[zero[(a[zero] & np.uint64(1)) == 1]] = False
    np.left_shift(a, _U63, out=bits)
    signed = xf.view(np.uint64)
    np.bitwise_or(signed, bits, out=signed)
    patches = [
        (int(np.count_nonzero(accepted[:i])), -x_i if int(a[i]) & 1 else x_i)
        for i, x_i in sorted(large.items())
        if accepted[i]
    ]
    return np.compress(accepted, xf), patches


def _block_stream(key: bytes, block: int) -> Keystream:
    counter = (int.from_bytes(key[16:32], "little") + block * _BLOCK_COUNTER_STRIDE) % (1 << 128)
    return Keystream(key[:16], counter, 2 * _BATCH + 4)


#: Proposals made from the words a[i], b[i]: (accepted values as float64, integer patches).
_Proposer = Callable[
    [NDArray[np.uint64], NDArray[np.uint64], int, int],
    tuple[NDArray[np.float64], list[tuple[int, int]]],
]


def _fill_block(  # noqa: PLR0917 - one call site, every argument needed
    propose: _Proposer,
    spare: int,
    key: bytes,
    block: int,
    out: NDArray[np.int64],
    words: NDArray[np.uint64],
) -> None:
    """Fill ``out`` (at most BLOCK values) with block ``block``'s draws.

    A batch of m proposals (the values still missing, plus 1/``spare`` of
    them and 16) takes the block's next 2m words, proposal i words i and
    m + i of them, drawn in one keystream call into ``words``.
    """
    size = out.size
    stream = _block_stream(key, block)
    filled = 0
    index = 0  # proposals made so far in this block; its words start at 2·index
    for _ in range(_MAX_BATCHES):
        if filled >= size:
            return
        need = size - filled
        m = min(_BATCH, need + need // spare + 16)
        batch = stream.words_at(2 * index, 2 * m, words)
        taken, patches = propose(batch[:m], batch[m:], block, index)
        take = min(taken.size, need)
        out[filled : filled + take] = taken[:take]
        for position, value in patches:
            if position < take:
                out[filled + position] = value
        filled += take
        index += m
    raise ArithmeticError("the discrete sampler did not fill its block")  # pragma: no cover


def _count(n: int) -> int:
    if isinstance(n, bool):
        raise TypeError(f"n must be an integer; got {n!r}")
    count = operator.index(n)
    if count < 0:
        raise ValueError(f"n must be >= 0; got {count}")
    return count


def _draw(
    propose_for: Callable[[bytes, int], _Proposer], spare: int, key: bytes, n: int
) -> NDArray[np.int64]:
    """n draws, block by block, from the proposals ``propose_for(key, batch size)`` makes."""
    raw_key = require_bytes(key, _KEY_BYTES, "stream key")
    count = _count(n)
    out = np.empty(count, dtype=np.int64)
    size = min(_BATCH, count + count // spare + 16)
    propose = propose_for(raw_key, size)
    words = np.empty(2 * size + 4, dtype=_LE_U64)
    for block, start in enumerate(range(0, count, BLOCK)):
        _fill_block(propose, spare, raw_key, block, out[start : start + BLOCK], words)
    return out


def _gaussian_proposer(table: GaussianTable) -> Callable[[bytes, int], _Proposer]:
    def propose_for(key: bytes, size: int) -> _Proposer:
        work = GaussianWorkspace(size)

        def propose(
            a: NDArray[np.uint64], b: NDArray[np.uint64], block: int, first: int
        ) -> tuple[NDArray[np.float64], list[tuple[int, int]]]:
            return gaussian_proposals(
                table,
                a,
                b,
                lambda i: _side_fraction(key, block, first + i, 1),
                lambda i: tail_bits(key, block, first + i),
                work,
            )

        return propose

    return propose_for


def _laplace_proposer(law: _Law) -> Callable[[bytes, int], _Proposer]:
    def propose_for(key: bytes, size: int) -> _Proposer:
        work = _Workspace(size)

        def propose(
            a: NDArray[np.uint64], b: NDArray[np.uint64], block: int, first: int
        ) -> tuple[NDArray[np.float64], list[tuple[int, int]]]:
            return _proposals(law, a, b, key, block, first, work)

        return propose

    return propose_for


def _gaussian_draw(variance: Fraction, key: bytes, n: int) -> NDArray[np.int64]:
    _check_variance(variance)
    # About 1 % of the Gaussian's proposals are rejected, 24 % of the Laplace's.
    return _draw(_gaussian_proposer(gaussian_table(variance)), 16, key, n)


def discrete_gaussian_variance(
    key: bytes, variance: Fraction | float | int, n: int
) -> NDArray[np.int64]:
    """n draws from N_Z(0, σ²) with σ² = ``variance`` (exact; grid units squared)."""
    return _gaussian_draw(as_fraction(variance, "variance"), key, n)


def discrete_gaussian(key: bytes, scale: float, n: int) -> NDArray[np.int64]:
    """n draws from the discrete Gaussian N_Z(0, scale²) on the keystream of ``key``.

    ``scale`` is σ in grid units, taken at its exact binary value; the same
    key, scale and n give the same int64 array on every installation.
    """
    sigma = as_fraction(scale, "scale")
    _check_scale(sigma, "scale")
    return _gaussian_draw(sigma * sigma, key, n)


def discrete_laplace(key: bytes, scale: float, n: int) -> NDArray[np.int64]:
    """n draws from the discrete Laplace Lap_Z(scale): P[y] ∝ exp(−|y|/scale)."""
    return _draw(_laplace_proposer(_laplace_law(as_fraction(scale, "scale"))), 2, key, n)


def discretisation_tv(variance: float) -> float:
    """TV distance between N_Z(0, σ²) and round(N(0, σ²)): at most 1/(8σ²).

    With φ(x) = exp(−x²/(2σ²)), the rounded Gaussian puts
    ∫_{y−1/2}^{y+1/2} φ / (σ√(2π)) on y, and ∫_{y−1/2}^{y+1/2} φ ≥ φ(y)·(1 − 1/(8σ²))
    (write the integrand as φ(y)·e^(−yu/σ²)·e^(−u²/(2σ²)); the first factor
    integrates to sinh(a)/a ≥ 1, the second is ≥ 1 − 1/(8σ²) on |u| ≤ 1/2),
    while Σ_j φ(j) ≥ σ√(2π) (Poisson summation). So the rounded mass is at
    least (1 − 1/(8σ²)) times the discrete Gaussian's everywhere, and the TV
    distance, Σ (p_Z − p_R)_+, is at most 1/(8σ²).
    """
    v = float(variance)
    if not (math.isfinite(v) and v > 0.0):
        raise CalibrationError("variance", v, "must be finite and > 0")
    return min(1.0, 1.0 / (8.0 * v))


def sum_tv(variances: list[float]) -> float:
    """TV distance between a sum of independent N_Z(0, v_i) and N_Z(0, Σ v_i) (a bound).

    Kairouz, Liu & Steinke (2021, ICML) bound the distance of a sum of n
    independent discrete Gaussians from one discrete Gaussian of the summed
    variance by τ = 10·Σ_{k=1}^{n−1} exp(−2π²v·k/(k + 1)); here v is the smallest
    of the variances. For v above 40 grid units² τ is below 10^-300.
    """
    if not variances:
        raise CalibrationError("variances", math.nan, "must list at least one variance")
    smallest = min(float(v) for v in variances)
    if not (math.isfinite(smallest) and smallest > 0.0):
        raise CalibrationError("variances", smallest, "must be finite and > 0")
    return min(
        1.0,
        10.0
        * math.fsum(
            math.exp(-2.0 * math.pi**2 * smallest * k / (k + 1)) for k in range(1, len(variances))
        ),
    )


def sampler_delta(draws: int, epsilon: float) -> float:
    """δ_sampler of a release made of ``draws`` draws, at ε: (1 + e^ε)·draws·TV per draw.

    If a mechanism is (ε, δ)-DP and every output law moves by at most η in
    total variation, it is (ε, δ + (1 + e^ε)·η)-DP; independent draws add
    their TV distances. With the exact sampler η = 0 (module docstring).
    """
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 0:
        raise CalibrationError("draws", draws, "must be a whole number >= 0")
    e = float(epsilon)
    if not (e >= 0.0):
        raise CalibrationError("epsilon", e, "must be >= 0")
    if SAMPLER_TV_PER_DRAW == 0.0 or draws == 0:
        return 0.0
    return min(
        1.0, (1.0 + math.exp(min(e, 700.0))) * draws * SAMPLER_TV_PER_DRAW
    )  # pragma: no cover
