"""`zerosum coordinator --status`: the session as the state file tells it, read-only."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.errors import StateFileError
from coordinator.session import Session
from coordinator.status_view import coordinator_alive, lock_path, read_status, render_status
from coordinator.store import Store
from tests.coordinator.support import (
    N_WORDS,
    REJECTED,
    FakeClock,
    attest_all,
    join_all,
    make_federation,
    submit_correction,
    upload,
    withdraw,
    zero_sum,
)
from zerosum.commands import coordinator as command
from zerosum.commands import federation as federation_command


def _running_session(tmp_path: Path) -> tuple[Path, Session, Store]:
    """Nodes a, b, c, d in the federation; d never joins, c withdraws, a has uploaded."""
    fed = make_federation(("a", "b", "c", "d"), min_nodes=2)
    state = tmp_path / "state.sqlite"
    store = Store(state)
    session = Session(store, fed.config, clock=FakeClock())
    join_all(fed, session, ["a", "b", "c"])
    session.tick(session.store.session().join_deadline_ms)  # type: ignore[union-attr]
    withdraw(session, "c")
    data = zero_sum(("a", "b"), N_WORDS, seed=3)
    upload(session, "a", 0, data.payloads["a"])
    return state, session, store


def test_the_status_names_who_joined_withdrew_submitted_and_is_awaited(tmp_path: Path) -> None:
    state, session, store = _running_session(tmp_path)
    before = store.dump()
    # Read beside the live coordinator, which holds the state file's lock.
    status = read_status(state, ("a", "b", "c", "d"))
    assert store.dump() == before
    assert status["session"]["session_id"] == session.session_id
    assert status["session"]["state"] == "running"
    assert status["never_joined"] == ["d"]
    by_node = {n["node_id"]: n for n in status["nodes"]}
    assert by_node["c"]["status"] == "dropped"
    assert REJECTED in by_node["c"]["dropped_reason"]
    assert by_node["a"]["status"] == "live" and by_node["a"]["dropped_reason"] is None
    [round0] = status["rounds"]
    assert (round0["name"], round0["status"]) == ("moments", "open")
    assert round0["submitted"] == ["a"] and round0["awaited"] == ["b"]
    text = render_status(status)
    assert "never joined: d" in text
    assert "1 of 2 submitted; awaiting b until" in text
    assert f"dropped in round 0: withdrew from round 0 ('moments'): {REJECTED}" in text
    json.dumps(status)  # JSON-ready as it is
    store.close()


def test_the_status_shows_the_unmask_step_and_a_round_superseded_by_its_rerun(
    tmp_path: Path,
) -> None:
    fed = make_federation(("a", "b", "c"), min_nodes=2)
    state = tmp_path / "state.sqlite"
    clock = FakeClock()
    store = Store(state)
    session = Session(store, fed.config, clock=clock)
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=4)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    [round0] = read_status(state, fed.node_ids)["rounds"]
    assert (round0["status"], round0["submitted"], round0["awaited"]) == (
        "unmask",
        ["a", "b", "c"],
        [],
    )
    assert round0["reason"] == "waiting for the unmask answers of a, b, c"
    assert "result_digest" not in round0
    attest_all(fed, session, 0)
    submit_correction(session, "a", 0, None)
    submit_correction(session, "b", 0, None)
    session.tick(clock.advance(60_000))  # c never reveals its seed
    status = read_status(state, fed.node_ids)
    superseded, rerun = status["rounds"]
    assert (superseded["name"], superseded["status"]) == ("moments", "superseded")
    assert "result_digest" not in superseded
    assert (rerun["name"], rerun["status"], rerun["participants"]) == (
        "moments",
        "open",
        ["a", "b"],
    )
    by_node = {n["node_id"]: n for n in status["nodes"]}
    assert by_node["c"]["status"] == "dropped" and by_node["c"]["dropped_round"] == 0
    text = render_status(status)
    assert (
        "c did not answer the unmask request of round 0 ('moments'); the round is rerun as "
        "'moments' among a, b from round 1, with fresh keys; attempt 2 of plan round 'moments' "
        "(at most 3)" in text
    )
    assert "0 of 2 submitted; awaiting a, b until" in text
    store.close()


def test_a_missing_or_foreign_state_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match="does not exist"):
        read_status(tmp_path / "nowhere.sqlite", ())
    other = tmp_path / "other.sqlite"
    other.write_bytes(b"not a database at all, just some bytes" * 10)
    with pytest.raises(StateFileError, match="cannot be opened"):
        read_status(other, ())


def test_the_command_prints_text_or_json_and_exits_2_without_a_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    out = tmp_path / "fed"
    assert (
        federation_command.run(
            parser.parse_args(
                [
                    *("init", "--nodes", "a,b", "--out", str(out), "--feature-range=-1,1"),
                    *("--feature-names", "x1,x2", "--n-components", "1"),
                ]
            )
        )
        == 0
    )
    capsys.readouterr()

    def status(*extra: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        args = parser.parse_args(["--federation", str(out / "federation.toml"), *extra])
        code = command.run(args)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, _, err = status("--status")
    assert code == 2 and "state.sqlite does not exist" in err
    state, session, store = _running_session(tmp_path)
    code, text, _ = status("--status", "--state", str(state))
    assert code == 0 and f"session {session.session_id}" in text and "awaiting b" in text
    code, text, _ = status("--status", "--json", "--state", str(state))
    assert code == 0 and json.loads(text)["rounds"][0]["submitted"] == ["a"]
    code, _, err = status("--json")
    assert code == 2 and "--json goes with --status" in err
    store.close()


_HOLD_LOCK = """\
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
sys.stdin.read()
"""


def test_liveness_follows_the_lock_of_another_process(tmp_path: Path) -> None:
    state, _, store = _running_session(tmp_path)
    store.close()  # this process lets go; another one takes the lock as a coordinator does
    lock = lock_path(state)
    assert lock.exists()
    with subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        try:
            assert holder.stdout.readline() == "locked\n"
            assert coordinator_alive(state) is True
            assert read_status(state, ("a", "b"))["coordinator_process"] == "running"
        finally:
            holder.stdin.close()  # the holder ends, and the system releases its lock
            holder.wait(timeout=30)
    assert coordinator_alive(state) is False
    status = read_status(state, ("a", "b"))
    assert status["coordinator_process"] == "not running"
    assert status["session"]["state"] == "running"
    assert status["latest_event"] is not None and status["state_written"] is not None
    text = render_status(status)
    assert text.splitlines()[0].endswith(": running (as last recorded)")
    assert "coordinator process: NOT RUNNING" in text
    # Testing the lock leaves it free: a coordinator can take it at once.
    Store(state).close()


def test_no_lock_file_is_not_running_and_none_is_created(tmp_path: Path) -> None:
    state, _, store = _running_session(tmp_path)
    store.close()
    lock_path(state).unlink()
    assert coordinator_alive(state) is False
    assert not lock_path(state).exists()
