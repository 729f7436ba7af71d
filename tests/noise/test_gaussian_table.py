"""noise.gaussian_table: the discrete Gaussian's envelope, alias table, exact path and tail.

The goodness of fit of ``discrete_gaussian`` against the exact pmf is in
test_discrete.py; here the pieces behind it are checked one by one, and the
two rare paths (the exact acceptance test and the tail beyond B) are forced
so that a whole sample goes through them.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

import noise.gaussian_table as gt
from noise.discrete import MAX_SCALE, discrete_gaussian, discrete_gaussian_variance

SCALES = [0.001, 0.3, 0.5, 3.0, 63.9, 64.0, 100.0, 5.4e10, 1e14, MAX_SCALE]


def _key(label: str) -> bytes:
    return hashlib.sha256(b"zerosum/tests/gaussian-table/" + label.encode()).digest()


def _variance(scale: float) -> Fraction:
    return Fraction(scale) ** 2


def _pi_upper(exponent: Fraction) -> Decimal:
    """exp(−exponent), at 60 digits."""
    with localcontext() as ctx:
        ctx.prec = 60
        return (-(Decimal(exponent.numerator) / Decimal(exponent.denominator))).exp()


# --- the table ------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", SCALES)
def test_bins_are_narrow_and_reach_eight_sigma(scale: float) -> None:
    table = gt.gaussian_table(_variance(scale))
    width = 1 << table.j
    assert width == 1 or 32 * width <= scale < 64 * width
    assert table.reach >= 8 * scale
    assert table.reach <= 2**53  # every X from a bin is exact in float64
    assert (1 << table.tail_bits) >= scale
    assert (1 << table.k) >= table.bins + 1


@pytest.mark.parametrize("scale", SCALES)
def test_weights_fill_the_columns_and_cover_the_law(scale: float) -> None:
    """Σ c = 2^k·2^32, and every bin's weight is above S·π at the bin's left end (its maximum)."""
    variance = _variance(scale)
    table = gt.gaussian_table(variance)
    weights = table.weights
    assert sum(weights) == (1 << table.k) << 32
    assert all(w == 0 for w in weights[table.bins + 1 :])
    for v in range(table.bins):
        bound = Decimal(table.scale) * _pi_upper(Fraction((v << table.j) ** 2) / (2 * variance))
        if v == 0 and table.j == 0:  # the value 0 alone, proposed for π(0)/2
            bound /= 2
        assert Decimal(weights[v]) > bound
        if v:  # ⌊S·π⌋ + 1: no larger than it must be (bin 0 holds the left-over room)
            assert Decimal(weights[v]) <= bound + 1
    tail = 2 * table.scale * (1 << table.tail_bits) // (1 << table.j)
    assert Decimal(weights[table.bins]) > Decimal(tail) * _pi_upper(
        Fraction(table.reach**2) / (2 * variance)
    )
    # The left-over room is a sliver: S uses all but about 2^-20 of the table.
    own = table.scale // 2 if table.j == 0 else table.scale
    assert weights[0] - own - 1 < ((1 << table.k) << 32) / 2**19


@pytest.mark.parametrize("scale", [0.5, 3.0, 100.0, 1e14])
def test_alias_table_gives_each_outcome_its_weight_exactly(scale: float) -> None:
    """Summing T_i/2^32 over columns (own outcome) and the rest (alias) gives c_v/2^32 exactly."""
    table = gt.gaussian_table(_variance(scale))
    n = 1 << table.k
    got = [0] * n
    tops = [int(t) for t in table.tops[::2]]
    for i in range(n):
        own = 1 << 32 if tops[i] == (1 << 64) - 1 else tops[i] >> 32  # T_i (2^32 saturates)
        got[i] += own
        got[table.aliases[i]] += (1 << 32) - own
    assert got == list(table.weights)


def test_integer_alias_construction_on_crafted_weights() -> None:
    thresholds, aliases = gt._alias([5, 1, 0, 2], 2)
    got = [0] * 4
    for i, (t, a) in enumerate(zip(thresholds, aliases, strict=True)):
        got[i] += t
        got[a] += 2 - t
    assert got == [5, 1, 0, 2]


@pytest.mark.parametrize("scale", SCALES)
def test_float_weights_equal_the_exact_definition(scale: float) -> None:
    """The weights built in float64 are ⌊S·π(v·h)⌋ + 1 exactly (so every installation agrees)."""
    variance = _variance(scale)
    table = gt.gaussian_table(variance)
    exact = [
        gt._scaled_weight(table.scale, Fraction((v << table.j) ** 2) / (2 * variance))
        for v in range(table.bins)
    ]
    floats = gt._float_weights(table.scale, variance, 1 << table.j, table.bins)
    assert floats == exact


def test_scaled_weight_just_below_a_whole_number() -> None:
    """S·e^(−ε) = 10^12 − 10^-18: float64 rounds it to 10^12 (floor + 1 would be 10^12 + 1);
    the exact weight is 10^12."""
    assert gt._scaled_weight(7, Fraction(0)) == 8
    assert gt._scaled_weight(10**12, Fraction(1, 10**30)) == 10**12


def test_table_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="variance"):
        gt._table(Fraction(0), 8)
    with pytest.raises(ValueError, match="reach"):
        gt._table(Fraction(1), 0)


# --- the exact path -----------------------------------------------------------------------


@pytest.mark.parametrize(("scale", "n"), [(3.0, 600), (0.5, 300), (1e14, 400), (MAX_SCALE, 300)])
def test_forced_exact_path_gives_identical_draws(
    monkeypatch: pytest.MonkeyPatch, scale: float, n: int
) -> None:
    """With every acceptance decided in exact arithmetic the draws are unchanged: the float path
    only shortcuts decisions the exact path makes identically."""
    key = _key("forced-exact")
    fast = discrete_gaussian(key, scale, n)
    calls = {"accept": 0}
    real = gt.GaussianTable.exact_accept

    def counting(self: gt.GaussianTable, v: int, x: int, word31: int, side: int) -> bool:
        calls["accept"] += 1
        return real(self, v, x, word31, side)

    monkeypatch.setattr(gt.GaussianTable, "exact_accept", counting)
    # d lies in [−1, 1]: with a guard of 2^33 (in units of 2^-32) nothing is decided in float.
    monkeypatch.setattr(gt, "GUARD32", 2.0**33)
    exact = discrete_gaussian(key, scale, n)
    assert calls["accept"] >= n  # every proposal, accepted or not, went exact
    assert np.array_equal(exact, fast)


@pytest.mark.parametrize("scale", [3.0, 1e10])
def test_widened_guard_gives_identical_draws(monkeypatch: pytest.MonkeyPatch, scale: float) -> None:
    """A mix of fast and exact decisions (a band 2^12 times wider) on more draws."""
    key = _key("wider-guard")
    n = 100_000
    fast = discrete_gaussian(key, scale, n)
    monkeypatch.setattr(gt, "GUARD32", 2.0**12)
    assert np.array_equal(discrete_gaussian(key, scale, n), fast)


def test_exact_accept_against_a_direct_computation() -> None:
    """u < S·π(x)/c_v decided exactly, compared with a 100-digit computation on random inputs."""
    table = gt.gaussian_table(_variance(3.0))
    rng = np.random.default_rng(7)
    for _ in range(300):
        v = int(rng.integers(0, table.bins))
        x = v << table.j
        word31 = int(rng.integers(0, 1 << 31))
        side = int.from_bytes(rng.bytes(32), "big")
        with localcontext() as ctx:
            ctx.prec = 100
            u = (Decimal(word31) + Decimal(side) / Decimal(2**256)) / Decimal(2**31)
            a = (
                Decimal(table.scale)
                / Decimal(table.weights[v])
                * (-(Decimal(x * x) / (2 * Decimal(9)))).exp()
            )
            if v == 0:  # the value 0 alone (bins of one value), proposed for π(0)/2
                a /= 2
        assert table.exact_accept(v, x, word31, side) == (u < a)


def test_exact_accept_resolves_a_near_tie() -> None:
    """A uniform within 10^-70 of the acceptance probability is placed on the right side."""
    table = gt.gaussian_table(_variance(3.0))
    v, x = 2, 2
    with localcontext() as ctx:
        ctx.prec = 120
        a = (
            Decimal(table.scale)
            / Decimal(table.weights[v])
            * (-(Decimal(x * x) / Decimal(18))).exp()
        )
        target = int(a * Decimal(2) ** 287)
    assert table.exact_accept(v, x, target >> 256, target & ((1 << 256) - 1))  # u just below a
    above = target + 1
    assert not table.exact_accept(v, x, above >> 256, above & ((1 << 256) - 1))


# --- the tail -----------------------------------------------------------------------------


def _pmf(variance: float, half: int) -> NDArray[np.float64]:
    ys = np.arange(-half, half + 1, dtype=np.float64)
    w = np.exp(-(ys * ys) / (2.0 * variance))
    return w / w.sum()


@pytest.mark.parametrize(("scale", "reach", "n"), [(3.0, 1, 20_000), (100.0, 2, 60_000)])
def test_the_tail_beyond_b_follows_the_law(
    monkeypatch: pytest.MonkeyPatch, scale: float, reach: int, n: int
) -> None:
    """With B moved in to 1σ or 2σ, a third or a twentieth of all proposals go to the tail;
    the draws still fit N_Z(0, σ²), and the mass beyond B is right within 5 standard errors."""
    monkeypatch.setattr(gt, "REACH", reach)
    table = gt.gaussian_table(_variance(scale))
    assert table.reach < 3 * scale
    draws = discrete_gaussian(_key(f"tail-{scale}"), scale, n)
    half = math.ceil(12 * scale)
    pmf = _pmf(scale * scale, half)
    ys = np.arange(-half, half + 1)
    p_tail = float(pmf[np.abs(ys) >= table.reach].sum())
    observed = int(np.count_nonzero(np.abs(draws) >= table.reach))
    assert abs(observed - n * p_tail) < 5 * math.sqrt(n * p_tail * (1 - p_tail))
    # χ² on bins of width σ/2 (expected ≥ 5 pooled into the ends).
    edges = np.arange(-half, half + 2, max(1, int(scale // 2)))
    observed_bins, _ = np.histogram(draws, bins=edges)
    expected = np.array([pmf[(ys >= lo) & (ys < hi)].sum() for lo, hi in itertools.pairwise(edges)])
    keep = expected * n >= 5
    f_obs = np.append(observed_bins[keep], observed_bins[~keep].sum())
    f_exp = np.append(expected[keep], expected[~keep].sum()) * n
    f_exp *= f_obs.sum() / f_exp.sum()
    assert stats.chisquare(f_obs, f_exp).pvalue > 1e-6


def test_tail_values_beyond_two_to_the_53_are_written_as_integers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tail value no double holds (2^53 + 1) reaches the output exactly, with its sign."""
    monkeypatch.setattr(gt, "REACH", 1)
    big = (1 << 53) + 1

    def huge_tail(self: gt.GaussianTable, bits: object) -> tuple[bool, int]:
        return True, big

    monkeypatch.setattr(gt.GaussianTable, "tail", huge_tail)
    draws = discrete_gaussian_variance(_key("huge-tail"), Fraction(2**40), 2000)
    beyond = draws[np.abs(draws) >= 2**53]
    assert beyond.size > 300  # about a third of proposals went to the tail
    assert set(np.abs(beyond).tolist()) == {big}
    assert 0 < int(np.count_nonzero(beyond < 0)) < beyond.size


def test_tail_bits_are_deterministic_and_keyed() -> None:
    first = gt.tail_bits(b"k" * 32, 0, 5)
    again = gt.tail_bits(b"k" * 32, 0, 5)
    other = gt.tail_bits(b"k" * 32, 0, 6)
    a = [first(n) for n in (1, 7, 300, 2)]
    assert a == [again(n) for n in (1, 7, 300, 2)]
    assert a != [other(n) for n in (1, 7, 300, 2)]
    assert all(0 <= value < (1 << n) for value, n in zip(a, (1, 7, 300, 2), strict=True))


# --- efficiency ---------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [3.0, 1e10])
def test_nearly_every_proposal_is_accepted(monkeypatch: pytest.MonkeyPatch, scale: float) -> None:
    """The envelope is tight: at least 97 % of proposals are accepted (Canonne et al.'s
    Laplace proposal accepts about 76 %)."""
    counts = {"proposed": 0, "accepted": 0}
    real = gt.propose

    def counting(*args: object) -> tuple[NDArray[np.float64], list[tuple[int, int]]]:
        taken, patches = real(*args)  # type: ignore[arg-type]
        counts["proposed"] += args[1].size  # type: ignore[attr-defined]
        counts["accepted"] += taken.size
        return taken, patches

    import noise.discrete as nd

    monkeypatch.setattr(nd, "gaussian_proposals", counting)
    discrete_gaussian(_key("efficiency"), scale, 200_000)
    assert counts["accepted"] >= 0.97 * counts["proposed"]
