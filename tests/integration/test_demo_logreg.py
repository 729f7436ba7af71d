"""`zerosum demo --plan logreg`: T live rounds equal non-private FedAvg of clipped gradients."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_iterative_fedavg_is_exact_and_composed_in_every_ledger(tmp_path: Path) -> None:
    steps = 4
    finished = subprocess.run(
        [
            sys.executable, "-m", "zerosum.cli", "demo", "--plan", "logreg",
            "--rounds", str(steps), "--json", "--out", str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(finished.stdout)
    # Fresh zero-sum masks every round cancel exactly: the session's weights are
    # those of non-private FedAvg of the clipped gradients, bit for bit.
    assert result["weights_identical_to_nonprivate_fedavg"] is True
    assert result["weights_error_zero_sum"] == 0.0
    assert result["accuracy_zero_sum"] == result["accuracy_nonprivate_fedavg"]
    assert result["payload_sums_equal_audit_sums"] is True
    assert result["rounds_checked"] == steps + 1
    assert result["weights_error_independent_noise_mean"] > 0
    assert 0.5 < result["accuracy_pooled_fit"] <= 1.0
    for row in result["ledgers"]:
        assert row["releases"] == steps + 1  # the count, then one release per step
        assert row["epsilon_outsider"] <= result["epsilon_budget"]
