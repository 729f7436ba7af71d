"""The old float noise had a visible lattice defect at 1e14; the integer sampler has none.

The old pair term was t = rint(2^F · fl(c·z)) = rint(fl(s·z)) (round half to
even, s = c·2^F ≈ 1e14 grid units) with z from numpy's ziggurat,
``Generator(AESCounter).standard_normal()``. Measured here and while writing
these tests (numpy 2.4, 10^6 draws unless stated):

* **The ziggurat's own lattice.** numpy builds z = rabs·w_i from a 52-bit
  integer rabs and a per-layer width w_i (layer i = the word's low 8 bits).
  Recovered from the keystream (|z|/rabs is the same double for every draw of
  a layer), w_i·2^52 = x_i ranges over [0.215, 3.911], so z lies on per-layer
  lattices of spacing 4.8e-17 … 8.7e-16. At s = 1e14 that is s·w_i ∈
  [0.0048, 0.087] grid units: *finer* than the grid, so it only modulates cell
  masses. Exact lattice counting over 20,000 cells at z ≈ 1 (layers with
  x_i > 1.05) gives a relative cell-mass fluctuation of 4.3e-3 rms from this
  lattice alone (same order as the audit's 1.4e-3); it is quasi-random in the
  cell index, so residues mod m do not see it (checked below for m = 2, 3, 10,
  1000), and exhibiting it needs a likelihood-ratio test built from numpy's
  tables over about 49/ε² ≈ 3e6 draws with ~150 layer counts per draw, which
  is not done here. The lattice becomes coarser than the grid only for
  s > 1/min w_i ≈ 2.1e16 (for the base strip alone, s > 1.15e15), i.e. above
  MAX_SCALE = 2^50 ≈ 1.13e15.
* **The float lattice plus round-half-to-even, which is visible at 1e14.**
  fl(s·z) is a multiple of ulp(s·z); for |s·z| ∈ [2^46, 2^47) (32 % of draws
  at s = 1e14) that is 1/64, so each cell [k − ½, k + ½] holds 63 interior
  float points and two ties, and rint sends both ties to the even neighbour:
  even cells get 65 points, odd cells 63, a 3.1 % mass difference between
  neighbours (the exact lattice count above gives 1.9e-2 rms and an even/odd
  ratio of 1.032 with rint, against 1.6e-5 with round-half-up). Overall
  P[odd] = ½ − E[ulp(s·z)]/2 = 0.4936 at s = 1e14 (measured 0.4939; χ² on
  parity p ≈ 1e-34 with 10^6 draws), 0.428 at s = 2^50, and only
  ½ − 3.5e-6 at s = 5.4e10 (invisible without ~10^12 draws).

``discrete_gaussian`` at the same scales has uniform parity and low bits.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from numpy.typing import NDArray
from randomgen import AESCounter
from scipy import stats

from noise.discrete import MAX_SCALE, discrete_gaussian

N = 10**6
KEY = hashlib.sha256(b"zerosum/tests/ziggurat-defect").digest()
_AES_KEY = int.from_bytes(KEY[:16], "little")
_COUNTER = int.from_bytes(KEY[16:], "little")


def _ziggurat(n: int) -> NDArray[np.float64]:
    """n draws of numpy's ziggurat N(0, 1) on the AES-128-CTR stream of KEY (the old source)."""
    generator = np.random.Generator(AESCounter(key=_AES_KEY, counter=_COUNTER))
    return generator.standard_normal(n)


def _old(scale: float, z: NDArray[np.float64]) -> NDArray[np.int64]:
    """The old pair term: rint(fl(scale·z)), half to even, as int64."""
    return np.rint(scale * z).astype(np.int64)


def _parity_pvalue(values: NDArray[np.int64]) -> float:
    odd = int(np.count_nonzero(values & 1))
    return float(stats.chisquare([odd, values.size - odd]).pvalue)


def _residue_pvalue(values: NDArray[np.int64], m: int) -> float:
    return float(stats.chisquare(np.bincount(values % m, minlength=m)).pvalue)


def test_ziggurat_draws_lie_on_per_layer_lattices() -> None:
    """|z| = rabs·w_i exactly, with one width w_i per layer: first draws of 2,000 streams."""
    mask52 = (1 << 52) - 1
    ratios: dict[int, list[float]] = {}
    for i in range(2000):
        counter = (_COUNTER + (i << 64)) % (1 << 128)
        z = float(np.random.Generator(AESCounter(key=_AES_KEY, counter=counter)).standard_normal())
        word = int(AESCounter(key=_AES_KEY, counter=counter).random_raw(1)[0])
        rabs = (word >> 9) & mask52
        if rabs:
            ratios.setdefault(word & 0xFF, []).append(abs(z) / rabs)
    consistent = total = 0
    widths = []
    for values in ratios.values():
        if len(values) < 3:
            continue
        width = float(np.median(values))
        widths.append(width)
        rel = np.abs(np.array(values) / width - 1.0)
        consistent += int(np.count_nonzero(rel <= 2.0**-51))
        total += len(values)
    # ~99 % of draws take the ziggurat's fast path (one word, z = ±rabs·w_i).
    assert len(widths) > 200
    assert consistent > 0.97 * total
    x = np.array(widths) * 2.0**52
    assert 0.2 < x.min() < 0.3 and 3.6 < x.max() < 4.0
    # At s = 1e14 the lattice is finer than the grid (spacing < 0.1 grid units) …
    assert 1e14 * max(widths) < 0.1
    # … and it is coarser than the grid only above MAX_SCALE.
    assert 1.0 / max(widths) > MAX_SCALE


def test_old_values_sit_on_the_float_lattice_and_ties_go_to_even() -> None:
    scale = 1e14
    v = scale * _ziggurat(N)
    binade = (np.abs(v) >= 2.0**46) & (np.abs(v) < 2.0**47)
    assert 0.30 < binade.mean() < 0.34
    # Every pre-rounding value in the binade is a multiple of 1/64 …
    w = v[binade] * 64.0
    assert np.array_equal(w, np.floor(w))
    # … so exact half-integers (ties) occur, about 1/64 of them, and rint sends all to even.
    ties = v[binade][(w % 64.0) == 32.0]
    assert abs(ties.size - binade.sum() / 64) < 5 * math.sqrt(binade.sum() / 64)
    assert not (np.rint(ties).astype(np.int64) & 1).any()


def test_old_parity_defect_at_1e14_and_none_in_discrete_gaussian() -> None:
    scale = 1e14
    z = _ziggurat(N)
    old = _old(scale, z)
    assert _parity_pvalue(old) < 1e-12
    # The size is the one the tie argument predicts: P[odd] = ½ − E[ulp(s·z)]/2.
    predicted = 0.5 - float(np.spacing(np.abs(scale * z)).mean()) / 2
    assert abs(predicted - 0.4936) < 5e-4
    observed = np.count_nonzero(old & 1) / N
    assert abs(observed - predicted) < 5 * math.sqrt(0.25 / N)
    # Residues mod 10 see it through parity.
    assert _residue_pvalue(old, 10) < 1e-12
    new = discrete_gaussian(KEY, scale, N)
    assert _parity_pvalue(new) > 1e-6
    for m in (3, 10, 1000):
        assert _residue_pvalue(new, m) > 1e-6


def test_old_low_bits_at_max_scale_and_none_in_discrete_gaussian() -> None:
    """At the largest scale the samplers accept (2^50) the old parity is 0.428."""
    z = _ziggurat(N)
    old = _old(MAX_SCALE, z)
    assert _parity_pvalue(old) < 1e-12
    assert abs(np.count_nonzero(old & 1) / N - 0.428) < 0.005
    assert _residue_pvalue(old, 256) < 1e-12
    # 10^5 draws: at σ = 2^50 about 1.8 % of proposals take the slow exact path.
    new = discrete_gaussian(KEY, MAX_SCALE, N // 10)
    assert _parity_pvalue(new) > 1e-6
    assert _residue_pvalue(new, 256) > 1e-6


@pytest.mark.parametrize("m", [2, 3, 10, 1000])
def test_ziggurat_lattice_alone_is_invisible_to_residues(m: int) -> None:
    """Without the ties (round half up), the old residues at 1e14 look uniform: the remaining
    ziggurat-lattice fluctuation (~4e-3 per cell) is quasi-random in the cell index. So a
    residue test is evidence against the tie defect only, not against every lattice effect."""
    v = 1e14 * _ziggurat(N)
    half_up = np.floor(v + 0.5).astype(np.int64)
    assert _residue_pvalue(half_up, m) > 1e-6


def test_old_defect_is_invisible_at_the_demo_scale() -> None:
    """At s = 5.4e10 the predicted parity bias is 3.5e-6: far below what 10^6 draws resolve."""
    scale = 5.4e10
    z = _ziggurat(N)
    bias = float(np.spacing(np.abs(scale * z)).mean()) / 2
    assert 2e-6 < bias < 5e-6
    assert _parity_pvalue(_old(scale, z)) > 1e-6
