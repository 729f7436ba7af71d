"""The SQLite state file and its payload directory."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import blake3
import pytest

from coordinator.errors import StateFileError
from coordinator.store import (
    SCHEMA_VERSION,
    AttestationRow,
    Store,
    UnmaskRow,
    UploadRow,
    payload_dir_for,
)
from coordinator.store import state as state_module
from noise.layout import Layout

LAYOUT = Layout.of({"t": (2,)})


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "coordinator" / "state.sqlite")


def create(store: Store) -> None:
    with store.transaction():
        store.create_session(
            session_id="ab" * 16,
            config_hash=b"\x01" * 32,
            federation_id="fed",
            created_ms=1,
            join_deadline_ms=2,
        )
        store.add_member("a", b"\x02" * 32, b"\x03" * 64, 1)
        store.open_round(0, "moments", ["a"], 1, 10)


def stored_upload(store: Store, data: bytes = b"\x05" * 16) -> UploadRow:
    writer = store.new_payload()
    writer.write(data[:5])
    writer.write(data[5:])
    digest = writer.finish()
    name = store.upload_name(0, "a", digest)
    writer.place(name)
    row = UploadRow(0, "a", digest, len(data), name, LAYOUT, 32, 5, b"\x07" * 64, b"\x09" * 32)
    with store.transaction():
        store.add_upload(row)
    return row


def test_a_new_state_file_has_the_schema_wal_and_foreign_keys(store: Store) -> None:
    db = sqlite3.connect(store.path)
    assert db.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()
    assert store.session() is None
    assert store.payload_dir == payload_dir_for(store.path)
    assert store.payload_dir.name == "state.payloads" and store.payload_dir.is_dir()
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"), store.transaction():
        store.add_upload(
            UploadRow(7, "nobody", b"\x00" * 32, 8, "x.u64", LAYOUT, 32, 0, b"\x00" * 64, bytes(32))
        )


def test_rows_survive_reopening(store: Store) -> None:
    create(store)
    row = stored_upload(store)
    store.close()
    again = Store(store.path)
    session = again.session()
    assert session is not None and session.session_id == "ab" * 16 and session.state == "joining"
    assert again.members()[0].node_id == "a"
    assert again.round(0).participants == ("a",)  # type: ignore[union-attr]
    assert again.upload(0, "a") == row
    assert again.payload_path(row.path).read_bytes() == b"\x05" * 16
    assert row.digest == blake3.blake3(b"\x05" * 16).digest()


def test_a_failed_transaction_leaves_nothing_behind(store: Store) -> None:
    create(store)
    before = store.dump()
    with pytest.raises(KeyError), store.transaction():
        store.add_member("b", b"\x02" * 32, b"\x03" * 64, 1)
        store.set_session_state("running")
        raise KeyError("crash in the middle of a transition")
    assert store.dump() == before


def test_writes_outside_a_transaction_are_refused(store: Store) -> None:
    with pytest.raises(RuntimeError, match=r"inside Store\.transaction"):
        store.add_member("a", b"\x02" * 32, b"\x03" * 64, 1)
    with pytest.raises(RuntimeError, match="do not nest"), store.transaction(), store.transaction():
        pass


def test_recovery_deletes_temporary_and_unreferenced_files(store: Store) -> None:
    create(store)
    row = stored_upload(store)
    unfinished = store.new_payload()
    unfinished.write(b"half")
    orphan = store.new_payload()
    orphan.write(b"\x09" * 8)
    orphan.place("r0000-upload-a-0000000000000000.u64")  # renamed, row never inserted
    removed = store.recover()
    assert sorted(removed) == sorted([unfinished.path.name, "r0000-upload-a-0000000000000000.u64"])
    assert [p.name for p in store.payload_dir.iterdir()] == [row.path]


def test_recovery_refuses_a_state_file_whose_payload_is_missing(store: Store) -> None:
    create(store)
    row = stored_upload(store)
    store.payload_path(row.path).unlink()
    with pytest.raises(StateFileError, match="missing or does not hold 16 bytes"):
        store.recover()


def test_a_discarded_writer_leaves_no_file(store: Store) -> None:
    writer = store.new_payload()
    writer.write(b"abc")
    writer.discard()
    assert not any(store.payload_dir.iterdir())


def test_files_that_are_not_state_files_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE notes (x)")
    db.commit()
    db.close()
    with pytest.raises(StateFileError, match="not a zerosum coordinator state file"):
        Store(other)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateFileError, match="cannot be opened"):
        Store(garbage)


def _closed_at_schema_version(store: Store, version: int) -> None:
    """Close ``store`` and mark its file as written at schema ``version``."""
    store.close()
    db = sqlite3.connect(store.path)
    db.execute(f"UPDATE schema_version SET version = {version}")
    db.commit()
    db.close()


def test_a_state_file_of_another_schema_version_is_refused(store: Store) -> None:
    _closed_at_schema_version(store, 99)
    with pytest.raises(StateFileError, match="schema version 99"):
        Store(store.path)


def test_a_state_file_of_an_earlier_schema_is_refused_saying_what_changed(store: Store) -> None:
    # Version 1 stored uploads without their signed statements; nodes would refuse
    # every aggregate of such a session, so it is not resumed.
    _closed_at_schema_version(store, 1)
    with pytest.raises(StateFileError) as caught:
        Store(store.path)
    message = str(caught.value)
    assert "has schema version 1, written by an earlier coordinator" in message
    assert f"reads version {SCHEMA_VERSION} (version 2: uploads carry the node's signed" in message
    assert "start a new session with a new --state path" in message


def test_file_names_are_safe_for_any_node_id() -> None:
    digest = b"\xab" * 32
    assert Store.upload_name(3, "site-a", digest) == "r0003-upload-site-a-abababababababab.u64"
    odd = Store.upload_name(3, "../x y", digest)
    assert "/" not in odd and " " not in odd and odd.startswith("r0003-upload-x")
    assert Store.result_name(12, digest) == "r0012-result-abababababababab.u64"
    assert Store.correction_name(1, 2, "b", digest) == "r0001-unmask2-b-abababababababab.u64"


def test_sync_flushes_the_wal_once_for_every_commit_before_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(store)
    flushed: list[str] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    for n in range(3):
        with store.transaction():
            store.set_roster_version(n + 1)
    store.sync()
    # One flush of the WAL covers the four commits; nothing new, nothing flushed.
    assert flushed == [str(store.path) + "-wal"]
    store.sync()
    assert len(flushed) == 1

    # Calls that sync at once share flushes: never more than one per call, at least one.
    def commit_and_sync(n: int) -> None:
        with store.transaction():
            store.set_roster_version(10 + n)
        store.sync()

    threads = [threading.Thread(target=commit_and_sync, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 1 <= len(flushed) - 1 <= 8
    assert store.session() is not None and store.session().roster_version >= 10  # type: ignore[union-attr]


def test_a_remembered_read_follows_every_write_and_every_rollback(store: Store) -> None:
    create(store)
    assert store.uploads(0) == []
    row = stored_upload(store)
    assert store.uploads(0) == [row]  # the write forgot the empty answer
    store.uploads(0).clear()  # a caller changing its copy changes nothing remembered
    assert store.uploads(0) == [row]
    with pytest.raises(RuntimeError, match="undo"), store.transaction():
        store.drop_member("a", 0, "gone")
        assert [m.status for m in store.members()] == ["dropped"]  # read back inside
        raise RuntimeError("undo")
    assert [m.status for m in store.members()] == ["live"]  # the rollback is not remembered


def _attempt(attempt: int) -> UnmaskRow:
    return UnmaskRow(0, attempt, ("a",), (), b"\x11" * 32, 1, 10)


def test_a_row_s_json_columns_are_decoded_once_and_rows_written_later_read_true(
    store: Store,
) -> None:
    create(store)
    copies = (("b", b"\x0a" * 48, b"\x0b" * 64), ("c", b"\x0c" * 48, b"\x0b" * 64))
    writer = store.new_payload()
    writer.write(b"\x05" * 16)
    digest = writer.finish()
    name = store.upload_name(0, "a", digest)
    writer.place(name)
    row = UploadRow(0, "a", digest, 16, name, LAYOUT, 32, 5, b"\x07" * 64, b"\x09" * 32, copies)
    with store.transaction():
        store.add_upload(row)
    first = store.uploads(0)[0]
    with pytest.raises(RuntimeError, match="undo"), store.transaction():
        raise RuntimeError("undo")  # a rollback forgets every typed read...
    again = store.uploads(0)[0]
    assert again == row and again is not first  # ...the row is read again,
    assert again.challenge is first.challenge and again.layout is first.layout  # not decoded
    # Rows whose texts differ decode to their own values.
    other = (("b", b"\x0e" * 80, b"\x0f" * 64),)
    with store.transaction():
        store.add_unmask_request(_attempt(0))
        store.add_attestation(AttestationRow(0, 0, "a", b"\x0d" * 64, 6, copies))
    with store.transaction():
        store.add_unmask_request(_attempt(1))
        store.add_attestation(AttestationRow(0, 1, "a", b"\x0d" * 64, 7, other))
    assert [a.tags for a in store.attestations(0, 0)] == [copies]
    assert [a.tags for a in store.attestations(0, 1)] == [other]


def test_a_store_keeps_the_decoded_columns_of_its_newest_two_rounds_only(store: Store) -> None:
    create(store)
    tags = [((f"n{i}", bytes([i]) * 80, b"\x0b" * 64),) for i in range(5)]
    with store.transaction():
        for round_index in range(1, 5):
            store.open_round(round_index, f"r{round_index}", ["a"], 1, 10)
        for round_index, copies in enumerate(tags):
            store.add_unmask_request(UnmaskRow(round_index, 0, ("a",), (), b"\x11" * 32, 1, 10))
            store.add_attestation(AttestationRow(round_index, 0, "a", b"\x0d" * 64, 6, copies))
    for round_index, copies in enumerate(tags):
        assert store.attestations(round_index, 0)[0].tags == copies
        newest = list(range(max(0, round_index - 1), round_index + 1))
        assert sorted(store._decoded_rounds) == newest
    # An old round read again is decoded again, and not kept.
    assert store.attestations(0, 0)[0].tags == tags[0]
    assert sorted(store._decoded_rounds) == [3, 4]


def test_a_write_forgets_the_reads_of_its_own_table_only(store: Store) -> None:
    create(store)
    stored_upload(store)
    upload, round_row = store.uploads(0)[0], store.round(0)
    with store.transaction():
        store.set_join_deadline(7)
        store.set_round_reason(0, "a reason")
    assert store.uploads(0)[0] is upload  # no write to uploads: still remembered
    assert store.round(0) is not round_row and store.round(0).reason == "a reason"  # type: ignore[union-attr]
    assert store.session().join_deadline_ms == 7  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="undo"), store.transaction():
        store.set_round_reason(0, "another reason")
        raise RuntimeError("undo")
    assert store.uploads(0)[0] is not upload and store.uploads(0)[0] == upload
    assert store.round(0).reason == "a reason"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("sql", "table"),
    [
        ("INSERT INTO uploads (a) VALUES (?)", "uploads"),
        ("INSERT OR IGNORE INTO deliveries (a) VALUES (?)", "deliveries"),
        ("  update rounds SET a = ?", "rounds"),
        ("DELETE FROM unmask_acks WHERE a = ?", "unmask_acks"),
        ("REPLACE INTO results (a) VALUES (?)", "results"),
        ("SELECT * FROM uploads", None),
        ("WITH x AS (SELECT 1) INSERT INTO uploads SELECT * FROM x", None),
    ],
)
def test_the_table_a_statement_writes_is_read_from_it(sql: str, table: str | None) -> None:
    # None makes a write forget every remembered read: the safe answer when unsure.
    assert state_module._written_table(sql) == table


def test_a_read_only_store_remembers_nothing(store: Store) -> None:
    create(store)
    watcher = Store(store.path, read_only=True)
    assert watcher.uploads(0) == []
    row = stored_upload(store)
    assert watcher.uploads(0) == [row]  # written by another connection, seen at once
    watcher.close()
