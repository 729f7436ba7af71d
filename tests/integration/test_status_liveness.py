"""`zerosum coordinator --status` tells a live coordinator from one killed with SIGKILL."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from coordinator.status_view import lock_path, read_status, render_status
from tests.support.processes import Processes, init_federation
from tests.support.sessions import SessionRun

pytestmark = pytest.mark.integration


def _seconds_since(stamp: str) -> float:
    when = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=dt.UTC)
    return (dt.datetime.now(dt.UTC) - when).total_seconds()


def test_status_of_a_live_then_killed_then_restarted_coordinator(
    tmp_path: Path, processes: Processes
) -> None:
    federation = init_federation(
        tmp_path / "federation",
        ("a", "b"),
        cohort_sizes=(120, 110),
        join_deadline=120,
        round_deadline=60,
    )
    run = SessionRun(federation, tmp_path / "run", processes)
    coordinator = run.start_coordinator()
    state = run.state.path

    live = read_status(state, federation.node_ids)
    assert live["coordinator_process"] == "running"
    assert live["session"]["state"] == "joining"
    assert 0 <= _seconds_since(live["state_written"]) < 120
    assert live["latest_event"] == live["session"]["created"]
    assert f"coordinator process: running (it holds {lock_path(state).name})" in render_status(live)

    assert coordinator.kill() == -9
    dead = read_status(state, federation.node_ids)
    # The file still says what the coordinator last wrote ...
    assert dead["session"]["state"] == "joining"
    assert _seconds_since(dead["state_written"]) >= _seconds_since(live["state_written"]) - 1
    # ... and the lock it held died with it.
    assert dead["coordinator_process"] == "not running"
    text = render_status(dead)
    assert ": joining (as last recorded)" in text.splitlines()[0]
    assert "coordinator process: NOT RUNNING" in text
    assert "stopped or crashed; start it again with the same arguments to resume" in text

    # The command line prints the same, and reading the status took no lock away:
    # a restarted coordinator starts and is seen running.
    status = processes.zerosum(
        "status", "coordinator", "--federation", str(federation.toml), "--state", str(state),
        "--status",
    )  # fmt: skip
    assert status.wait(timeout=60) == 0, status.describe()
    assert "coordinator process: NOT RUNNING" in status.stdout()
    run.start_coordinator()
    assert read_status(state, federation.node_ids)["coordinator_process"] == "running"
