"""`zerosum node --status` reads a node's state folder: sessions, releases, budget, last failure."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from node.records.ledger import PrivacyLedger
from node.records.state_folder import NodeState
from noise.accounting import compose_mu, gaussian_epsilon
from proto.federation import dump_federation
from tests.support.ledger_entries import release
from tests.support.made_up_federation import _config
from zerosum.cli import main

# Costs under which the outsider with one colluding node binds.
COLLUDER_BINDS = {"outsider": 0.1, "colluders:1": 0.4, "coordinator": math.inf}


@pytest.fixture
def federation(tmp_path: Path) -> Path:
    path = tmp_path / "federation.toml"
    path.write_text(dump_federation(_config(["a", "b", "c"])))
    return path


def _state(folder: Path) -> None:
    """Two sessions of node a: one completed with two releases, one failed before releasing."""
    state = NodeState(folder, "a")
    ledger = PrivacyLedger.open(state.ledger_path, "a", 1e-6)
    state.record_join(session_id="s1", config_hash=b"\1" * 32, public_key=b"\2" * 32, out=folder)
    for round_index in (0, 1):
        state.record_release("s1", round_index)
        release(
            ledger, ("s1", round_index, "sums"), COLLUDER_BINDS, "0" * 64, f"{round_index + 1:064x}"
        )
    state.record_end("s1", "completed")
    state.record_join(session_id="s2", config_hash=b"\1" * 32, public_key=b"\3" * 32, out=folder)
    state.record_end("s2", "failed", "the session failed: site-c did not join")


def test_status_shows_sessions_releases_budget_and_the_last_failure(
    federation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "nodes" / "a" / "state"
    _state(folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main(["node", "--federation", str(federation), "--node-id", "a", "--status"]) == 0
    out = capsys.readouterr().out
    s1 = next(line for line in out.splitlines() if line.strip().startswith("s1"))
    assert "completed" in s1 and "released rounds 0, 1" in s1 and "2 release(s)" in s1
    s2 = next(line for line in out.splitlines() if line.strip().startswith("s2"))
    assert "failed" in s2 and "0 release(s)" in s2
    colluders = gaussian_epsilon(compose_mu([0.4, 0.4]), 1e-6)
    assert f"colluders:1    2 release(s)  used ε {colluders:.4g}  left {4 - colluders:.4g}" in out
    assert "<- binds" in next(line for line in out.splitlines() if "colluders:1 " in line)
    assert "the budget binds against an outsider with 1 colluding node (colluders:1)" in out
    assert "(session s2): the session failed: site-c did not join" in out
    assert "no node process runs on it" in out
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files  # read-only

    # A failure before joining (no session yet) is the newer one and is shown instead.
    NodeState(folder, "a").record_failure("the coordinator's certificate is another CA's")
    argv = ["node", "--federation", str(federation), "--node-id", "a", "--status", "--json"]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["last_failure"]["reason"] == "the coordinator's certificate is another CA's"
    assert document["last_failure"]["session_id"] == ""
    assert document["binding_class"] == "colluders:1"
    assert [s["releases"] for s in document["sessions"]] == [2, 0]
    rows = {r["observer"]: r for r in document["budget"]}
    assert rows["coordinator"]["left"] is None and rows["coordinator"]["used"] == "inf"


def test_status_of_a_node_that_never_ran_creates_nothing_and_needs_no_grpc(
    federation: Path, tmp_path: Path
) -> None:
    import subprocess

    code = (
        "import sys; from zerosum.cli import main; rc = main(sys.argv[1:]); "
        "assert 'grpc' not in sys.modules, 'grpc was imported'; raise SystemExit(rc)"
    )
    argv = ["node", "--federation", str(federation), "--node-id", "b", "--status"]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "none yet" in done.stdout and "the whole budget 4 is left" in done.stdout
    assert "none recorded" in done.stdout
    assert not (tmp_path / "nodes").exists()


def test_status_of_an_unknown_node_lists_the_valid_ones(
    federation: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["node", "--federation", str(federation), "--node-id", "z", "--status"]) == 2
    err = capsys.readouterr().err
    assert "node 'z' is not part of federation 'test-fed'; its nodes are a, b, c" in err


def test_running_an_unknown_node_lists_the_valid_ones(
    federation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["node", "--federation", str(federation), "--node-id", "site-z"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "zerosum node site-z: node 'site-z' is not part of federation 'test-fed'; its nodes "
        "are a, b, c"
    )
    assert not (tmp_path / "out").exists()
