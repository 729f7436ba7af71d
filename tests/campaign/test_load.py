"""Load: 50 node processes × 20 rounds of d = 10^5 against one coordinator process.

Each node is a process of its own with its own TLS channel
(benchmarks/live_bench.py); every round every node uploads 800 kB, takes part
in the unmask step and downloads and checks the aggregate, which the test
compares with Σ_k q(x_k) bit for bit. The coordinator's RSS is read after
every round: its least-squares slope after the warm-up rounds must stay under
:data:`MAX_RSS_SLOPE_MB_PER_ROUND`, 5 % of the 40 MB the nodes upload each
round (a coordinator that kept one buffer per upload would grow by all of
it; round-to-round noise of the samples is several MB). The figures go to
``load-k50-d1e5.json`` in the test's folder and to stdout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.live_bench import WARMUP_ROUNDS, live_session

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = 50
ROUNDS = 20
VALUES = 10**5
MAX_RSS_SLOPE_MB_PER_ROUND = 2.0


def test_fifty_nodes_twenty_rounds_without_errors_and_flat_memory(tmp_path: Path) -> None:
    measured = live_session(tmp_path, NODES, VALUES, ROUNDS)
    summary = measured.summary()
    out = tmp_path / "load-k50-d1e5.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"load figures ({out}):\n{json.dumps(summary, indent=2)}")
    assert measured.errors == []
    assert len(measured.round_seconds) == ROUNDS
    slope = measured.rss_slope_mb_per_round(WARMUP_ROUNDS)
    assert abs(slope) < MAX_RSS_SLOPE_MB_PER_ROUND, summary
