"""Masks cancel exactly, bit for bit, and have the design's covariance."""

from __future__ import annotations

import hashlib
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noise.designs import cape_design, complete_design, explicit_design, harary_design
from noise.errors import KeyFormatError
from noise.fixed_point import FixedPointCodec, wrapping_sum
from noise.masks import (
    cape_blinding,
    cape_draw,
    cape_mask,
    cape_share_of_sum,
    pair_terms,
    pairwise_mask,
)

CODEC = FixedPointCodec()


def _seeds(node_ids: list[str], label: bytes) -> dict[str, dict[str, bytes]]:
    """Symmetric pairwise seeds made up for tests (the key exchange is tested elsewhere)."""
    seeds: dict[str, dict[str, bytes]] = {n: {} for n in node_ids}
    for a, b in combinations(sorted(node_ids), 2):
        s = hashlib.sha256(label + a.encode() + b"|" + b.encode()).digest()
        seeds[a][b] = s
        seeds[b][a] = s
    return seeds


def _ids(k: int) -> list[str]:
    return [f"n{i:03d}" for i in range(k)]


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(min_value=2, max_value=9),
    shape=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=3),
    kind=st.sampled_from(["complete", "harary", "explicit"]),
    round_index=st.integers(min_value=0, max_value=2**40),
    variance=st.floats(min_value=1e-6, max_value=1e6),
    label=st.binary(min_size=1, max_size=8),
)
def test_pairwise_masks_sum_to_zero_bitwise(  # noqa: PLR0917
    k: int, shape: list[int], kind: str, round_index: int, variance: float, label: bytes
) -> None:
    ids = _ids(k)
    if kind == "complete":
        design = complete_design(ids, variance)
    elif kind == "harary":
        design = complete_design(ids, variance) if k < 3 else harary_design(ids, 2, variance)
    else:
        pairs = {(ids[i], ids[i + 1]): variance * (i + 1) for i in range(k - 1)}
        design = explicit_design(ids, pairs)
    seeds = _seeds(ids, label)
    size = int(np.prod(shape))
    masks = [
        pairwise_mask(
            design, n, seeds[n], round_index=round_index, tensor="t", size=size, codec=CODEC
        )
        for n in ids
    ]
    assert not np.any(wrapping_sum(masks)), "masks must cancel exactly modulo 2^64"
    assert any(np.any(m) for m in masks)


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(min_value=2, max_value=8),
    size=st.integers(min_value=1, max_value=50),
    tau=st.floats(min_value=1e-3, max_value=1e3),
    seed=st.integers(min_value=0, max_value=2**63),
)
def test_cape_masks_sum_to_zero_bitwise(k: int, size: int, tau: float, seed: int) -> None:
    ids = _ids(k)
    seeds = _seeds(ids, b"cape")
    variance = Fraction(tau) ** 2 * CODEC.scale**2
    draws = {
        n: cape_draw(hashlib.sha256(b"%d" % seed + n.encode()).digest(), variance, size)
        for n in ids
    }
    # Secure sum: each blinded share looks uniform; the blinding cancels.
    shares = [
        draws[n] + cape_blinding(ids, n, seeds[n], round_index=3, tensor="t", size=size)
        for n in ids
    ]
    total = wrapping_sum(shares)
    assert np.array_equal(total, wrapping_sum(draws.values()))
    masks = [cape_mask(draws[n], total, ids, n) for n in ids]
    assert not np.any(wrapping_sum(masks))


def test_cape_shares_split_the_sum_exactly() -> None:
    ids = _ids(7)
    values = np.array([0, 1, 6, 7, -1, -8, 2**62, -(2**62), 123456789], dtype=np.int64)
    total = values.view(np.uint64)
    shares = [cape_share_of_sum(total, ids, n).view(np.int64) for n in ids]
    assert np.array_equal(np.sum(shares, axis=0), values)
    assert np.all(np.ptp(np.stack(shares), axis=0) <= 1)


def test_unmask_corrections_recover_the_survivors_sum_exactly() -> None:
    ids = _ids(5)
    design = complete_design(ids, 4.0, collusion_threshold=1)
    seeds = _seeds(ids, b"drop")
    size = 64
    rng = np.random.default_rng(7)
    data = {n: CODEC.encode(rng.normal(size=size), tensor="x") for n in ids}
    dropped = ["n002"]
    survivors = [n for n in ids if n not in dropped]
    egress = {
        n: data[n]
        + pairwise_mask(design, n, seeds[n], round_index=1, tensor="x", size=size, codec=CODEC)
        for n in survivors
    }
    corrections = [
        pair_terms(design, n, seeds[n], dropped, round_index=1, tensor="x", size=size, codec=CODEC)
        for n in survivors
    ]
    recovered = wrapping_sum(egress.values()) - wrapping_sum(corrections)
    assert np.array_equal(recovered, wrapping_sum(data[n] for n in survivors))


def test_masks_are_bound_to_round_and_tensor() -> None:
    ids = _ids(3)
    design = complete_design(ids, 1.0)
    seeds = _seeds(ids, b"bind")
    a = pairwise_mask(
        design, "n000", seeds["n000"], round_index=0, tensor="x", size=32, codec=CODEC
    )
    b = pairwise_mask(
        design, "n000", seeds["n000"], round_index=1, tensor="x", size=32, codec=CODEC
    )
    c = pairwise_mask(
        design, "n000", seeds["n000"], round_index=0, tensor="y", size=32, codec=CODEC
    )
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_missing_or_malformed_seed_is_a_clear_error() -> None:
    ids = _ids(3)
    design = complete_design(ids, 1.0)
    seeds = _seeds(ids, b"bad")
    partial = {"n001": seeds["n000"]["n001"]}
    with pytest.raises(KeyError, match="no pairwise seed for peer 'n002'"):
        pairwise_mask(design, "n000", partial, round_index=0, tensor="x", size=4, codec=CODEC)
    short = dict(seeds["n000"], n002=b"\x00" * 31)
    with pytest.raises(KeyFormatError, match="31 bytes"):
        pairwise_mask(design, "n000", short, round_index=0, tensor="x", size=4, codec=CODEC)
    with pytest.raises(ValueError, match="not among the CAPE participants"):
        cape_blinding(ids, "zz", seeds["n000"], round_index=0, tensor="x", size=4)
    with pytest.raises(ValueError, match="not among the CAPE participants"):
        cape_share_of_sum(np.zeros(2, dtype=np.uint64), ids, "zz")
    with pytest.raises(ValueError, match="must be finite"):
        cape_draw(bytes(32), float("nan"), 3)


@pytest.mark.slow
@pytest.mark.parametrize("construction", ["pairwise", "cape"])
def test_empirical_mask_covariance_matches_design(construction: str) -> None:
    """2,000 independent sessions × 16 entries = 32,000 draws of the K-vector of masks.

    Tolerance: each entry of the sample covariance has standard error
    sqrt((R_ii R_jj + R_ij²)/n); we accept 5 standard errors (a false alarm
    has probability < 1e-5 per entry), with fixed seeds so the run is reproducible.
    """
    ids = _ids(4)
    variances = {"n000": 1.0, "n001": 2.0, "n002": 0.5, "n003": 1.5}
    if construction == "pairwise":
        design = complete_design(ids, variances, collusion_threshold=1)
    else:
        design = cape_design(ids, 2.0)
    r = design.covariance()
    sessions, size = 2000, 16
    samples = np.empty((sessions * size, len(ids)))
    rng = np.random.default_rng(20261129)
    for s in range(sessions):
        seeds = _seeds(ids, s.to_bytes(4, "big"))
        if construction == "pairwise":
            masks = [
                pairwise_mask(
                    design, n, seeds[n], round_index=0, tensor="t", size=size, codec=CODEC
                )
                for n in ids
            ]
        else:
            variance = Fraction(design.cape_variance) * CODEC.scale**2
            draws = [cape_draw(rng.bytes(32), variance, size) for _ in ids]
            total = wrapping_sum(draws)
            masks = [cape_mask(d, total, ids, n) for d, n in zip(draws, ids, strict=True)]
        samples[s * size : (s + 1) * size] = np.stack([CODEC.decode(m) for m in masks], axis=1)
    n = samples.shape[0]
    cov = samples.T @ samples / n  # known zero mean
    diag = np.diag(r)
    se = np.sqrt((np.outer(diag, diag) + r**2) / n)
    assert np.all(np.abs(cov - r) <= 5 * se), (cov, r)
    assert np.allclose(samples.sum(axis=1), 0.0, atol=1e-6)
