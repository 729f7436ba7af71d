"""The saved session key: round trip, private file mode, and clear refusals of bad files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from node.records.session_state import (
    KEY_FILE,
    SESSION_FILE,
    SessionRecord,
    SessionStateError,
    SessionStore,
)
from noise.keys import EphemeralKey

SESSION = "5e55" * 8
HASH = bytes(range(32))
OTHER_HASH = bytes(range(1, 33))


def _saved(tmp_path: Path) -> tuple[SessionStore, EphemeralKey]:
    store = SessionStore(tmp_path / "out")
    key = EphemeralKey.generate()
    store.start(session_id=SESSION, node_id="a", config_hash=HASH, key=key)
    return store, key


def _resume(
    store: SessionStore, *, session_id: str = SESSION, node_id: str = "a", config_hash: bytes = HASH
) -> tuple[SessionRecord, EphemeralKey] | None:
    return store.resume(session_id=session_id, node_id=node_id, config_hash=config_hash)


def test_a_saved_key_comes_back_with_its_record(tmp_path: Path) -> None:
    store, key = _saved(tmp_path)
    found = _resume(store)
    assert found is not None
    record, loaded = found
    assert loaded.private_bytes() == key.private_bytes()
    assert record.public_key == key.public_bytes()
    assert (record.session_id, record.node_id, record.config_hash) == (SESSION, "a", HASH)
    document = json.loads((tmp_path / "out" / SESSION_FILE).read_text())
    assert document["format"] == "zerosum-node-session"
    assert document["config_hash"] == HASH.hex()
    assert document["public_key"] == key.public_bytes().hex()
    assert document["created"]
    # The same key gives the same shared secrets, hence the same pairwise seeds.
    peer = EphemeralKey.generate()
    assert loaded.exchange(peer.public_bytes()) == key.exchange(peer.public_bytes())


def test_the_key_file_is_private_and_raw(tmp_path: Path) -> None:
    store, key = _saved(tmp_path)
    assert stat.S_IMODE(store.key_path.stat().st_mode) == 0o600
    assert store.key_path.read_bytes() == key.private_bytes()
    # No temporary file is left beside it.
    assert sorted(p.name for p in store.out.iterdir()) == sorted([KEY_FILE, SESSION_FILE])


def test_the_key_file_is_private_even_under_a_permissive_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        store, _ = _saved(tmp_path)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(store.key_path.stat().st_mode) == 0o600


def test_nothing_saved_means_nothing_to_resume(tmp_path: Path) -> None:
    assert SessionStore(tmp_path).read() is None
    assert _resume(SessionStore(tmp_path)) is None


def test_another_session_is_not_resumed(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    assert _resume(store, session_id="f" * 32) is None
    # Even under another federation config: a new session, not an error.
    assert _resume(store, session_id="f" * 32, config_hash=OTHER_HASH) is None


def test_a_folder_of_another_node_is_refused(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    with pytest.raises(SessionStateError, match="belongs to node 'a', not 'b'"):
        _resume(store, node_id="b")


def test_the_same_session_under_another_config_is_refused(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    with pytest.raises(SessionStateError, match="under the federation config with hash 0001"):
        _resume(store, config_hash=OTHER_HASH)


def test_a_corrupt_record_is_refused_with_its_path(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    store.record_path.write_text("{not json")
    with pytest.raises(SessionStateError, match=r"session\.json is not valid JSON"):
        _resume(store)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "zerosum-ledger"}, "is not a zerosum-node-session version 1 file"),
        ({"version": 2}, "is not a zerosum-node-session version 1 file"),
        ({"session_id": ""}, "field 'session_id' must be a non-empty string"),
        ({"node_id": 7}, "field 'node_id' must be a non-empty string"),
        ({"public_key": "zz" * 32}, "field 'public_key' must be 64 hex digits"),
        ({"config_hash": "00" * 31}, "field 'config_hash' must be 64 hex digits"),
        ({"completed": 1}, "field 'completed' must be a string"),
    ],
)
def test_a_malformed_record_names_the_field(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    store, _ = _saved(tmp_path)
    document = json.loads(store.record_path.read_text())
    document.update(change)
    store.record_path.write_text(json.dumps(document))
    with pytest.raises(SessionStateError, match=message):
        _resume(store)


def test_a_record_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    store.record_path.write_text("[1, 2]")
    with pytest.raises(SessionStateError, match="must hold a JSON object; found list"):
        _resume(store)


def test_a_missing_key_is_refused(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    store.key_path.unlink()
    with pytest.raises(SessionStateError, match=r"session\.key is missing") as caught:
        _resume(store)
    assert SESSION in str(caught.value)


def test_a_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    store.key_path.chmod(0o644)
    with pytest.raises(SessionStateError, match=r"accessible to other users \(mode 0644\)"):
        _resume(store)


def test_a_truncated_key_is_refused(tmp_path: Path) -> None:
    store, key = _saved(tmp_path)
    store.key_path.write_bytes(key.private_bytes()[:31])
    with pytest.raises(SessionStateError, match="holds 31 bytes"):
        _resume(store)


def test_a_key_that_is_not_the_recorded_one_is_refused(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    store.key_path.write_bytes(EphemeralKey.generate().private_bytes())
    with pytest.raises(SessionStateError, match="not the key"):
        _resume(store)


def test_completion_deletes_the_key_and_keeps_the_record(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    store.complete()
    assert not store.key_path.exists()
    record = store.read()
    assert record is not None and record.completed
    # A completed session is never resumed; a second completion is harmless.
    assert _resume(store) is None
    store.complete()


def test_a_new_session_replaces_the_old_key(tmp_path: Path) -> None:
    store, old = _saved(tmp_path)
    new = EphemeralKey.generate()
    store.start(session_id="f" * 32, node_id="a", config_hash=HASH, key=new)
    assert store.key_path.read_bytes() == new.private_bytes()
    assert _resume(store) is None
    found = _resume(store, session_id="f" * 32)
    assert found is not None and found[1].public_bytes() == new.public_bytes()
    assert old.private_bytes() not in store.key_path.read_bytes()


def test_a_bad_config_hash_is_not_saved(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    with pytest.raises(SessionStateError, match="config_hash must be a 32-byte SHA-256"):
        store.start(session_id=SESSION, node_id="a", config_hash=b"x", key=EphemeralKey.generate())
    assert not store.key_path.exists() and not store.record_path.exists()
