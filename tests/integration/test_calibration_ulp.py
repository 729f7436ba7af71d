"""A node whose floating point differs in the last bit still draws the same integers.

Every noise scale is pinned in the federation config (``noise_std``, grid
units) and every variance a node draws with is an exact fraction of it
(``noise.exact_noise``), so nothing a node computes in floating point of its
own decides a draw. Here one node's calibration routine — the analytic
Gaussian mechanism's μ*(ε, δ), from which its own float design is planned —
is moved up by one ulp (a ``sitecustomize`` module loaded by that node's
process only), as a TRE with another scipy or libm might compute it. Before
the scales were pinned, such a node drew pair terms of a different scale and
the masks no longer cancelled. The session must complete and every published
aggregate must equal the sum of the nodes' un-noised payloads bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.processes import Processes, init_federation
from tests.support.sessions import SessionRun, reference_model, relative_difference

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")

NUDGE = """
import math
import sys

import noise.accounting as accounting

_original = accounting.gaussian_mu


def _nudged(epsilon, delta):
    return math.nextafter(_original(epsilon, delta), math.inf)


accounting.gaussian_mu = _nudged
print("calibration nudged by one ulp", file=sys.stderr)
"""


def test_a_node_with_a_one_ulp_different_calibration_still_cancels(
    tmp_path: Path, processes: Processes
) -> None:
    federation = init_federation(
        tmp_path / "federation",
        NODES,
        cohort_sizes=(120, 130, 140),
        join_deadline=60,
        round_deadline=60,
    )
    nudge = tmp_path / "nudge"
    nudge.mkdir()
    (nudge / "sitecustomize.py").write_text(NUDGE, encoding="utf-8")
    run = SessionRun(federation, tmp_path / "session", processes)
    run.start_coordinator()
    for node in NODES:
        run.start_node(node, env={"PYTHONPATH": str(nudge)} if node == "c" else None)
    codes = run.wait_all()
    assert codes == dict.fromkeys(["coordinator", *NODES], 0), run.describe()
    assert "calibration nudged by one ulp" in run.nodes["c"].stderr()
    assert "calibration nudged" not in run.nodes["a"].stderr()
    for round_index in (0, 1):
        published = run.state.result(round_index)
        assert published is not None, run.describe()
        survivors, aggregate = published
        assert survivors == NODES
        assert np.array_equal(aggregate, run.audit_sum(NODES, round_index))
    reference = reference_model(federation, NODES, NODES)
    for node in NODES:
        assert relative_difference(run.model(node), reference, federation.holdout()) <= 1e-9
