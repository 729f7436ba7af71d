"""The machine figures of ``make bench``: fresh memory and the payload writer."""

from __future__ import annotations

from benchmarks import memory_bench
from benchmarks.__main__ import MODULES


def test_the_memory_figures_are_measured_and_consistent() -> None:
    figures = memory_bench.run(1)
    assert set(figures) == {
        "fresh_memory_fill_ms_per_8mb",
        "reused_memory_fill_ms_per_8mb",
        "fresh_memory_fill_ratio",
        "page_cache_write_ms_per_8mib",
        "payload_writer_ms_per_8mib",
        "payload_writer_ratio_vs_page_cache",
        "payload_writer_direct",
    }
    assert all(value >= 0 for value in figures.values())
    assert figures["payload_writer_direct"] in (0.0, 1.0)
    assert figures["fresh_memory_fill_ratio"] == (
        figures["fresh_memory_fill_ms_per_8mb"] / figures["reused_memory_fill_ms_per_8mb"]
    )
    assert "benchmarks.memory_bench" in MODULES
