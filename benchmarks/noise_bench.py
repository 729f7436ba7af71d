"""Throughput of the integer noise samplers and the fixed-point encoder.

Each figure is a median over ``repeats`` runs. Every run times the candidate
and its baseline on 10^6 values each, twice, in A-B-B-A order within the same
loop iteration, so both see the same machine load; the ratio figures are
medians of per-run ratios:

* ``discrete_gaussians_per_s``: draws per second of ``noise.discrete.discrete_gaussian``
  at σ = 10^14 grid units (the 2,641-feature scale) from a fresh 32-byte key;
* ``numpy_pcg64_gaussians_per_s``: N(0, 1) draws per second from numpy's PCG64
  into a preallocated buffer;
* ``discrete_rate_ratio_vs_pcg64`` (target ≥ 0.5): per-run rate / PCG64 rate;
* ``rounded_ziggurat_per_s``: the construction the discrete sampler replaced,
  round(σ·z) with z from numpy's ziggurat on the AES-CTR stream, and
  ``discrete_rate_ratio_vs_rounded_ziggurat``;
* ``fixed_point_encode_per_s``: float64 values encoded per second;
* ``fixed_point_encode_ratio_vs_numpy_multiply``: per-run encode rate / rate of
  a plain ``np.multiply`` of the same array by the scale;
* ``node_mask_seconds_k10_d1e6``: one node's full pairwise mask for K = 10
  nodes (complete graph, 9 pair streams of discrete Gaussians), d = 10^6
  entries (target ≤ 0.3 s), and ``node_mask_seconds_k10_d1e6_rounded_ziggurat``,
  the same mask built the old way in the same run;
* ``node_mask_ratio_vs_pcg64_draws``: that time over the time numpy's PCG64
  takes just to draw the same 9·10^6 normals (the floor any mask pays).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from noise.designs import complete_design
from noise.discrete import discrete_gaussian
from noise.fixed_point import FixedPointCodec
from noise.masks import pairwise_mask
from noise.seeds import stream_key
from noise.stream import keyed_generator

# σ in grid units of the benchmark's draws: Σxxᵀ's scale at 2,641 features.
SCALE = 1.0e14

VALUES_PER_RUN = 10**6


def _seconds(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def run(repeats: int) -> dict[str, float]:
    """Measure the figures above with ``repeats`` runs each (plus one untimed warm-up)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1; got {repeats}.")
    n = VALUES_PER_RUN
    out = np.empty(n, dtype=np.float64)
    pcg = np.random.default_rng(np.random.PCG64(int.from_bytes(os.urandom(16), "little")))
    codec = FixedPointCodec()
    values = pcg.uniform(-1.0, 1.0, n)
    scale = codec.scale

    discrete_rates: list[float] = []
    pcg_rates: list[float] = []
    ratios: list[float] = []
    zig_rates: list[float] = []
    zig_ratios: list[float] = []
    encode_rates: list[float] = []
    encode_ratios: list[float] = []
    for attempt in range(repeats + 1):
        key = os.urandom(32)
        # A-B-B-A order inside each run cancels the advantage of going second
        # (warm caches, settled clock) that a fixed A-B order would give one side.
        t_draw = _seconds(partial(discrete_gaussian, key, SCALE, n))
        t_pcg = _seconds(lambda: pcg.standard_normal(out=out))
        t_pcg += _seconds(lambda: pcg.standard_normal(out=out))
        t_draw += _seconds(partial(discrete_gaussian, key, SCALE, n))
        t_zig = _seconds(partial(_rounded_ziggurat, key, n, out, codec))
        t_zig += _seconds(partial(_rounded_ziggurat, key, n, out, codec))
        t_encode = _seconds(lambda: codec.encode(values, tensor="bench"))
        t_multiply = _seconds(lambda: np.multiply(values, scale))
        t_multiply += _seconds(lambda: np.multiply(values, scale))
        t_encode += _seconds(lambda: codec.encode(values, tensor="bench"))
        if attempt == 0:
            continue  # warm-up: first touches of buffers and code paths
        discrete_rates.append(2 * n / t_draw)
        pcg_rates.append(2 * n / t_pcg)
        ratios.append(t_pcg / t_draw)
        zig_rates.append(2 * n / t_zig)
        zig_ratios.append(t_zig / t_draw)
        encode_rates.append(2 * n / t_encode)
        encode_ratios.append(t_multiply / t_encode)

    node_mask_seconds, node_mask_ratios, old_mask_seconds = _node_mask(repeats, codec, pcg)
    return {
        "node_mask_seconds_k10_d1e6": node_mask_seconds,
        "node_mask_seconds_k10_d1e6_rounded_ziggurat": old_mask_seconds,
        "node_mask_ratio_vs_pcg64_draws": node_mask_ratios,
        "discrete_gaussians_per_s": statistics.median(discrete_rates),
        "numpy_pcg64_gaussians_per_s": statistics.median(pcg_rates),
        "discrete_rate_ratio_vs_pcg64": statistics.median(ratios),
        "rounded_ziggurat_per_s": statistics.median(zig_rates),
        "discrete_rate_ratio_vs_rounded_ziggurat": statistics.median(zig_ratios),
        "fixed_point_encode_per_s": statistics.median(encode_rates),
        "fixed_point_encode_ratio_vs_numpy_multiply": statistics.median(encode_ratios),
    }


def _rounded_ziggurat(key: bytes, n: int, out: np.ndarray, codec: FixedPointCodec) -> np.ndarray:
    """The replaced construction: round(σ·z), z from the ziggurat on the AES-CTR stream."""
    keyed_generator(key).standard_normal(out=out)
    out *= SCALE / codec.scale
    return codec.encode(out, tensor="bench")


def _node_mask(
    repeats: int, codec: FixedPointCodec, pcg: np.random.Generator
) -> tuple[float, float, float]:
    k, d = 10, 10**6
    ids = [f"tre{i:02d}" for i in range(k)]
    # The 2,641-feature scale: σ_t = 10^14 grid units against T = 1 colluder.
    design = complete_design(ids, (SCALE / codec.scale) ** 2, collusion_threshold=1)
    me = ids[0]
    out = np.empty(d, dtype=np.float64)
    seconds: list[float] = []
    old_seconds: list[float] = []
    ratios: list[float] = []
    for attempt in range(repeats + 1):
        seeds = {peer: os.urandom(32) for peer in ids[1:]}
        t_mask = _seconds(
            partial(
                pairwise_mask,
                design,
                me,
                seeds,
                round_index=attempt,
                tensor="sxx",
                size=d,
                codec=codec,
            )
        )
        t_old = _seconds(partial(_old_mask, design, me, seeds, d=d, codec=codec, r=attempt))
        t_draw = 0.0
        for _ in range(k - 1):
            t_draw += _seconds(lambda: pcg.standard_normal(out=out))
        if attempt == 0:
            continue
        seconds.append(t_mask)
        old_seconds.append(t_old)
        ratios.append(t_mask / t_draw)
    return statistics.median(seconds), statistics.median(ratios), statistics.median(old_seconds)


def _old_mask(
    design: object, me: str, seeds: dict[str, bytes], *, d: int, codec: FixedPointCodec, r: int
) -> np.ndarray:
    """One node's mask as it was built before: Σ ±round(2^F·c·z) over the pair streams."""
    total = np.zeros(d, dtype=np.uint64)
    draws = np.empty(d, dtype=np.float64)
    for peer in sorted(seeds):
        keyed_generator(stream_key(seeds[peer], round_index=r, tensor="sxx")).standard_normal(
            out=draws
        )
        draws *= design.pair_std(me, peer)  # type: ignore[attr-defined]
        term = codec.encode(draws, tensor="sxx")
        total = total + term if me < peer else total - term
    return total
