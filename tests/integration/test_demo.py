"""The happy path end to end: `zerosum demo` runs a coordinator and three node processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from noise.fixed_point import wrapping_sum

pytestmark = pytest.mark.integration


def _demo(*flags: str) -> subprocess.CompletedProcess[str]:
    """``zerosum demo`` with ``flags`` as a separate process, which must succeed."""
    finished = subprocess.run(
        [sys.executable, "-m", "zerosum.cli", "demo", *flags],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return finished


def _exact_summary(*flags: str) -> dict[str, Any]:
    """The ``--json`` summary of a demo run, whose sums must be exact."""
    summary: dict[str, Any] = json.loads(_demo("--json", *flags).stdout)
    assert summary["max_relative_difference_vs_pooled"] <= 1e-9
    assert summary["payload_sums_equal_audit_sums"] is True
    return summary


def test_demo_session_is_exact_and_fast(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    summary = _exact_summary("--out", str(out))
    # Complete data: the whole brain-age fit is one release per node.
    assert summary["rounds_checked"] == 1
    assert summary["session_seconds"] < 60
    assert summary["max_difference_between_nodes_years"] == 0.0
    # Exact: the federated model's holdout quality is the pooled fit's.
    fed, exact = summary["holdout_federated"], summary["holdout_pooled_exact"]
    assert fed == pytest.approx(exact, rel=1e-9)
    assert summary["holdout_chronological_age"]["delta_correlation"] is None

    # The same facts straight from the files the processes left behind: per
    # round, Σ of what the nodes sent equals Σ of their un-noised audit
    # records bit for bit, while no single egress equals its audit record.
    nodes = [entry["node_id"] for entry in summary["nodes"]]
    assert len(nodes) == 3
    for node in nodes:
        egress = out / "nodes" / node / "out" / "egress"
        assert sorted(p.name for p in egress.iterdir()) == ["round-0"]
    for round_index in (0,):
        sent, clean = [], []
        for node in nodes:
            base = out / "nodes" / node / "out"
            sent.append(np.load(base / "egress" / f"round-{round_index}" / "payload.npy"))
            clean.append(np.load(base / "audit" / f"round-{round_index}" / "payload.npy"))
            assert not np.array_equal(sent[-1], clean[-1])
        assert np.array_equal(wrapping_sum(sent), wrapping_sum(clean))
    models = {(out / "nodes" / n / "out" / "model.json").read_bytes() for n in nodes}
    assert len(models) == 1


def test_demo_residual_dp_headline_sets_the_noised_model_beside_the_exact_fit(
    tmp_path: Path,
) -> None:
    # With residual noise the model can lose the delta and predict chronological
    # age, which scores *well* against chronological age; the headline is the
    # error against the true brain age, printed beside the exact pooled fit.
    finished = _demo("--residual-dp", "--out", str(tmp_path))
    lines = finished.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "against the synthetic truth" in line)
    assert lines[header + 1].split() == ["federated", "pooled", "exact", "age", "itself"]
    assert lines[header + 2].lstrip().startswith("corr(estimated delta, true delta)")
    assert lines[header + 2].split()[-1] == "—"  # no delta, no correlation
    assert lines[header + 4].lstrip().startswith("|Ŷ − chronological age|")
    assert lines[header + 4].split()[-1] == "0.00"
    assert "Only the first row measures the delta" in finished.stdout
    assert "the fit the same data would give without that noise" in finished.stdout


def test_demo_with_cape_reports_only_the_egress_rounds(tmp_path: Path) -> None:
    # Under CAPE every model round follows a secure-sum round whose folder
    # holds a note on a blinded share, not an egress bundle.
    out = tmp_path / "demo-cape"
    summary = _exact_summary("--construction", "cape", "--out", str(out))
    # One secure sum of the CAPE draws, then the one release of the model round.
    assert summary["rounds_checked"] == 1
    for entry in summary["nodes"]:
        sums = out / "nodes" / entry["node_id"] / "out" / "egress"
        assert sorted(p.name for p in sums.iterdir()) == ["round-0", "round-1"]
        assert (sums / "round-0" / "cape-sum.json").exists()
        assert not (sums / "round-0" / "manifest.json").exists()
        assert (sums / "round-1" / "manifest.json").exists()
