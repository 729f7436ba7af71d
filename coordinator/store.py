"""Durable coordinator state: one SQLite file plus a directory of payload files.

The state file holds the session (id, config hash, state, reason), the roster
of signed ephemeral keys, every round with its status and deadline, the
uploads with their signed upload statements, results, unmask requests,
survivor attestations, corrections and refusals. Payloads (uploads,
corrections, results) live as raw little-endian uint64 files in
``<stem>.payloads/`` next to the SQLite file; a row names its file and
records its SHA-256 and size.

Crash safety (a ``kill -9`` at any instant leaves a consistent state):

* SQLite runs in WAL mode with ``synchronous=FULL``, so a committed
  transaction survives power loss, and every state transition of the session
  is exactly one transaction (:meth:`Store.transaction`);
* a payload is written to a temporary ``.part-*`` name, fsynced, renamed to its
  final content-addressed name and the directory fsynced, and only *then* is
  the row that refers to it inserted. A crash before the insert leaves an
  unreferenced file, which :meth:`Store.recover` deletes at the next start, as
  it deletes every temporary file; the node's retry then stores it again.

Final names contain the round, the kind, the node and the first 16 hex digits
of the content's SHA-256, so a rename never replaces a file with different
content.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.errors import StateFileError
from noise.layout import Layout

__all__ = [
    "SCHEMA_VERSION",
    "AttestationRow",
    "CorrectionRow",
    "MemberRow",
    "PayloadWriter",
    "RefusalRow",
    "ResultRow",
    "RoundRow",
    "SessionRow",
    "Store",
    "UnmaskRow",
    "UploadRow",
    "payload_dir_for",
]

SCHEMA_VERSION = 2
# What each version added, for the sentence refusing an older state file.
_SCHEMA_CHANGES = {2: "uploads carry the node's signed upload statement"}
_PART_PREFIX = ".part-"

_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE session (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    session_id TEXT NOT NULL,
    config_hash BLOB NOT NULL,
    federation_id TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('joining', 'running', 'completed', 'failed')),
    current_round INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    created_ms INTEGER NOT NULL,
    join_deadline_ms INTEGER NOT NULL,
    roster_final INTEGER NOT NULL DEFAULT 0,
    roster_version INTEGER NOT NULL DEFAULT 0,
    ended_ms INTEGER
);
CREATE TABLE roster (
    node_id TEXT PRIMARY KEY,
    public_key BLOB NOT NULL,
    signature BLOB NOT NULL,
    joined_ms INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('live', 'dropped')),
    dropped_round INTEGER,
    dropped_reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE rounds (
    round_index INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'unmask', 'ready', 'failed', 'superseded')),
    participants TEXT NOT NULL,
    opened_ms INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL,
    layout TEXT,
    fixed_point_bits INTEGER,
    unmask_attempt INTEGER NOT NULL DEFAULT 0,
    reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE uploads (
    round_index INTEGER NOT NULL REFERENCES rounds (round_index),
    node_id TEXT NOT NULL REFERENCES roster (node_id),
    sha256 BLOB NOT NULL,
    size INTEGER NOT NULL,
    path TEXT NOT NULL UNIQUE,
    layout TEXT NOT NULL,
    fixed_point_bits INTEGER NOT NULL,
    received_ms INTEGER NOT NULL,
    statement_signature BLOB NOT NULL,
    PRIMARY KEY (round_index, node_id)
);
CREATE TABLE results (
    round_index INTEGER PRIMARY KEY REFERENCES rounds (round_index),
    survivors TEXT NOT NULL,
    dropped TEXT NOT NULL,
    sha256 BLOB NOT NULL,
    size INTEGER NOT NULL,
    path TEXT NOT NULL UNIQUE,
    computed_ms INTEGER NOT NULL
);
CREATE TABLE unmask_requests (
    round_index INTEGER NOT NULL REFERENCES rounds (round_index),
    attempt INTEGER NOT NULL,
    survivors TEXT NOT NULL,
    dropped TEXT NOT NULL,
    survivor_hash BLOB NOT NULL,
    opened_ms INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL,
    PRIMARY KEY (round_index, attempt)
);
CREATE TABLE unmask_acks (
    round_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    node_id TEXT NOT NULL REFERENCES roster (node_id),
    signature BLOB NOT NULL,
    received_ms INTEGER NOT NULL,
    PRIMARY KEY (round_index, attempt, node_id),
    FOREIGN KEY (round_index, attempt) REFERENCES unmask_requests (round_index, attempt)
);
CREATE TABLE unmask_corrections (
    round_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    node_id TEXT NOT NULL REFERENCES roster (node_id),
    sha256 BLOB NOT NULL,
    size INTEGER NOT NULL,
    path TEXT NOT NULL UNIQUE,
    received_ms INTEGER NOT NULL,
    PRIMARY KEY (round_index, attempt, node_id),
    FOREIGN KEY (round_index, attempt) REFERENCES unmask_requests (round_index, attempt)
);
CREATE TABLE unmask_refusals (
    round_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    node_id TEXT NOT NULL REFERENCES roster (node_id),
    reason TEXT NOT NULL,
    received_ms INTEGER NOT NULL,
    PRIMARY KEY (round_index, attempt, node_id),
    FOREIGN KEY (round_index, attempt) REFERENCES unmask_requests (round_index, attempt)
);
CREATE TABLE deliveries (
    round_index INTEGER NOT NULL REFERENCES results (round_index),
    node_id TEXT NOT NULL REFERENCES roster (node_id),
    delivered_ms INTEGER NOT NULL,
    PRIMARY KEY (round_index, node_id)
);
"""

_TABLES = (
    "schema_version",
    "session",
    "roster",
    "rounds",
    "uploads",
    "results",
    "unmask_requests",
    "unmask_acks",
    "unmask_corrections",
    "unmask_refusals",
    "deliveries",
)


# ---------------------------------------------------------------- rows


@dataclass(frozen=True)
class SessionRow:
    """The one session this state file belongs to."""

    session_id: str
    config_hash: bytes
    federation_id: str
    state: str  # joining | running | completed | failed
    current_round: int | None
    reason: str
    created_ms: int
    join_deadline_ms: int
    roster_final: bool
    roster_version: int
    ended_ms: int | None


@dataclass(frozen=True)
class MemberRow:
    """A joined node: its signed ephemeral key and whether it is still live."""

    node_id: str
    public_key: bytes
    signature: bytes
    joined_ms: int
    status: str  # live | dropped
    dropped_round: int | None
    dropped_reason: str


@dataclass(frozen=True)
class RoundRow:
    """One round: ``participants`` are the live nodes when it opened."""

    round_index: int
    name: str
    status: str  # open | unmask | ready | failed | superseded
    participants: tuple[str, ...]
    opened_ms: int
    deadline_ms: int
    layout: Layout | None
    fixed_point_bits: int | None
    unmask_attempt: int
    reason: str


@dataclass(frozen=True)
class UploadRow:
    """A node's stored payload for a round and its signed upload statement.

    The statement's other fields are the round's name, the session's final
    roster hash and ``sha256``, so only the signature needs storing.
    """

    round_index: int
    node_id: str
    sha256: bytes
    size: int
    path: str
    layout: Layout
    fixed_point_bits: int
    received_ms: int
    statement_signature: bytes


@dataclass(frozen=True)
class ResultRow:
    """The published aggregate of a round and the survivor set it covers."""

    round_index: int
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    sha256: bytes
    size: int
    path: str
    computed_ms: int


@dataclass(frozen=True)
class UnmaskRow:
    """One attempt at unmasking a round: survivors S, dropped D and the hash binding them."""

    round_index: int
    attempt: int
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    survivor_hash: bytes
    opened_ms: int
    deadline_ms: int


@dataclass(frozen=True)
class AttestationRow:
    """A survivor's signature over the survivor set of an unmask attempt."""

    round_index: int
    attempt: int
    node_id: str
    signature: bytes
    received_ms: int


@dataclass(frozen=True)
class CorrectionRow:
    """A survivor's stored unmask correction for an attempt."""

    round_index: int
    attempt: int
    node_id: str
    sha256: bytes
    size: int
    path: str
    received_ms: int


@dataclass(frozen=True)
class RefusalRow:
    """A survivor's refusal to unmask, with its reason."""

    round_index: int
    attempt: int
    node_id: str
    reason: str
    received_ms: int


def _ids(text: str) -> tuple[str, ...]:
    return tuple(str(x) for x in json.loads(text))


def _ids_json(ids: Sequence[str]) -> str:
    return json.dumps(sorted(ids), separators=(",", ":"))


def _layout(text: str) -> Layout:
    return Layout.from_json(json.loads(text))


def _layout_json(layout: Layout) -> str:
    return json.dumps(layout.to_json(), separators=(",", ":"))


def payload_dir_for(state_path: Path) -> Path:
    """The payload directory that belongs to a state file: ``state.sqlite`` → ``state.payloads``."""
    return state_path.with_name(state_path.stem + ".payloads")


def _name_tag(node_id: str) -> str:
    """A file-name-safe tag for a node id (the id itself when it is already safe)."""
    if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", node_id):
        return node_id
    return "x" + hashlib.sha256(node_id.encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------- payload files


class PayloadWriter:
    """Receives one payload into a temporary file, hashing it on the way.

    Writes are unbuffered (``os.write``), so bytes written are immediately
    visible to another reader of the same file; the running sum relies on that
    to withdraw a partial contribution (coordinator/aggregate.py).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / f"{_PART_PREFIX}{secrets.token_hex(8)}"
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._digest = hashlib.sha256()
        self.size = 0
        self.placed: Path | None = None

    def write(self, data: bytes) -> None:
        """Append ``data``."""
        if self._fd is None:
            raise ValueError("payload writer is closed.")
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._digest.update(data)
        self.size += len(data)

    def finish(self) -> bytes:
        """fsync and close the temporary file; return the SHA-256 of everything written."""
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        return self._digest.digest()

    def place(self, final_name: str) -> Path:
        """Rename the finished file to ``final_name`` in the payload directory, durably."""
        self.finish()
        target = self.directory / final_name
        os.replace(self.path, target)
        _fsync_dir(self.directory)
        self.placed = target
        return target

    def discard(self) -> None:
        """Close and delete the temporary file (never a placed one)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.placed is None:
            self.path.unlink(missing_ok=True)


def _lock_exclusively(state_path: Path) -> int:
    """Hold an exclusive lock on ``<state>.lock`` for as long as the process uses the state.

    Two coordinators on one state file would corrupt the session; the lock
    makes the second refuse to start. The operating system releases it when
    the process ends, however it ends (``kill -9`` included).
    """
    lock_path = state_path.with_name(state_path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateFileError(
            f"state file {state_path} is in use by another coordinator process "
            f"(it holds {lock_path.name}); stop that one first."
        ) from None
    return fd


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the store


class Store:
    """The coordinator's SQLite state file and payload directory.

    All access is serialised by one re-entrant lock; writes are only allowed
    inside :meth:`transaction`, so every transition is atomic.
    """

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        """Open (creating if needed) and lock the state file.

        ``read_only`` opens an existing file for inspection only (``zerosum
        coordinator --status``): no lock is taken, so it works beside a running
        coordinator, nothing is created, and every write fails.
        """
        self.path = Path(path)
        self.payload_dir = payload_dir_for(self.path)
        self._lock = threading.RLock()
        self._in_transaction = False
        self.read_only = read_only
        if read_only:
            if not self.path.is_file():
                raise StateFileError(f"state file {self.path} does not exist.")
            self._owner = -1
            self._db = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._owner = _lock_exclusively(self.path)
            self.payload_dir.mkdir(exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            if not read_only:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute("PRAGMA foreign_keys=ON")
            self._ensure_schema()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            if self._owner >= 0:
                os.close(self._owner)
            raise StateFileError(f"state file {self.path} cannot be opened: {exc}.") from None
        except BaseException:
            self._db.close()
            if self._owner >= 0:
                os.close(self._owner)
            raise

    def _ensure_schema(self) -> None:
        tables = {
            row[0]
            for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if not tables and self.read_only:
            raise StateFileError(f"state file {self.path} holds no session yet.")
        if not tables:
            # One script, one transaction: a crash here leaves an empty file, not half a schema.
            self._db.executescript(
                "BEGIN IMMEDIATE;"
                + _SCHEMA
                + f"INSERT INTO schema_version (version) VALUES ({SCHEMA_VERSION});COMMIT;"
            )
            return
        if "schema_version" not in tables:
            raise StateFileError(f"state file {self.path} is not a zerosum coordinator state file.")
        row = self._db.execute("SELECT version FROM schema_version").fetchone()
        if row is None or row[0] != SCHEMA_VERSION:
            found = None if row is None else row[0]
            if isinstance(found, int) and found < SCHEMA_VERSION:
                # Not migrated: the uploads of an older file have no signed
                # statements, and nodes refuse an aggregate without them.
                since = "; ".join(
                    f"version {v}: {what}"
                    for v, what in sorted(_SCHEMA_CHANGES.items())
                    if v > found
                )
                raise StateFileError(
                    f"state file {self.path} has schema version {found}, written by an "
                    f"earlier coordinator; this coordinator reads version {SCHEMA_VERSION} "
                    f"({since}). Finish that session with the release that started it, or "
                    "start a new session with a new --state path."
                )
            raise StateFileError(
                f"state file {self.path} has schema version {found}; this coordinator "
                f"reads version {SCHEMA_VERSION}."
            )

    def close(self) -> None:
        """Close the database connection and release the state file for another process."""
        with self._lock:
            self._db.close()
            if self._owner >= 0:
                os.close(self._owner)
                self._owner = -1

    # ------------------------------------------------------------ transactions

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic transition: everything written inside commits together or not at all."""
        with self._lock:
            if self._in_transaction:
                raise RuntimeError("transactions do not nest.")
            self._db.execute("BEGIN IMMEDIATE")
            self._in_transaction = True
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")
            finally:
                self._in_transaction = False

    def _write(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        if not self._in_transaction:
            raise RuntimeError("state writes must happen inside Store.transaction().")
        return self._db.execute(sql, params)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, params).fetchall())

    # ------------------------------------------------------------ session

    def session(self) -> SessionRow | None:
        """The session row, or None in a fresh state file."""
        rows = self._read(
            "SELECT session_id, config_hash, federation_id, state, current_round, reason, "
            "created_ms, join_deadline_ms, roster_final, roster_version, ended_ms FROM session"
        )
        if not rows:
            return None
        r = rows[0]
        return SessionRow(
            session_id=r[0],
            config_hash=bytes(r[1]),
            federation_id=r[2],
            state=r[3],
            current_round=r[4],
            reason=r[5],
            created_ms=r[6],
            join_deadline_ms=r[7],
            roster_final=bool(r[8]),
            roster_version=r[9],
            ended_ms=r[10],
        )

    def create_session(
        self,
        *,
        session_id: str,
        config_hash: bytes,
        federation_id: str,
        created_ms: int,
        join_deadline_ms: int,
    ) -> None:
        """Insert the session row (once per state file)."""
        self._write(
            "INSERT INTO session (singleton, session_id, config_hash, federation_id, state, "
            "created_ms, join_deadline_ms) VALUES (1, ?, ?, ?, 'joining', ?, ?)",
            (session_id, config_hash, federation_id, created_ms, join_deadline_ms),
        )

    def update_session(self, **fields: Any) -> None:
        """Set columns of the session row (state, current_round, reason, roster_final, ...)."""
        allowed = {
            "state",
            "current_round",
            "reason",
            "join_deadline_ms",
            "roster_final",
            "roster_version",
            "ended_ms",
        }
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown session column(s): {sorted(unknown)}")
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self._write(f"UPDATE session SET {assignments}", tuple(fields.values()))

    # ------------------------------------------------------------ roster

    def members(self) -> list[MemberRow]:
        """Every joined node, sorted by node id."""
        return [
            MemberRow(r[0], bytes(r[1]), bytes(r[2]), r[3], r[4], r[5], r[6])
            for r in self._read(
                "SELECT node_id, public_key, signature, joined_ms, status, dropped_round, "
                "dropped_reason FROM roster ORDER BY node_id"
            )
        ]

    def live_node_ids(self) -> set[str]:
        """The ids of the joined nodes not dropped (so far)."""
        return {r[0] for r in self._read("SELECT node_id FROM roster WHERE status = 'live'")}

    def add_member(self, node_id: str, public_key: bytes, signature: bytes, joined_ms: int) -> None:
        """Record a node's signed ephemeral key."""
        self._write(
            "INSERT INTO roster (node_id, public_key, signature, joined_ms, status) "
            "VALUES (?, ?, ?, ?, 'live')",
            (node_id, public_key, signature, joined_ms),
        )

    def drop_member(self, node_id: str, round_index: int, reason: str) -> None:
        """Mark a node dropped for the rest of the session."""
        self._write(
            "UPDATE roster SET status = 'dropped', dropped_round = ?, dropped_reason = ? "
            "WHERE node_id = ?",
            (round_index, reason, node_id),
        )

    # ------------------------------------------------------------ rounds

    def rounds(self) -> list[RoundRow]:
        """Every round opened so far, in order."""
        return [
            self._round_row(r)
            for r in self._read(
                "SELECT round_index, name, status, participants, opened_ms, deadline_ms, layout, "
                "fixed_point_bits, unmask_attempt, reason FROM rounds ORDER BY round_index"
            )
        ]

    def round(self, round_index: int) -> RoundRow | None:
        """One round, or None if it has not been opened."""
        rows = self._read(
            "SELECT round_index, name, status, participants, opened_ms, deadline_ms, layout, "
            "fixed_point_bits, unmask_attempt, reason FROM rounds WHERE round_index = ?",
            (round_index,),
        )
        return self._round_row(rows[0]) if rows else None

    @staticmethod
    def _round_row(r: tuple[Any, ...]) -> RoundRow:
        return RoundRow(
            round_index=r[0],
            name=r[1],
            status=r[2],
            participants=_ids(r[3]),
            opened_ms=r[4],
            deadline_ms=r[5],
            layout=None if r[6] is None else _layout(r[6]),
            fixed_point_bits=r[7],
            unmask_attempt=r[8],
            reason=r[9],
        )

    def open_round(
        self,
        round_index: int,
        name: str,
        participants: Sequence[str],
        opened_ms: int,
        deadline_ms: int,
    ) -> None:
        """Insert a new round in status 'open'."""
        self._write(
            "INSERT INTO rounds (round_index, name, status, participants, opened_ms, deadline_ms) "
            "VALUES (?, ?, 'open', ?, ?, ?)",
            (round_index, name, _ids_json(participants), opened_ms, deadline_ms),
        )

    def update_round(self, round_index: int, **fields: Any) -> None:
        """Set columns of a round (status, deadline_ms, layout, fixed_point_bits, ...)."""
        allowed = {
            "status",
            "deadline_ms",
            "layout",
            "fixed_point_bits",
            "unmask_attempt",
            "reason",
        }
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown round column(s): {sorted(unknown)}")
        values = [
            _layout_json(v) if name == "layout" and v is not None else v
            for name, v in fields.items()
        ]
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self._write(
            f"UPDATE rounds SET {assignments} WHERE round_index = ?", (*values, round_index)
        )

    # ------------------------------------------------------------ uploads

    def uploads(self, round_index: int) -> list[UploadRow]:
        """Stored uploads of a round, sorted by node id."""
        return [
            UploadRow(r[0], r[1], bytes(r[2]), r[3], r[4], _layout(r[5]), r[6], r[7], bytes(r[8]))
            for r in self._read(
                "SELECT round_index, node_id, sha256, size, path, layout, fixed_point_bits, "
                "received_ms, statement_signature FROM uploads WHERE round_index = ? "
                "ORDER BY node_id",
                (round_index,),
            )
        ]

    def upload(self, round_index: int, node_id: str) -> UploadRow | None:
        """One stored upload, or None."""
        for row in self.uploads(round_index):
            if row.node_id == node_id:
                return row
        return None

    def add_upload(self, row: UploadRow) -> None:
        """Record a stored upload (its file must already be placed)."""
        self._write(
            "INSERT INTO uploads (round_index, node_id, sha256, size, path, layout, "
            "fixed_point_bits, received_ms, statement_signature) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                row.node_id,
                row.sha256,
                row.size,
                row.path,
                _layout_json(row.layout),
                row.fixed_point_bits,
                row.received_ms,
                row.statement_signature,
            ),
        )

    # ------------------------------------------------------------ results

    def result(self, round_index: int) -> ResultRow | None:
        """The stored result of a round, or None."""
        rows = self._read(
            "SELECT round_index, survivors, dropped, sha256, size, path, computed_ms "
            "FROM results WHERE round_index = ?",
            (round_index,),
        )
        if not rows:
            return None
        r = rows[0]
        return ResultRow(r[0], _ids(r[1]), _ids(r[2]), bytes(r[3]), r[4], r[5], r[6])

    def add_result(self, row: ResultRow) -> None:
        """Record a round's aggregate (its file must already be placed)."""
        self._write(
            "INSERT INTO results (round_index, survivors, dropped, sha256, size, path, "
            "computed_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                _ids_json(row.survivors),
                _ids_json(row.dropped),
                row.sha256,
                row.size,
                row.path,
                row.computed_ms,
            ),
        )

    def deliveries(self, round_index: int) -> set[str]:
        """Nodes that have been sent the whole result of a round."""
        return {
            r[0]
            for r in self._read(
                "SELECT node_id FROM deliveries WHERE round_index = ?", (round_index,)
            )
        }

    def add_delivery(self, round_index: int, node_id: str, delivered_ms: int) -> None:
        """Note that a node was sent a round's whole result (kept once)."""
        self._write(
            "INSERT OR IGNORE INTO deliveries (round_index, node_id, delivered_ms) "
            "VALUES (?, ?, ?)",
            (round_index, node_id, delivered_ms),
        )

    # ------------------------------------------------------------ unmask

    def unmask_request(self, round_index: int, attempt: int) -> UnmaskRow | None:
        """One unmask attempt of a round, or None."""
        rows = self._read(
            "SELECT round_index, attempt, survivors, dropped, survivor_hash, opened_ms, "
            "deadline_ms FROM unmask_requests WHERE round_index = ? AND attempt = ?",
            (round_index, attempt),
        )
        if not rows:
            return None
        r = rows[0]
        return UnmaskRow(r[0], r[1], _ids(r[2]), _ids(r[3]), bytes(r[4]), r[5], r[6])

    def add_unmask_request(self, row: UnmaskRow) -> None:
        """Record a new unmask attempt."""
        self._write(
            "INSERT INTO unmask_requests (round_index, attempt, survivors, dropped, "
            "survivor_hash, opened_ms, deadline_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                row.attempt,
                _ids_json(row.survivors),
                _ids_json(row.dropped),
                row.survivor_hash,
                row.opened_ms,
                row.deadline_ms,
            ),
        )

    def update_unmask_deadline(self, round_index: int, attempt: int, deadline_ms: int) -> None:
        """Move an unmask attempt's deadline (used when resuming after downtime)."""
        self._write(
            "UPDATE unmask_requests SET deadline_ms = ? WHERE round_index = ? AND attempt = ?",
            (deadline_ms, round_index, attempt),
        )

    def attestations(self, round_index: int, attempt: int) -> list[AttestationRow]:
        """Survivor attestations of an attempt, sorted by node id."""
        return [
            AttestationRow(r[0], r[1], r[2], bytes(r[3]), r[4])
            for r in self._read(
                "SELECT round_index, attempt, node_id, signature, received_ms FROM unmask_acks "
                "WHERE round_index = ? AND attempt = ? ORDER BY node_id",
                (round_index, attempt),
            )
        ]

    def add_attestation(self, row: AttestationRow) -> None:
        """Record a survivor's attestation."""
        self._write(
            "INSERT INTO unmask_acks (round_index, attempt, node_id, signature, received_ms) "
            "VALUES (?, ?, ?, ?, ?)",
            (row.round_index, row.attempt, row.node_id, row.signature, row.received_ms),
        )

    def corrections(self, round_index: int, attempt: int) -> list[CorrectionRow]:
        """Stored corrections of an attempt, sorted by node id."""
        return [
            CorrectionRow(r[0], r[1], r[2], bytes(r[3]), r[4], r[5], r[6])
            for r in self._read(
                "SELECT round_index, attempt, node_id, sha256, size, path, received_ms "
                "FROM unmask_corrections WHERE round_index = ? AND attempt = ? ORDER BY node_id",
                (round_index, attempt),
            )
        ]

    def add_correction(self, row: CorrectionRow) -> None:
        """Record a stored correction (its file must already be placed)."""
        self._write(
            "INSERT INTO unmask_corrections (round_index, attempt, node_id, sha256, size, path, "
            "received_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                row.attempt,
                row.node_id,
                row.sha256,
                row.size,
                row.path,
                row.received_ms,
            ),
        )

    def refusals(self, round_index: int, attempt: int) -> list[RefusalRow]:
        """Recorded refusals of an attempt."""
        return [
            RefusalRow(r[0], r[1], r[2], r[3], r[4])
            for r in self._read(
                "SELECT round_index, attempt, node_id, reason, received_ms FROM unmask_refusals "
                "WHERE round_index = ? AND attempt = ? ORDER BY node_id",
                (round_index, attempt),
            )
        ]

    def add_refusal(self, row: RefusalRow) -> None:
        """Record a survivor's refusal to unmask."""
        self._write(
            "INSERT INTO unmask_refusals (round_index, attempt, node_id, reason, received_ms) "
            "VALUES (?, ?, ?, ?, ?)",
            (row.round_index, row.attempt, row.node_id, row.reason, row.received_ms),
        )

    # ------------------------------------------------------------ payload files

    def new_payload(self) -> PayloadWriter:
        """A writer for one incoming payload (a temporary file in the payload directory)."""
        return PayloadWriter(self.payload_dir)

    def payload_path(self, name: str) -> Path:
        """Absolute path of a stored payload named in a row."""
        return self.payload_dir / name

    @staticmethod
    def upload_name(round_index: int, node_id: str, sha256: bytes) -> str:
        """Final file name of an upload."""
        return f"r{round_index:04d}-upload-{_name_tag(node_id)}-{sha256.hex()[:16]}.u64"

    @staticmethod
    def correction_name(round_index: int, attempt: int, node_id: str, sha256: bytes) -> str:
        """Final file name of an unmask correction."""
        return f"r{round_index:04d}-unmask{attempt}-{_name_tag(node_id)}-{sha256.hex()[:16]}.u64"

    @staticmethod
    def result_name(round_index: int, sha256: bytes) -> str:
        """Final file name of a round's aggregate."""
        return f"r{round_index:04d}-result-{sha256.hex()[:16]}.u64"

    def referenced_files(self) -> set[str]:
        """Names of every payload file some row refers to."""
        return {
            r[0]
            for r in self._read(
                "SELECT path FROM uploads UNION SELECT path FROM results "
                "UNION SELECT path FROM unmask_corrections"
            )
        }

    def recover(self) -> list[str]:
        """Delete temporary and unreferenced payload files; check referenced ones exist.

        Returns the names deleted. Raises StateFileError if a row names a file
        that is missing or has the wrong size (the state file and the payload
        directory do not belong together).
        """
        with self._lock:
            referenced = self.referenced_files()
            removed: list[str] = []
            for entry in sorted(self.payload_dir.iterdir()):
                if entry.name not in referenced:
                    entry.unlink()
                    removed.append(entry.name)
            sizes = self._read(
                "SELECT path, size FROM uploads UNION ALL SELECT path, size FROM results "
                "UNION ALL SELECT path, size FROM unmask_corrections"
            )
            for name, size in sizes:
                path = self.payload_dir / name
                if not path.is_file() or path.stat().st_size != size:
                    raise StateFileError(
                        f"payload file {path} named in {self.path} is missing or does not hold "
                        f"{size} bytes; the state file and its payload directory do not match."
                    )
            if removed:
                _fsync_dir(self.payload_dir)
            return removed

    # ------------------------------------------------------------ inspection

    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table plus the payload directory listing (name, size, sha256).

        Used by tests to show that a refused message changed nothing.
        """
        with self._lock:
            snapshot: dict[str, list[tuple[Any, ...]]] = {}
            for table in _TABLES:
                rows = self._db.execute(f"SELECT * FROM {table}").fetchall()
                snapshot[table] = sorted(rows, key=repr)
            files = []
            for entry in sorted(self.payload_dir.iterdir()):
                digest = hashlib.sha256(entry.read_bytes()).hexdigest()
                files.append((entry.name, entry.stat().st_size, digest))
            snapshot["payload_files"] = files
            return snapshot
