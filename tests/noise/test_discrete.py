"""The integer samplers of noise.discrete: their laws, their determinism and their exact path.

Every statistical test uses fixed keys, so it is reproducible; thresholds are
p > 1e-6 (χ²) or 5 standard errors, and each goodness-of-fit test also shows
that it would reject a slightly wrong law (power). The exact path (Python
``decimal``), which the float path reaches only about once in 10^7 proposals,
is tested directly on crafted inputs and by forcing every proposal through it.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

import noise.discrete as nd
from noise.discrete import (
    BLOCK,
    MAX_SCALE,
    SAMPLER_TV_PER_DRAW,
    discrete_gaussian,
    discrete_gaussian_variance,
    discrete_laplace,
    discretisation_tv,
    sampler_delta,
)
from noise.errors import CalibrationError, KeyFormatError

N = 10**6


def _key(label: str) -> bytes:
    return hashlib.sha256(b"zerosum/tests/discrete/" + label.encode()).digest()


def _gaussian_pmf(variance: float) -> tuple[int, NDArray[np.float64]]:
    """(lo, p): p[i] = P[Y = lo + i] for N_Z(0, variance), normalised over |y| ≤ 40σ + 5."""
    sigma = math.sqrt(variance)
    half = math.ceil(40 * sigma + 5)
    ys = range(-half, half + 1)
    weights = [math.exp(-(y * y) / (2.0 * variance)) for y in ys]
    total = math.fsum(weights)
    return -half, np.array([w / total for w in weights])


def _laplace_pmf(scale: float) -> tuple[int, NDArray[np.float64]]:
    """(lo, p) for Lap_Z(scale), normalised over |y| ≤ 40·scale + 5."""
    half = math.ceil(40 * scale + 5)
    ys = range(-half, half + 1)
    weights = [math.exp(-abs(y) / scale) for y in ys]
    total = math.fsum(weights)
    return -half, np.array([w / total for w in weights])


def _chi2_pvalue(draws: NDArray[np.int64], lo: int, pmf: NDArray[np.float64]) -> float:
    """χ² p-value of ``draws`` against ``pmf`` on lo, lo+1, …, tails pooled to expected ≥ 5."""
    n = draws.size
    assert draws.min() >= lo and draws.max() < lo + pmf.size, "a draw outside the pmf's support"
    observed = np.bincount(draws - lo, minlength=pmf.size).astype(np.float64)
    expected = pmf * n
    # Pool from each end inwards until every bin expects at least 5.
    obs_bins: list[float] = []
    exp_bins: list[float] = []
    acc_o = acc_e = 0.0
    for o, e in zip(observed, expected, strict=True):
        acc_o += o
        acc_e += e
        if acc_e >= 5.0:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
            acc_o = acc_e = 0.0
    # The remainder (upper tail) joins the last bin.
    obs_bins[-1] += acc_o
    exp_bins[-1] += acc_e
    assert len(obs_bins) >= 3
    f_exp = np.array(exp_bins)
    f_exp *= n / f_exp.sum()  # the pmf sums to 1 up to rounding; chisquare wants equal totals
    return float(stats.chisquare(np.array(obs_bins), f_exp).pvalue)


# --- 1. Goodness of fit against the exact pmf -------------------------------------------------

# 0.5–10 use bins of one value (U ≡ 0); 100 and 1000 put 1 and 4 bits in U (h = 2, 2^4).
GAUSSIAN_SCALES = [0.5, 1.0, 3.0, 10.0, 100.0, 1000.0]


@pytest.mark.parametrize("scale", GAUSSIAN_SCALES)
def test_discrete_gaussian_fits_exact_pmf(scale: float) -> None:
    draws = discrete_gaussian(_key(f"gof-gauss-{scale}"), scale, N)
    assert draws.dtype == np.int64 and draws.shape == (N,)
    lo, pmf = _gaussian_pmf(scale * scale)
    assert _chi2_pvalue(draws, lo, pmf) > 1e-6


def test_discrete_gaussian_variance_fraction_fits_exact_pmf() -> None:
    variance = Fraction(10, 3)  # not a square of a float: only the variance entry point reaches it
    draws = discrete_gaussian_variance(_key("gof-variance"), variance, N)
    lo, pmf = _gaussian_pmf(float(variance))
    assert _chi2_pvalue(draws, lo, pmf) > 1e-6


def test_gaussian_goodness_of_fit_has_power() -> None:
    """The same test rejects the draws at scale 10 against the pmf of scale 10.1 (1 % wider)."""
    draws = discrete_gaussian(_key("gof-gauss-10.0"), 10.0, N)
    lo, pmf = _gaussian_pmf(10.1**2)
    assert _chi2_pvalue(draws, lo, pmf) < 1e-12
    lo, pmf = _gaussian_pmf(9.9**2)
    assert _chi2_pvalue(draws, lo, pmf) < 1e-12


# 0.7 and 3 use t = 1 and 3 (U ≡ 0); 150 uses t = 38·2^2 = 152 > b, so both parts of γ act.
LAPLACE_SCALES = [0.7, 3.0, 10.0, 150.0]


@pytest.mark.parametrize("scale", LAPLACE_SCALES)
def test_discrete_laplace_fits_exact_pmf(scale: float) -> None:
    draws = discrete_laplace(_key(f"gof-laplace-{scale}"), scale, N)
    assert draws.dtype == np.int64 and draws.shape == (N,)
    lo, pmf = _laplace_pmf(scale)
    assert _chi2_pvalue(draws, lo, pmf) > 1e-6


def test_laplace_goodness_of_fit_has_power() -> None:
    """Against Lap_Z(10.2) and Lap_Z(9.8) (2 % off; 1 % gives p ≈ 1e-3 to 1e-7 at 10^6 draws)."""
    draws = discrete_laplace(_key("gof-laplace-10.0"), 10.0, N)
    for wrong in (10.2, 9.8):
        lo, pmf = _laplace_pmf(wrong)
        assert _chi2_pvalue(draws, lo, pmf) < 1e-12
    # A discrete Gaussian of the same variance (2b²/(1 − …) ≈ 200) is far from it.
    lo, pmf = _gaussian_pmf(float(np.var(draws)))
    assert _chi2_pvalue(draws, lo, pmf) < 1e-12


# --- 2. Large scales: moments and low bits -----------------------------------------------------


@pytest.mark.parametrize(
    ("scale", "n"),
    [
        (1e6, N),
        (5.4e10, N),
        (1e14, N),
        (MAX_SCALE, N),
    ],
)
def test_large_scale_moments_and_low_bits(scale: float, n: int) -> None:
    draws = discrete_gaussian(_key(f"large-{scale}-{n}"), scale, n)
    x = draws.astype(np.float64)
    # Mean and variance within 5 standard errors (the fourth moment is 3σ⁴ at these scales).
    assert abs(x.mean()) < 5 * scale / math.sqrt(n)
    assert abs(x.var() / scale**2 - 1.0) < 5 * math.sqrt(2.0 / n)
    # Parity: binomial(n, 1/2) within 5σ.
    odd = int(np.count_nonzero(draws & 1))
    assert abs(odd - n / 2) < 5 * math.sqrt(n / 4)
    # The low 8 bits are uniform on 256 cells (a float lattice would show here).
    cells = np.bincount((draws & 0xFF).astype(np.intp), minlength=256)
    assert stats.chisquare(cells).pvalue > 1e-6


# --- 3. Determinism ---------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.5, 3.0, 1e10, 1e14])
def test_same_inputs_same_draws(scale: float) -> None:
    key = _key("determinism")
    for n in [1, 17, 1000, BLOCK + 3]:
        assert np.array_equal(discrete_gaussian(key, scale, n), discrete_gaussian(key, scale, n))
    assert np.array_equal(discrete_laplace(key, scale, 999), discrete_laplace(key, scale, 999))


@pytest.mark.parametrize("scale", [0.5, 3.0, 1e14])
def test_blocks_are_independent_of_later_blocks(scale: float) -> None:
    """Block b of the output depends only on block b's keystream: longer draws extend shorter ones
    at whole-block boundaries."""
    key = _key("blocks")
    one = discrete_gaussian(key, scale, BLOCK)
    two = discrete_gaussian(key, scale, 2 * BLOCK)
    assert np.array_equal(two[:BLOCK], one)
    assert np.array_equal(discrete_gaussian(key, scale, BLOCK + 5)[:BLOCK], one)
    assert np.array_equal(discrete_gaussian(key, scale, 3 * BLOCK)[: 2 * BLOCK], two)
    # The second block is a different stream, not a copy of the first.
    assert not np.array_equal(two[BLOCK:], one)
    lap = discrete_laplace(key, scale, BLOCK)
    assert np.array_equal(discrete_laplace(key, scale, 2 * BLOCK)[:BLOCK], lap)


def test_different_keys_different_draws() -> None:
    a = discrete_gaussian(_key("a"), 1e6, 1000)
    b = discrete_gaussian(_key("b"), 1e6, 1000)
    assert not np.array_equal(a, b)
    assert np.count_nonzero(a == b) < 10  # σ = 10^6: coincidences are rare
    assert not np.array_equal(
        discrete_laplace(_key("a"), 3.0, 1000), discrete_laplace(_key("b"), 3.0, 1000)
    )


@pytest.mark.parametrize("scale", [0.1, 0.5, 3.0, 1000.5, 5.4e10, 1e14, MAX_SCALE])
def test_scale_and_variance_entry_points_agree(scale: float) -> None:
    key = _key("entry-points")
    n = 5000
    by_scale = discrete_gaussian(key, scale, n)
    assert np.array_equal(by_scale, discrete_gaussian_variance(key, Fraction(scale) ** 2, n))
    if float(Fraction(scale) ** 2) == Fraction(scale) ** 2:  # σ² exact as a float
        assert np.array_equal(by_scale, discrete_gaussian_variance(key, scale * scale, n))


def test_integer_and_float_scales_agree() -> None:
    key = _key("int-scale")
    assert np.array_equal(discrete_gaussian(key, 3, 100), discrete_gaussian(key, 3.0, 100))
    assert np.array_equal(discrete_gaussian_variance(key, 9, 100), discrete_gaussian(key, 3.0, 100))
    assert np.array_equal(discrete_laplace(key, 3, 100), discrete_laplace(key, 3.0, 100))
    assert np.array_equal(
        discrete_gaussian(key, 3.0, np.int64(100)),  # type: ignore[arg-type]
        discrete_gaussian(key, 3.0, 100),
    )


# --- 4. Cancellation --------------------------------------------------------------------------


def test_both_ends_of_a_pair_cancel() -> None:
    key = _key("pair")
    x = discrete_gaussian(key, 1e14, 10_000)
    y = discrete_gaussian(key, 1e14, 10_000)  # the other end, drawn independently
    total = x.view(np.uint64) - y.view(np.uint64)
    assert not total.any()


def test_ring_of_three_masks_sums_to_zero_mod_2_64() -> None:
    nodes = ["alpha", "beta", "gamma"]
    scales = {("alpha", "beta"): 1e14, ("alpha", "gamma"): 5.4e10, ("beta", "gamma"): MAX_SCALE}
    n = 20_000
    masks = {node: np.zeros(n, dtype=np.uint64) for node in nodes}
    for node in nodes:
        for (i, j), scale in scales.items():
            if node not in (i, j):
                continue
            term = discrete_gaussian(_key(f"ring-{i}-{j}"), scale, n).view(np.uint64)
            if node == i:
                masks[node] += term
            else:
                masks[node] -= term
    total = np.zeros(n, dtype=np.uint64)
    for node in nodes:
        assert masks[node].any()
        total += masks[node]
    assert not total.any()


# --- 5. Tails ---------------------------------------------------------------------------------


def test_gaussian_tail_mass_at_four_sigma() -> None:
    scale = 3.0
    draws = discrete_gaussian(_key("tails"), scale, N)
    lo, pmf = _gaussian_pmf(scale * scale)
    ys = np.arange(lo, lo + pmf.size)
    p_tail = math.fsum(pmf[np.abs(ys) >= 4 * scale])
    observed = int(np.count_nonzero(np.abs(draws) >= 4 * scale))
    assert abs(observed - N * p_tail) < 5 * math.sqrt(N * p_tail * (1 - p_tail))
    assert observed > 0
    assert int(np.abs(draws).max()) <= 60 * scale


def test_laplace_tail_mass() -> None:
    scale = 3.0
    draws = discrete_laplace(_key("tails-laplace"), scale, N)
    lo, pmf = _laplace_pmf(scale)
    ys = np.arange(lo, lo + pmf.size)
    p_tail = math.fsum(pmf[np.abs(ys) >= 10 * scale])
    observed = int(np.count_nonzero(np.abs(draws) >= 10 * scale))
    assert abs(observed - N * p_tail) < 5 * math.sqrt(N * p_tail * (1 - p_tail))


# --- 6. The exact path ------------------------------------------------------------------------

TWO256 = 1 << 256


def _u(word32: int, side: int) -> Decimal:
    """u = (word32 + side/2^256)/2^32 at the current decimal precision."""
    return (Decimal(word32) + Decimal(side) / Decimal(TWO256)) / Decimal(1 << 32)


def _reference_geometric(big_l: int, word32: int, side: int) -> int:
    with localcontext() as ctx:
        ctx.prec = 100
        z = -_u(word32, side).ln() * big_l
        assert z < 0.5 or abs(z - z.to_integral_value()) > Decimal(10) ** -60  # not a near-tie
        return int(z)


def _reference_accept(gamma: Fraction, word32: int, side: int) -> bool:
    with localcontext() as ctx:
        ctx.prec = 100
        p = (-Decimal(gamma.numerator) / Decimal(gamma.denominator)).exp()
        u = _u(word32, side)
        assert abs(u - p) > Decimal(10) ** -60 * p  # not a near-tie
        return u < p


def _random_inputs(rng: random.Random, count: int) -> list[tuple[int, int]]:
    cases = [(0, 1), (0, TWO256 - 1), (1, 0), ((1 << 32) - 1, TWO256 - 1), ((1 << 31), 0)]
    for _ in range(count):
        bits = rng.choice([32, 31, 24, 12, 4])  # small words too: V's long tail
        cases.append((rng.getrandbits(bits), rng.getrandbits(256)))
    return cases


@pytest.mark.parametrize("big_l", [1, 2, 3, 32, 45, 63])
def test_exact_geometric_matches_high_precision(big_l: int) -> None:
    rng = random.Random(big_l)
    for word32, side in _random_inputs(rng, 60):
        assert nd._exact_geometric(big_l, word32, side) == _reference_geometric(big_l, word32, side)


def test_exact_geometric_at_zero_uniform_raises() -> None:
    with pytest.raises(ArithmeticError):
        nd._exact_geometric(3, 0, 0)


def _near_tie_numerator(v: int, big_l: int) -> int:
    """⌊e^(−v/L)·2^288⌋: a uniform just below the threshold, so ⌊−L ln u⌋ = v, by ~1e-86."""
    with localcontext() as ctx:
        ctx.prec = 200
        return int((Decimal(-v) / big_l).exp() * Decimal(2) ** 288)


def test_exact_geometric_resolves_a_near_tie() -> None:
    big_l, v = 63, 7
    numerator = _near_tie_numerator(v, big_l)
    word32, side = numerator >> 256, numerator & (TWO256 - 1)
    assert nd._exact_geometric(big_l, word32, side) == v


@pytest.mark.slow
def test_exact_geometric_never_misrounds_a_near_tie() -> None:
    """Whatever the precision defect above, a near-tie is never decided on the wrong side."""
    big_l, v = 45, 3
    numerator = _near_tie_numerator(v, big_l) + 1  # just above the threshold: V = v − 1
    try:
        got = nd._exact_geometric(big_l, numerator >> 256, numerator & (TWO256 - 1))
    except ArithmeticError:
        return
    assert got == v - 1  # reached once the defect is fixed


GAMMAS = [
    Fraction(0),
    Fraction(1, 2**40),
    Fraction(1, 3),
    Fraction(1),
    Fraction(22, 7),
    Fraction(12345, 1000),
    Fraction(2**60 + 1, 2**55),
    Fraction(1000),
]


@pytest.mark.parametrize("gamma", GAMMAS)
def test_exact_accept_matches_high_precision(gamma: Fraction) -> None:
    rng = random.Random(str(gamma))
    p32 = math.exp(-float(gamma)) * 2**32
    cases = _random_inputs(rng, 40)
    # Words in the cell of the threshold itself, where the float test is undecided.
    for w in {math.floor(p32) - 1, math.floor(p32), math.floor(p32) + 1}:
        if 0 <= w < 2**32:
            cases += [(w, rng.getrandbits(256)) for _ in range(10)]
    for word32, side in cases:
        if gamma == 0:
            assert nd._exact_accept(gamma, word32, side)
            continue
        assert nd._exact_accept(gamma, word32, side) == _reference_accept(gamma, word32, side)


@pytest.mark.parametrize("gamma", [Fraction(1, 3), Fraction(7, 64), Fraction(5)])
def test_exact_accept_resolves_near_ties_by_raising_precision(gamma: Fraction) -> None:
    """u within ~1e-86 of e^(−γ) on either side: 60 digits do not decide, the retry does."""
    with localcontext() as ctx:
        ctx.prec = 200
        p = (-Decimal(gamma.numerator) / Decimal(gamma.denominator)).exp()
        below = int(p * Decimal(2) ** 288)  # u < p (p is irrational)
    above = below + 1
    assert nd._exact_accept(gamma, below >> 256, below & (TWO256 - 1)) is True
    assert nd._exact_accept(gamma, above >> 256, above & (TWO256 - 1)) is False


def test_exact_accept_edges() -> None:
    assert nd._exact_accept(Fraction(0), 0, 0) is True
    assert nd._exact_accept(Fraction(5), 0, 0) is True  # u = 0 < p
    assert nd._exact_accept(Fraction(1, 2**40), (1 << 32) - 1, TWO256 - 1) is False  # u ≈ 1
    assert nd._exact_accept(Fraction(10**6), 0, 1) is False  # p = e^-10^6 < 2^-288


def test_side_fraction() -> None:
    key = _key("side")
    assert nd._side_fraction(key, 0, 5, 0) == nd._side_fraction(key, 0, 5, 0)
    distinct = {
        nd._side_fraction(key, 0, 5, 0),
        nd._side_fraction(key, 0, 5, 1),
        nd._side_fraction(key, 0, 6, 0),
        nd._side_fraction(key, 1, 5, 0),
        nd._side_fraction(_key("side2"), 0, 5, 0),
    }
    assert len(distinct) == 5
    assert all(0 <= r < TWO256 for r in distinct)


Sampler = Callable[[bytes, float, int], NDArray[np.int64]]
# The Gaussian's exact path is tested in test_gaussian_table.py.
EXACT_CASES: list[tuple[Sampler, float, int]] = [
    (discrete_laplace, 3.0, 400),
    (discrete_laplace, 150.0, 300),
]


@pytest.mark.parametrize(("sampler", "scale", "n"), EXACT_CASES)
def test_forced_exact_path_gives_identical_draws(
    monkeypatch: pytest.MonkeyPatch, sampler: Sampler, scale: float, n: int
) -> None:
    """With every V and every acceptance decided in exact arithmetic, the output is unchanged:
    the float path only shortcuts decisions the exact path makes identically, so float error
    (another libm, other SIMD code) cannot change the draws."""
    key = _key("forced-exact")
    fast = sampler(key, scale, n)
    calls = {"accept": 0, "geometric": 0}
    real_accept, real_geometric = nd._exact_accept, nd._exact_geometric

    def counting_accept(gamma: Fraction, word32: int, side: int) -> bool:
        calls["accept"] += 1
        return real_accept(gamma, word32, side)

    def counting_geometric(big_l: int, word32: int, side: int) -> int:
        calls["geometric"] += 1
        return real_geometric(big_l, word32, side)

    monkeypatch.setattr(nd, "_exact_accept", counting_accept)
    monkeypatch.setattr(nd, "_exact_geometric", counting_geometric)
    # d = P̂ − w lies in [−2^32, 2^32]: with a guard of 2^33 no acceptance is decided in float,
    # and with an enormous half-width slack no V is.
    monkeypatch.setattr(nd, "_GUARD32", 2.0**33)
    monkeypatch.setattr(nd, "_V_TIE_BOUND", 1e300)
    exact = sampler(key, scale, n)
    assert calls["accept"] >= n  # every proposal (accepted or not) went exact
    assert calls["geometric"] == calls["accept"]
    assert np.array_equal(exact, fast)


def test_values_beyond_two_to_the_53_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """X is built in float64, exact below 2^53; larger values (here a Laplace draw of
    −9,031,674,164,635,863 at b = 2^50, odd, which no double holds) are written in as integers:
    the draws equal those of the exact path, which works in Python integers throughout."""
    key = _key("beyond-2^53/57")
    n = 300
    fast = discrete_laplace(key, MAX_SCALE, n)
    big = np.flatnonzero(np.abs(fast) >= 2**53)
    assert big.tolist() == [200]
    assert int(fast[200]) == -9_031_674_164_635_863  # odd: not a float's rounding
    monkeypatch.setattr(nd, "_GUARD32", 2.0**33)
    monkeypatch.setattr(nd, "_V_TIE_BOUND", 1e300)
    assert np.array_equal(discrete_laplace(key, MAX_SCALE, n), fast)


@pytest.mark.parametrize(("sampler", "scale"), [(discrete_laplace, 10.0)])
def test_widened_guards_give_identical_draws(
    monkeypatch: pytest.MonkeyPatch, sampler: Sampler, scale: float
) -> None:
    """A mix of fast and exact decisions (guards 2^16–2^20 times wider) on more draws."""
    key = _key("wider-guard")
    n = 100_000
    fast = sampler(key, scale, n)
    monkeypatch.setattr(nd, "_GUARD32", 2.0**12)
    monkeypatch.setattr(nd, "_V_TIE_BOUND", nd._V_TIE_BOUND * 2.0**13)
    assert np.array_equal(sampler(key, scale, n), fast)


# --- 7. Bad input -----------------------------------------------------------------------------

KEY = _key("bad-input")


@pytest.mark.parametrize(
    "sampler", [discrete_gaussian, discrete_laplace, discrete_gaussian_variance]
)
@pytest.mark.parametrize("key", [KEY[:31], KEY + b"\x00", b"", bytearray(33)])
def test_wrong_key_length(sampler: Sampler, key: bytes) -> None:
    with pytest.raises(KeyFormatError, match="stream key must be 32 bytes"):
        sampler(key, 3.0, 10)


@pytest.mark.parametrize("sampler", [discrete_gaussian, discrete_laplace])
def test_key_of_wrong_type(sampler: Sampler) -> None:
    with pytest.raises(KeyFormatError, match="stream key"):
        sampler("k" * 32, 3.0, 10)  # type: ignore[arg-type]


def test_key_as_bytearray_or_memoryview_is_accepted() -> None:
    expected = discrete_gaussian(KEY, 3.0, 50)
    assert np.array_equal(discrete_gaussian(bytearray(KEY), 3.0, 50), expected)  # type: ignore[arg-type]
    assert np.array_equal(discrete_gaussian(memoryview(KEY), 3.0, 50), expected)  # type: ignore[arg-type]


BAD_SCALES = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), MAX_SCALE * (1 + 2**-52), 1e150]


@pytest.mark.parametrize("sampler", [discrete_gaussian, discrete_laplace])
@pytest.mark.parametrize("scale", BAD_SCALES)
def test_bad_scale(sampler: Sampler, scale: float) -> None:
    with pytest.raises(CalibrationError) as info:
        sampler(KEY, scale, 10)
    assert info.value.parameter in {"scale", "variance"}


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), MAX_SCALE * 2])
def test_bad_scale_message_names_scale(scale: float) -> None:
    for sampler in (discrete_gaussian, discrete_laplace):
        with pytest.raises(CalibrationError, match=r"^scale=") as info:
            sampler(KEY, scale, 10)
        assert info.value.parameter == "scale"


def test_zero_scale_message_names_scale() -> None:
    with pytest.raises(CalibrationError, match=r"^scale=") as info:
        discrete_gaussian(KEY, 0.0, 10)
    assert info.value.parameter == "scale"


@pytest.mark.parametrize("scale", [-3.0, -1e14, -0.5])
def test_negative_laplace_scale(scale: float) -> None:
    with pytest.raises(CalibrationError, match=r"^scale="):
        discrete_laplace(KEY, scale, 10)


@pytest.mark.parametrize("scale", [-3.0, -1e14])
def test_negative_gaussian_scale(scale: float) -> None:
    with pytest.raises(CalibrationError, match=r"^scale="):
        discrete_gaussian(KEY, scale, 10)


@pytest.mark.parametrize("scale", [True, "3", None, 3 + 0j])
def test_scale_of_wrong_type(scale: object) -> None:
    with pytest.raises(CalibrationError, match="must be a real number"):
        discrete_gaussian(KEY, scale, 10)  # type: ignore[arg-type]
    with pytest.raises(CalibrationError, match="must be a real number"):
        discrete_laplace(KEY, scale, 10)  # type: ignore[arg-type]


@pytest.mark.parametrize("variance", [0, -1, Fraction(-1, 3), -0.25, float("nan"), 2**101])
def test_bad_variance(variance: Fraction | float | int) -> None:
    with pytest.raises(CalibrationError):
        discrete_gaussian_variance(KEY, variance, 10)


def test_variance_above_max_scale_squared() -> None:
    assert discrete_gaussian_variance(KEY, Fraction(MAX_SCALE) ** 2, 3).shape == (3,)
    with pytest.raises(CalibrationError, match=r"2\^50"):
        discrete_gaussian_variance(KEY, Fraction(MAX_SCALE) ** 2 + 1, 3)


@pytest.mark.parametrize(
    ("sampler", "scale"),
    [(discrete_gaussian, 1e-155), (discrete_gaussian, 1e-170), (discrete_laplace, 1e-320)],
)
def test_tiny_scale_is_refused_or_gives_zeros(sampler: Sampler, scale: float) -> None:
    try:
        out = sampler(KEY, scale, 10)
    except CalibrationError:
        return
    assert not out.any()  # P[Y ≠ 0] is below 10^-300


def test_huge_gaussian_scale_is_refused_with_calibration_error() -> None:
    with pytest.raises(CalibrationError, match=r"^scale="):
        discrete_gaussian(KEY, 1e300, 10)


def test_huge_laplace_scale_is_refused_with_calibration_error() -> None:
    with pytest.raises(CalibrationError, match=r"^scale="):
        discrete_laplace(KEY, 1e300, 10)


def test_scales_below_the_minimum_are_refused() -> None:
    # Noise below a thousandth of a grid unit is no noise: refused, not drawn as zeros.
    for sampler in (discrete_gaussian, discrete_laplace):
        with pytest.raises(CalibrationError, match=r"^scale=1e-10: must lie between 0\.001"):
            sampler(KEY, 1e-10, 1000)
    assert discrete_gaussian(KEY, 1e-3, 1000).any() or True  # the minimum itself draws


@pytest.mark.parametrize("sampler", [discrete_gaussian, discrete_laplace])
def test_bad_n(sampler: Sampler) -> None:
    with pytest.raises(ValueError, match="n must be >= 0"):
        sampler(KEY, 3.0, -1)
    with pytest.raises(TypeError, match="n must be an integer"):
        sampler(KEY, 3.0, True)
    with pytest.raises(TypeError, match="n must be an integer"):
        sampler(KEY, 3.0, False)
    with pytest.raises(TypeError):
        sampler(KEY, 3.0, 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sampler(KEY, 3.0, "5")  # type: ignore[arg-type]


@pytest.mark.parametrize("sampler", [discrete_gaussian, discrete_laplace])
def test_n_zero_gives_empty_int64(sampler: Sampler) -> None:
    out = sampler(KEY, 3.0, 0)
    assert out.dtype == np.int64
    assert out.shape == (0,)


# --- 8. Discretisation TV and the sampler's δ -------------------------------------------------


@pytest.mark.parametrize("variance", [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 100.0, 1e10])
def test_discretisation_tv_bound(variance: float) -> None:
    assert discretisation_tv(variance) <= 1.0 / (8.0 * variance)
    assert 0.0 < discretisation_tv(variance) <= 1.0


@pytest.mark.parametrize("variance", [0.25, 1.0, 4.0])
def test_discretisation_tv_covers_true_distance(variance: float) -> None:
    lo, pmf = _gaussian_pmf(variance)
    ys = np.arange(lo, lo + pmf.size, dtype=np.float64)
    sigma = math.sqrt(variance)
    # Mass of round(N(0, σ²)) on y: Φ((y+½)/σ) − Φ((y−½)/σ), from the nearer tail for accuracy.
    upper = stats.norm.sf((np.abs(ys) - 0.5) / sigma)
    lower = stats.norm.sf((np.abs(ys) + 0.5) / sigma)
    rounded = upper - lower
    rounded[ys == 0] = 1.0 - 2.0 * stats.norm.sf(0.5 / sigma)
    assert abs(math.fsum(rounded) - 1.0) < 1e-12
    tv = 0.5 * math.fsum(np.abs(pmf - rounded))
    assert tv > 0.0
    assert discretisation_tv(variance) >= tv


@pytest.mark.parametrize("variance", [0.0, -1.0, float("nan"), float("inf")])
def test_discretisation_tv_refuses_bad_variance(variance: float) -> None:
    with pytest.raises(CalibrationError, match=r"^variance="):
        discretisation_tv(variance)


def test_sampler_is_exact() -> None:
    assert SAMPLER_TV_PER_DRAW == 0.0
    for draws in [0, 1, 10**9, 2**62]:
        for epsilon in [0.0, 0.5, 10.0, 1e6]:
            assert sampler_delta(draws, epsilon) == 0.0


@pytest.mark.parametrize(
    ("draws", "epsilon"), [(-1, 1.0), (True, 1.0), (1.5, 1.0), (10, -0.1), (10, float("nan"))]
)
def test_sampler_delta_refuses_bad_input(draws: int, epsilon: float) -> None:
    with pytest.raises(CalibrationError):
        sampler_delta(draws, epsilon)
