"""Integer noise from the keyed streams: the discrete Gaussian and the discrete Laplace.

Everything a node adds to its egress is an integer on the fixed-point grid,
drawn here from an AES-128-CTR keystream (``noise.stream``) so that both ends
of a pair draw the same integers. The construction follows Canonne, Kamath &
Steinke (2020, "The discrete Gaussian for differential privacy", NeurIPS;
arXiv 2004.00010): a discrete-Laplace proposal made of uniform integers and
geometric counts, and Bernoulli acceptance. No step maps a float onto the
output grid, so the output has no float-lattice structure at any scale.

**Target laws.** N_Z(0, σ²) has P[Y = y] ∝ exp(−y²/(2σ²)) on the integers;
Lap_Z(b) has P[Y = y] ∝ exp(−|y|/b).

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
probability p = exp(−γ):

* discrete Gaussian: γ = U/t + (X − σ²/t)²/(2σ²), so the accepted Y has
  P ∝ e^(−|y|/t)·e^(−(|y| − σ²/t)²/(2σ²)) ∝ e^(−y²/(2σ²)) (Canonne et al.,
  Algorithm 3, for any t > 0; t within a few per cent of σ, where about 76 %
  of proposals are accepted);
* discrete Laplace of scale b, with b ≤ t ≤ (1 + 1/32)·b: γ = U/t + X·(1/b − 1/t), so
  the accepted Y has P ∝ e^(−|y|/b).

**Exact decisions from floating point.** A test "u < p" takes its uniform u
from 32 keystream bits, u = (w + r)/2^32 with r ∈ [0, 1) the rest of an
infinite-precision uniform. numpy computes p̂ = exp(−γ̂) in float64; with
|p̂ − p| ≤ 2^-40 the test is decided exactly whenever w + 1 ≤ (p̂ − 2^-40)·2^32
(accept for every r) or w ≥ (p̂ + 2^-40)·2^32 (reject for every r). Otherwise
(probability about 2^-32 per test) the same test is decided in exact
arithmetic: γ as a fraction, ln u with Python's ``decimal`` (correctly
rounded) at 60 digits and more until the comparison is certain, and the bits
of r from a side stream, SHA-256 of the key, the block, the proposal's index
and the test (ties of V against its thresholds are resolved the same way).
So the sampler draws *exactly* from N_Z(0, σ²) or Lap_Z(b) given uniform
keystream bits, provided numpy's float64 exp and arithmetic stay within
2^-40 of the true p. They stay within 2^-49: γ̂ has relative error below
2^-50 (U·2^-k is exact; the cancellation in X − σ²/t costs at most
2^-52·max(X, σ²/t), and e^(−z²/2)·|z|·(|z| + 2√2) ≤ 2.3 for z = (X − σ²/t)/σ),
p·|γ̂ − γ| ≤ p·γ·2^-50 + … < 2^-50, and float64 exp is accurate to a few ulp
(2^-51 absolute on [0, 1]). The guard is therefore 2^9 times wider than the
error it covers; :data:`SAMPLER_TV_PER_DRAW` is the total-variation distance
this leaves between the sampler and its target law (see :func:`sampler_delta`).

**Determinism.** The output depends only on the key, the scale (as an exact
fraction) and n: draws are made in blocks of :data:`BLOCK` values, block b on
the keystream whose counter starts at c + b·2^48 (c from the key, as in
``noise.stream``), each block in batches whose sizes depend only on how many
values are still missing (whole blocks are independent of n, but the draws
for n and n' < BLOCK need not share a prefix). Every floating-point value only chooses between
"decided" and "decide exactly", never the outcome, so two installations with
different libm or SIMD code draw the same integers.
"""

from __future__ import annotations

import functools
import hashlib
import math
import operator
import struct
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from numbers import Rational, Real

import numpy as np
from numpy.typing import NDArray
from randomgen import AESCounter

from noise.errors import CalibrationError
from noise.keys import require_bytes

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
_GUARD = 2.0**-40
_GUARD32 = _GUARD * 2.0**32
_LN_TWO32 = 32.0 * math.log(2.0)
# L/(2w) bound on the cell's half-width in −L ln u, widened by 2^-16·L/w ≥ L·2^-48 for
# the float error of −L ln u at the cell's midpoint (a few ulp of a value below 23·L).
_HALF_WIDTH_SLACK = 0.5 + 2.0**-16
_TWO32 = float(2**32)
_BATCH = 1 << 14
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
    """One target law and its proposal: t = L·2^j, U on j bits, V geometric of ratio e^(−1/L)."""

    kind: str  # "gaussian" or "laplace"
    j: int  # U is uniform on {0, …, 2^j − 1}
    big_l: int  # L: P[V ≥ v] = e^(−v/L)
    variance: Fraction  # σ² (gaussian)
    scale: Fraction  # b (laplace)

    @property
    def t(self) -> int:
        return self.big_l << self.j

    @functools.cached_property
    def floats(self) -> tuple[float, float, float]:
        """The floats of γ: (σ²/t, −1/(2σ²), −1/t), or (0, −(1/b − 1/t), −1/t) for the Laplace."""
        t = self.t
        if self.kind == "gaussian":
            return float(self.variance / t), -1.0 / (2.0 * float(self.variance)), -1.0 / t
        return 0.0, -float(1 / self.scale - Fraction(1, t)), -1.0 / t

    def gamma_exact(self, u: int, x: int) -> Fraction:
        """γ with acceptance probability exp(−γ) for the proposal (U, X), exactly."""
        t = self.t
        if self.kind == "gaussian":
            d = x - self.variance / t
            return Fraction(u, t) + d * d / (2 * self.variance)
        return Fraction(u, t) + x * (1 / self.scale - Fraction(1, t))


def _split(target: int) -> tuple[int, int]:
    """(j, L) with L·2^j close to ``target`` and 32 ≤ L < 64 once target ≥ 64."""
    j = max(0, target.bit_length() - 6)
    return j, max(1, (target + ((1 << j) >> 1)) >> j)


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


def _gaussian_law(variance: Fraction) -> _Law:
    if not Fraction(MIN_SCALE) ** 2 <= variance <= Fraction(MAX_SCALE) ** 2:
        raise CalibrationError(
            "variance",
            _shown(variance),
            f"must lie between {MIN_SCALE:g}² and (2^50)² grid units²",
        )
    # t within a few per cent of σ, where Canonne et al.'s acceptance is near its best (76 %).
    j, big_l = _split(math.isqrt(math.floor(variance)))
    return _Law("gaussian", j, big_l, variance, Fraction(0))


def _laplace_law(scale: Fraction) -> _Law:
    _check_scale(scale, "scale")
    # t ≥ b (the proposal must be wider), within 1/32 of it.
    j = max(0, math.ceil(scale).bit_length() - 6)
    big_l = max(1, math.ceil(scale / (1 << j)))
    return _Law("laplace", j, big_l, Fraction(0), scale)


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


def _proposals(  # noqa: PLR0917 - one call site, every argument needed
    law: _Law,
    words: NDArray[np.uint64],
    m: int,
    key: bytes,
    block: int,
    first_index: int,
) -> NDArray[np.int64]:
    """The accepted values among m proposals made from 2m keystream words, in order."""
    a = words[:m]
    b = words[m : 2 * m]
    big_l = float(law.big_l)
    # V = ⌊−L ln u⌋ from the top 32 bits of b: u lies in the cell [w, w + 1)/2^32,
    # over which −L ln u moves by at most L/(2w) either side of its value at the
    # midpoint; V is decided unless that interval holds an integer.
    v32 = (b >> np.uint64(32)).astype(np.float64)
    z = v32 + 0.5
    z *= 1.0 / _TWO32
    np.log(z, out=z)
    z *= -big_l
    vf = np.floor(z)
    z -= vf
    z -= 0.5
    np.abs(z, out=z)  # |frac − 1/2|: the cell is undecided when 1/2 − this ≤ L/(2w)
    np.subtract(0.5, z, out=z)
    z *= v32
    v_unsure = z <= _HALF_WIDTH_SLACK * big_l
    # U on the top j bits of a; X = U + 2^j·V.
    u = (a >> np.uint64(64 - law.j)).view(np.int64) if law.j else np.zeros(m, dtype=np.int64)
    x = vf.astype(np.int64)
    x <<= np.int64(law.j)
    x |= u
    xf = x.astype(np.float64)
    # ln(P̂) = 32 ln 2 − γ, so exp gives P̂ = p̂·2^32 directly.
    centre, quadratic, linear = law.floats
    if law.kind == "gaussian":
        log_p = xf - centre
        log_p *= log_p
        log_p *= quadratic
    else:
        log_p = xf * quadratic
    uf = u.astype(np.float64)
    uf *= linear
    log_p += uf
    log_p += _LN_TWO32
    np.exp(log_p, out=log_p)
    # d = P̂ − w': accept for every r when d ≥ 1 + guard, reject when d ≤ −guard.
    log_p -= (b & np.uint64(0xFFFFFFFF)).astype(np.float64)
    accepted = log_p >= 1.0 + _GUARD32
    log_p -= 0.5
    np.abs(log_p, out=log_p)
    unsure = log_p < 0.5 + _GUARD32
    unsure |= v_unsure
    accepted &= ~unsure
    for i in np.flatnonzero(unsure) if unsure.any() else ():
        index = first_index + int(i)
        u_i = int(u[i])
        word = int(b[i])
        if v_unsure[i]:
            v_i = _exact_geometric(law.big_l, word >> 32, _side_fraction(key, block, index, 0))
        else:
            v_i = int(vf[i])
        x_i = u_i + (v_i << law.j)
        x[i] = x_i
        accepted[i] = _exact_accept(
            law.gamma_exact(u_i, x_i), word & 0xFFFFFFFF, _side_fraction(key, block, index, 1)
        )
    # The sign is a's lowest bit; +0 and −0 are the same value, so −0 is rejected.
    sign = (a << np.uint64(63)).view(np.int64)
    sign >>= np.int64(63)  # 0 or −1
    accepted &= (x != 0) | (sign == 0)
    x ^= sign
    x -= sign
    return np.compress(accepted, x)


def _block_stream(key: bytes, block: int) -> AESCounter:
    counter = (int.from_bytes(key[16:32], "little") + block * _BLOCK_COUNTER_STRIDE) % (1 << 128)
    return AESCounter(key=int.from_bytes(key[:16], "little"), counter=counter)


def _fill_block(law: _Law, key: bytes, block: int, out: NDArray[np.int64]) -> None:
    """Fill ``out`` (at most BLOCK values) with block ``block``'s draws."""
    size = out.size
    stream = _block_stream(key, block)
    filled = 0
    index = 0
    for _ in range(_MAX_BATCHES):
        if filled >= size:
            return
        need = size - filled
        m = min(_BATCH, need + need // 2 + 16)
        taken = _proposals(law, stream.random_raw(2 * m), m, key, block, index)[:need]
        index += m
        out[filled : filled + taken.size] = taken
        filled += taken.size
    raise ArithmeticError("the discrete sampler did not fill its block")  # pragma: no cover


def _draw(law: _Law, key: bytes, n: int) -> NDArray[np.int64]:
    raw_key = require_bytes(key, _KEY_BYTES, "stream key")
    if isinstance(n, bool):
        raise TypeError(f"n must be an integer; got {n!r}")
    count = operator.index(n)
    if count < 0:
        raise ValueError(f"n must be >= 0; got {count}")
    out = np.empty(count, dtype=np.int64)
    for block, start in enumerate(range(0, count, BLOCK)):
        _fill_block(law, raw_key, block, out[start : start + BLOCK])
    return out


def discrete_gaussian_variance(
    key: bytes, variance: Fraction | float | int, n: int
) -> NDArray[np.int64]:
    """n draws from N_Z(0, σ²) with σ² = ``variance`` (exact; grid units squared)."""
    return _draw(_gaussian_law(as_fraction(variance, "variance")), key, n)


def discrete_gaussian(key: bytes, scale: float, n: int) -> NDArray[np.int64]:
    """n draws from the discrete Gaussian N_Z(0, scale²) on the keystream of ``key``.

    ``scale`` is σ in grid units, taken at its exact binary value; the same
    key, scale and n give the same int64 array on every installation.
    """
    sigma = as_fraction(scale, "scale")
    _check_scale(sigma, "scale")
    return _draw(_gaussian_law(sigma * sigma), key, n)


def discrete_laplace(key: bytes, scale: float, n: int) -> NDArray[np.int64]:
    """n draws from the discrete Laplace Lap_Z(scale): P[y] ∝ exp(−|y|/scale)."""
    return _draw(_laplace_law(as_fraction(scale, "scale")), key, n)


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
