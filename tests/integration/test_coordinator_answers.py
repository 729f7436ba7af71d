"""What `zerosum coordinator` says when it cannot or should not start a session.

Real processes on 127.0.0.1: a state file whose session has ended is refused
without ``--new-session`` (and kept, renamed, with it); an address in use fails
before any state file exists.
"""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import pytest

from tests.support.processes import Federation, Processes, Spawned, init_federation

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    # A 1 s join deadline: with no node started, every session fails after a second.
    return init_federation(
        tmp_path_factory.mktemp("fed"),
        ["a", "b", "c"],
        cohort_sizes=[110, 110, 110],
        join_deadline=1.0,
        round_deadline=5.0,
    )


def _spawn(
    processes: Processes, federation: Federation, state: Path, listen: str, *extra: str
) -> Spawned:
    return processes.zerosum(
        "coordinator",
        "coordinator",
        "--federation",
        str(federation.toml),
        "--state",
        str(state),
        "--listen",
        listen,
        *extra,
    )


def _coordinator(processes: Processes, federation: Federation, state: Path, *extra: str) -> str:
    spawned = _spawn(processes, federation, state, "127.0.0.1:0", "--linger", "0", *extra)
    code = spawned.wait(60)
    return f"{code}\n{spawned.stderr()}"


def _failed_session(processes: Processes, federation: Federation, tmp_path: Path) -> Path:
    """The state file of a session that failed for want of nodes (the coordinator exited 1)."""
    state = tmp_path / "state.sqlite"
    assert _coordinator(processes, federation, state).startswith("1\n")
    return state


def _edit(state: Path, *statements: str) -> None:
    """Run ``statements`` on the state file, in one transaction."""
    with sqlite3.connect(state) as db:
        for statement in statements:
            db.execute(statement)


def test_an_ended_session_is_not_started_again_without_new_session(
    federation: Federation, processes: Processes, tmp_path: Path
) -> None:
    state = tmp_path / "state.sqlite"
    first = _coordinator(processes, federation, state)
    assert first.startswith("1\n") and "only 0 of 3 nodes joined" in first
    session_id = first.split("started session ")[1].split()[0]
    before = state.read_bytes()

    again = _coordinator(processes, federation, state)
    code, _, err = again.partition("\n")
    assert code == "2"
    assert err.count("\n") == 1, err  # one sentence, no "resumed" and no server started
    assert f"holds session {session_id}, which failed" in err
    assert "pass --new-session" in err and "or a new --state" in err
    assert state.read_bytes() == before

    # --new-session keeps the ended session's file beside it and starts another.
    fresh = _coordinator(processes, federation, state, "--new-session")
    assert fresh.startswith("1\n"), fresh
    kept = tmp_path / f"state-{session_id}.sqlite"
    assert kept.read_bytes() == before
    assert f"its state file is kept as {kept}" in fresh
    assert (tmp_path / f"state-{session_id}.payloads").is_dir()
    second_id = fresh.split("started session ")[1].split()[0]
    assert second_id != session_id


@pytest.mark.slow
def test_new_session_is_refused_while_the_session_has_not_ended(
    federation: Federation, processes: Processes, tmp_path: Path
) -> None:
    state = _failed_session(processes, federation, tmp_path)
    # As if the session were still running (a coordinator stopped by a signal).
    _edit(state, "UPDATE session SET state = 'running'")
    before = state.read_bytes()
    out = _coordinator(processes, federation, state, "--new-session")
    assert out.startswith("2\n") and "has not ended; run without --new-session" in out
    assert state.read_bytes() == before


@pytest.mark.slow
def test_a_completed_session_whose_result_a_node_lacks_is_resumed_to_hand_it_out(
    federation: Federation, processes: Processes, tmp_path: Path
) -> None:
    state = _failed_session(processes, federation, tmp_path)
    # As if it completed and was killed while lingering, before node a fetched the result.
    _edit(
        state,
        "INSERT INTO roster (node_id, public_key, signature, joined_ms, status) "
        "VALUES ('a', x'00', x'00', 0, 'live')",
        "UPDATE session SET state = 'completed', current_round = 0",
    )
    out = _coordinator(processes, federation, state)
    assert "resumed session" in out and "an ended session is not started again" not in out


def test_a_port_in_use_fails_before_any_state_is_written(
    federation: Federation, processes: Processes, tmp_path: Path
) -> None:
    state = tmp_path / "state.sqlite"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        spawned = _spawn(processes, federation, state, f"127.0.0.1:{port}")
        assert spawned.wait(60) == 2
    err = spawned.stderr()
    assert f"cannot listen on 127.0.0.1:{port}: port {port} is in use" in err
    assert "nothing was written" in err
    assert "started session" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]
