"""The node's state folder: its record of sessions, the replay refusal, the lock, the import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.errors import SessionFailed, SessionStateError
from node.records.ledger import PrivacyLedger
from node.records.state_folder import NodeState
from noise.keys import EphemeralKey

DELTA = 1e-6
SESSION = "0f" * 16
CONFIG_HASH = bytes(range(32))


def _joined(state: NodeState, out: Path, session: str = SESSION) -> bytes:
    key = EphemeralKey.generate().public_bytes()
    state.record_join(session_id=session, config_hash=CONFIG_HASH, public_key=key, out=out)
    return key


def _release(ledger: PrivacyLedger, session: str, index: int, payload: str) -> None:
    ledger.record_release(
        session_id=session,
        round_index=index,
        round_name="sums",
        mu={"outsider": 0.5},
        manifest_sha256="11" * 32,
        payload_sha256=payload,
    )


def test_a_session_is_recorded_from_join_to_completion(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "state", "a")
    key = _joined(state, tmp_path / "out")
    (entry,) = state.sessions()
    assert (entry.session_id, entry.stage, entry.public_key) == (SESSION, "joined", key.hex())
    assert entry.out == str((tmp_path / "out").resolve())
    assert entry.config_hash == CONFIG_HASH.hex()
    state.record_release(SESSION, 0)
    state.record_release(SESSION, 0)  # the same round again changes nothing
    assert state.sessions()[0].released == (0,)
    assert state.sessions()[0].stage == "released"
    state.record_end(SESSION, "completed")
    state.record_end(SESSION, "failed", "too late")  # a completed session stays completed
    done = state.sessions()[0]
    assert (done.stage, done.released, done.reason) == ("completed", (0,), "")
    document = json.loads(state.sessions_path.read_text())
    assert (document["format"], document["version"], document["node_id"]) == (
        "zerosum-node-sessions",
        1,
        "a",
    )


def test_a_completed_session_is_refused_even_with_its_key(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "state", "a")
    ledger = PrivacyLedger.open(state.ledger_path, "a", DELTA)
    key = _joined(state, tmp_path / "out")
    state.record_release(SESSION, 0)
    state.record_end(SESSION, "completed")
    with pytest.raises(SessionFailed) as caught:
        state.check_not_replayed(SESSION, saved_public_key=key, ledger=ledger, out=tmp_path)
    text = str(caught.value)
    joined = state.sessions()[0].joined
    assert f"refusing session {SESSION}" in text
    assert f"took part in it from {joined}" in text
    assert "released round 0" in text and "completed" in text
    assert "replaying" in text and "Nothing was sent" in text


def test_an_unfinished_session_resumes_only_with_the_recorded_key(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "state", "a")
    ledger = PrivacyLedger.open(state.ledger_path, "a", DELTA)
    key = _joined(state, tmp_path / "out")
    state.record_release(SESSION, 0)
    assert state.check_not_replayed(SESSION, saved_public_key=key, ledger=ledger, out=tmp_path)
    with pytest.raises(SessionFailed, match="holds no saved session key for it"):
        state.check_not_replayed(SESSION, saved_public_key=None, ledger=ledger, out=tmp_path)
    other = EphemeralKey.generate().public_bytes()
    with pytest.raises(SessionFailed, match="holds another session key"):
        state.check_not_replayed(SESSION, saved_public_key=other, ledger=ledger, out=tmp_path)
    # A session never seen is no replay.
    assert not state.check_not_replayed(
        "ab" * 16, saved_public_key=None, ledger=ledger, out=tmp_path
    )


def test_a_session_only_the_ledger_knows_is_refused_without_its_key(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "state", "a")
    ledger = PrivacyLedger.open(state.ledger_path, "a", DELTA)
    _release(ledger, SESSION, 0, "22" * 32)
    with pytest.raises(SessionFailed, match="already holds entries of it"):
        state.check_not_replayed(SESSION, saved_public_key=None, ledger=ledger, out=tmp_path)


def test_the_lock_admits_one_process_and_says_who_holds_it(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "state", "a")
    with state.exclusive():
        # flock conflicts between two open descriptions, even in one process.
        with (
            pytest.raises(SessionStateError) as caught,
            NodeState(tmp_path / "state", "a").exclusive(),
        ):
            pass
        text = str(caught.value)
        assert f"the state folder {tmp_path / 'state'} is in use by another process" in text
        assert "holds node.lock" in text
    with state.exclusive():
        pass  # released when the holder is done


def test_a_damaged_or_foreign_record_is_refused(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "state", "a")
    _joined(state, tmp_path / "out")
    with pytest.raises(SessionStateError, match="belongs to node 'a', not 'b'"):
        NodeState(tmp_path / "state", "b").sessions()
    document = json.loads(state.sessions_path.read_text())
    document["sessions"][0]["stage"] = "halfway"
    state.sessions_path.write_text(json.dumps(document))
    with pytest.raises(SessionStateError, match="has stage 'halfway'"):
        state.sessions()
    state.sessions_path.write_text("{")
    with pytest.raises(SessionStateError, match="is not valid JSON"):
        state.sessions()


def test_a_version_1_ledger_in_out_is_imported_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # A ledger as the previous version wrote it: no payload digests.
    (out / "ledger.json").write_text(
        json.dumps(
            {
                "format": "zerosum-ledger",
                "version": 1,
                "node_id": "a",
                "delta": DELTA,
                "entries": [
                    {
                        "kind": "release",
                        "session_id": "old",
                        "round_index": 0,
                        "round_name": "sums",
                        "timestamp": "2026-01-01T00:00:00+00:00",
                        "mu": {"outsider": 0.6, "coordinator": "inf"},
                        "details": {"manifest_sha256": "33" * 32, "tensors": ["n"]},
                    },
                    {
                        "kind": "unmask",
                        "session_id": "old",
                        "round_index": 0,
                        "round_name": "sums",
                        "timestamp": "2026-01-01T00:01:00+00:00",
                        "mu": {"outsider": 0.8, "coordinator": "inf"},
                        "details": {"dropped": ["c"], "survivors": ["a", "b"]},
                    },
                ],
            }
        )
    )
    state = NodeState(tmp_path / "state", "a")
    lines: list[str] = []
    ledger = state.open_ledger(DELTA, out, lines.append)
    assert lines == [
        f"imported 2 entries of the privacy ledger {out / 'ledger.json'} into "
        f"{state.ledger_path} (the node's ledger across sessions from now on)"
    ]
    # The version-1 unmask raises its release (it names no payload).
    assert ledger.total("outsider").mu == pytest.approx(0.8)
    assert ledger.total("outsider").releases == 1
    assert json.loads(state.ledger_path.read_text())["version"] == 2
    # Its sessions have no record of their own: the session list names them imported.
    assert state.imported_sessions() == {"old"}
    # OUT now holds the copy; opening again imports nothing more.
    again: list[str] = []
    reopened = state.open_ledger(DELTA, out, again.append)
    assert again == []
    assert len(reopened.entries) == 2
    _release(reopened, "new", 0, "44" * 32)
    copy = json.loads((out / "ledger.json").read_text())
    assert copy["entries"] == json.loads(state.ledger_path.read_text())["entries"]
    assert len(copy["entries"]) == 3


def test_an_unreadable_ledger_in_out_stops_the_node(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "ledger.json").write_text(json.dumps({"format": "zerosum-ledger", "version": 7}))
    with pytest.raises(SessionStateError, match="ledger version 7"):
        NodeState(tmp_path / "state", "a").open_ledger(DELTA, out, lambda _line: None)
    assert not (tmp_path / "state" / "ledger.json").exists()


def _opened(state: NodeState, out: Path, lines: list[str] | None = None) -> PrivacyLedger:
    return state.open_ledger(DELTA, out, (lines if lines is not None else []).append)


def _released(
    state: NodeState, ledger: PrivacyLedger, session: str, round_index: int, digest: str
) -> None:
    """A release as a node makes it: in the ledger, then in the session list."""
    _release(ledger, session, round_index, digest)
    state.record_release(session, round_index)


def _round_0_released(tmp_path: Path) -> tuple[NodeState, PrivacyLedger]:
    """Node a's state folder, joined to SESSION with its round 0 released."""
    state = NodeState(tmp_path / "state", "a")
    _joined(state, tmp_path / "out")
    ledger = _opened(state, tmp_path / "out")
    _released(state, ledger, SESSION, 0, "22" * 32)
    return state, ledger


def test_a_ledger_older_than_the_session_list_is_refused(tmp_path: Path) -> None:
    state, ledger = _round_0_released(tmp_path)
    older = state.ledger_path.read_bytes()
    _released(state, ledger, SESSION, 1, "33" * 32)
    state.ledger_path.write_bytes(older)  # restored from a backup
    with pytest.raises(SessionStateError) as refused:
        _opened(state, tmp_path / "fresh-out")
    assert (
        f"records that this node released round 1 of session {SESSION} (released rounds 0, 1)"
        f", but the privacy ledger {state.ledger_path} holds no release of it"
    ) in str(refused.value)


def test_a_session_list_older_than_the_ledger_is_refused(tmp_path: Path) -> None:
    state, ledger = _round_0_released(tmp_path)
    older = state.sessions_path.read_bytes()
    _released(state, ledger, SESSION, 1, "33" * 32)
    _joined(state, tmp_path / "out", session="1e" * 16)
    _released(state, ledger, "1e" * 16, 0, "44" * 32)
    state.sessions_path.write_bytes(older)  # restored from a backup
    with pytest.raises(SessionStateError, match=f"holds entries of session {'1e' * 16}, but"):
        _opened(state, tmp_path / "fresh-out")
    # The same list with the newer session but not round 1 of the first.
    entries = json.loads(older)
    entries["sessions"].append(json.loads(state.sessions_path.read_text())["sessions"][0])
    entries["sessions"][-1]["session_id"] = "1e" * 16
    entries["sessions"][-1]["released"] = [0]
    state.sessions_path.write_text(json.dumps(entries))
    with pytest.raises(SessionStateError) as refused:
        _opened(state, tmp_path / "fresh-out")
    assert (
        f"records the release of round 1 of session {SESSION}, but {state.sessions_path} "
        "does not (released round 0)"
    ) in str(refused.value)


def test_a_crash_between_the_ledger_and_the_session_list_is_repaired(tmp_path: Path) -> None:
    state = NodeState(tmp_path / "state", "a")
    _joined(state, tmp_path / "out")
    ledger = _opened(state, tmp_path / "out")
    _release(ledger, SESSION, 0, "22" * 32)  # the node stops before record_release
    lines: list[str] = []
    _opened(state, tmp_path / "out", lines)
    assert lines == [
        f"{state.sessions_path} lacked the release of round 0 of session {SESSION} that the "
        "ledger records (the node stopped between the two writes); recorded now"
    ]
    entry = state.entry(SESSION)
    assert entry is not None and entry.released == (0,) and entry.stage == "released"
