"""The protocol's floor in ``make bench``: the round's own computations, added up."""

from __future__ import annotations

import numpy as np

from benchmarks import session_bench


def test_the_protection_figures_include_the_protocol_floor() -> None:
    figures = session_bench._protection_figures(1)
    assert set(figures) == {
        "node_protection_cpu_seconds_d1e6",
        "coordinator_self_mask_cpu_seconds_d1e6",
        "round_protocol_floor_cpu_seconds_k10_d1e6",
    }
    # The floor holds ten nodes' protection work and more besides.
    floor = figures["round_protocol_floor_cpu_seconds_k10_d1e6"]
    assert floor > 0.0
    assert np.isfinite(floor)


def test_the_floor_grows_with_the_vector() -> None:
    # Hashes, self-masks and tags are passes over the vector: a vector a hundred
    # times longer cannot cost less (signatures are the same in both).
    small = np.arange(10**4, dtype=np.uint64)
    large = np.arange(10**6, dtype=np.uint64)
    assert session_bench._protocol_floor(large, 3) > session_bench._protocol_floor(small, 3)
