"""Throughput of the keyed Gaussian stream and the fixed-point encoder.

Each figure is a median over ``repeats`` runs. Every run times the candidate
and its baseline on 10^6 values each, twice, in A-B-B-A order within the same
loop iteration, so both see the same machine load; the ratio figures are
medians of per-run ratios:

* ``mask_gaussians_per_s``: N(0, 1) draws per second from an AES-128-CTR
  keyed generator (fresh 32-byte key every run) into a preallocated buffer;
* ``numpy_pcg64_gaussians_per_s``: the same from numpy's default PCG64;
* ``mask_rate_ratio_vs_pcg64``: per-run AES-CTR rate / PCG64 rate (target ≥ 0.9);
* ``fixed_point_encode_per_s``: float64 values encoded per second;
* ``fixed_point_encode_ratio_vs_numpy_multiply``: per-run encode rate / rate of
  a plain ``np.multiply`` of the same array by the scale;
* ``node_mask_seconds_k10_d1e6``: one node's full pairwise mask for K = 10
  nodes (complete graph, 9 pair streams), d = 10^6 entries, fixed point
  included (target ≤ 1.5 s);
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
from noise.fixed_point import FixedPointCodec
from noise.masks import pairwise_mask
from noise.stream import keyed_generator

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

    mask_rates: list[float] = []
    pcg_rates: list[float] = []
    mask_ratios: list[float] = []
    encode_rates: list[float] = []
    encode_ratios: list[float] = []
    for attempt in range(repeats + 1):
        aes = keyed_generator(os.urandom(32))
        # A-B-B-A order inside each run cancels the advantage of going second
        # (warm caches, settled clock) that a fixed A-B order would give one side.
        t_mask = _seconds(partial(aes.standard_normal, out=out))
        t_pcg = _seconds(lambda: pcg.standard_normal(out=out))
        t_pcg += _seconds(lambda: pcg.standard_normal(out=out))
        t_mask += _seconds(partial(aes.standard_normal, out=out))
        t_encode = _seconds(lambda: codec.encode(values, tensor="bench"))
        t_multiply = _seconds(lambda: np.multiply(values, scale))
        t_multiply += _seconds(lambda: np.multiply(values, scale))
        t_encode += _seconds(lambda: codec.encode(values, tensor="bench"))
        if attempt == 0:
            continue  # warm-up: first touches of buffers and code paths
        mask_rates.append(2 * n / t_mask)
        pcg_rates.append(2 * n / t_pcg)
        mask_ratios.append(t_pcg / t_mask)
        encode_rates.append(2 * n / t_encode)
        encode_ratios.append(t_multiply / t_encode)

    node_mask_seconds, node_mask_ratios = _node_mask(repeats, codec, pcg)
    return {
        "node_mask_seconds_k10_d1e6": node_mask_seconds,
        "node_mask_ratio_vs_pcg64_draws": node_mask_ratios,
        "mask_gaussians_per_s": statistics.median(mask_rates),
        "numpy_pcg64_gaussians_per_s": statistics.median(pcg_rates),
        "mask_rate_ratio_vs_pcg64": statistics.median(mask_ratios),
        "fixed_point_encode_per_s": statistics.median(encode_rates),
        "fixed_point_encode_ratio_vs_numpy_multiply": statistics.median(encode_ratios),
    }


def _node_mask(
    repeats: int, codec: FixedPointCodec, pcg: np.random.Generator
) -> tuple[float, float]:
    k, d = 10, 10**6
    ids = [f"tre{i:02d}" for i in range(k)]
    design = complete_design(ids, 1.0, collusion_threshold=1)
    me = ids[0]
    out = np.empty(d, dtype=np.float64)
    seconds: list[float] = []
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
        t_draw = 0.0
        for _ in range(k - 1):
            t_draw += _seconds(lambda: pcg.standard_normal(out=out))
        if attempt == 0:
            continue
        seconds.append(t_mask)
        ratios.append(t_mask / t_draw)
    return statistics.median(seconds), statistics.median(ratios)
