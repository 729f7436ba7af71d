"""The vectorised samplers draw what the protocol's masks draw, and cancel exactly."""

from __future__ import annotations

import hashlib
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from noise.designs import cape_design, complete_design, conditional_covariance, explicit_design
from noise.fixed_point import FixedPointCodec, wrapping_sum
from noise.masks import cape_blinding, cape_draw, cape_mask, pairwise_mask
from noise.policy import plan_noise
from simulations.attacks import observer_view
from simulations.egress_noise import draw_zero_sum, is_uniform_complete, zero_sum_fixed
from simulations.schemes import Variant, node_ids, unit_plan

CODEC = FixedPointCodec()
SIZE = 20_000


def _seeds(ids: list[str]) -> dict[str, dict[str, bytes]]:
    seeds: dict[str, dict[str, bytes]] = {n: {} for n in ids}
    for a, b in combinations(ids, 2):
        s = hashlib.sha256(b"sim-test|" + a.encode() + b"|" + b.encode()).digest()
        seeds[a][b] = seeds[b][a] = s
    return seeds


def _covariance(samples: np.ndarray) -> np.ndarray:
    """Covariance across nodes, treating the entries as independent samples; (K, size)."""
    covariance: np.ndarray = samples @ samples.T / samples.shape[1]
    return covariance


def _close(empirical: np.ndarray, expected: np.ndarray, tolerance: float = 0.05) -> bool:
    scale = float(np.max(np.abs(expected)))
    return float(np.max(np.abs(empirical - expected))) <= tolerance * scale


@pytest.mark.parametrize("uniform", [True, False])
def test_pairwise_sampler_matches_the_protocol_masks(uniform: bool) -> None:
    ids = node_ids(4)
    if uniform:
        design = complete_design(ids, 2.0, collusion_threshold=1)
    else:
        design = explicit_design(
            ids,
            {
                (ids[0], ids[1]): 1.0,
                (ids[1], ids[2]): 3.0,
                (ids[2], ids[3]): 0.5,
                (ids[0], ids[3]): 2.0,
            },
        )
    assert is_uniform_complete(design) is uniform
    seeds = _seeds(ids)
    masks = np.stack(
        [
            CODEC.decode(
                pairwise_mask(
                    design, n, seeds[n], round_index=3, tensor="t", size=SIZE, codec=CODEC
                )
            )
            for n in ids
        ]
    )
    simulated = draw_zero_sum(design, SIZE, np.random.default_rng(1)).noise
    expected = design.covariance()
    assert _close(_covariance(masks), expected)
    assert _close(_covariance(simulated), expected)
    assert np.allclose(simulated.sum(axis=0), 0.0, atol=1e-9)


def test_cape_sampler_matches_the_cape_protocol() -> None:
    ids = node_ids(5)
    design = cape_design(ids, 3.0)
    seeds = _seeds(ids)
    rng = np.random.default_rng(2)
    draws = {n: cape_draw(rng.bytes(32), Fraction(3) * CODEC.scale**2, SIZE) for n in ids}
    blinded = [
        draws[n] + cape_blinding(ids, n, seeds[n], round_index=0, tensor="t", size=SIZE)
        for n in ids
    ]
    total = wrapping_sum(blinded)
    masks = np.stack([CODEC.decode(cape_mask(draws[n], total, ids, n)) for n in ids])
    simulated = draw_zero_sum(design, SIZE, np.random.default_rng(3)).noise
    expected = design.covariance()
    assert _close(_covariance(masks), expected)
    assert _close(_covariance(simulated), expected)


@pytest.mark.parametrize("construction", ["pairwise", "cape"])
@pytest.mark.parametrize("k", [2, 3, 7])
def test_fixed_point_masks_cancel_exactly(construction: str, k: int) -> None:
    plan = plan_noise(
        node_ids(k),
        epsilon=1.0,
        delta=1e-6,
        sensitivity=1.0,
        construction=construction,  # type: ignore[arg-type]
    )
    scales = np.linspace(0.5, 400.0, 57)
    masks = zero_sum_fixed(plan.design, scales, np.random.default_rng(k), CODEC)
    assert masks.dtype == np.int64
    assert np.all(masks.sum(axis=0) == 0)
    assert np.any(masks != 0)


def test_fixed_point_masks_cancel_on_a_sparse_graph() -> None:
    ids = node_ids(6)
    design = explicit_design(ids, {(ids[i], ids[(i + 1) % 6]): float(i + 1) for i in range(6)})
    masks = zero_sum_fixed(design, np.full(31, 10.0), np.random.default_rng(5), CODEC)
    assert np.all(masks.sum(axis=0) == 0)
    per_node = masks.astype(np.float64) * CODEC.resolution / 10.0
    assert _close(_covariance(per_node), design.covariance(), tolerance=0.8)


@pytest.mark.parametrize("construction", ["pairwise", "cape"])
def test_coalition_view_has_the_accountings_conditional_covariance(construction: str) -> None:
    k, m = 6, 2
    plan = unit_plan(construction, k, 1, True)
    view = observer_view(
        Variant("zerosum+residual", construction),
        "coalition",
        m,
        n_nodes=k,
        collusion_threshold=1,
        trials=4000,
        size=3,
        rng=np.random.default_rng(7),
    )
    _, expected = conditional_covariance(
        plan.design, plan.design.node_ids[1 : 1 + m], plan.residual_variance
    )
    np.testing.assert_allclose(view.covariance, expected)
    samples = np.moveaxis(view.noise, 1, 0).reshape(view.noise.shape[1], -1)
    assert _close(_covariance(samples), expected)
