"""The state file's SQL schema, its version, and opening it: locking, pragmas, checks.

A coordinator owns its state file exclusively: :func:`open_state_database`
takes an ``flock`` on ``<state>.lock`` that the operating system releases when
the process ends, however it ends (``kill -9`` included), so a second
coordinator on the same file refuses to start. SQLite runs in WAL mode with
``synchronous=NORMAL`` (a commit survives the process's death at once, and
power loss once :meth:`~coordinator.store.Store.sync` has flushed the WAL,
which the server does before any reply leaves), and with foreign keys
enforced, so no row can name a round, node or request that does not exist.

The schema is created in one script and one transaction (a crash leaves an
empty file, not half a schema) and carries a version number; a file of any
other version is refused with a sentence saying what changed since, because
an older session cannot be finished by this coordinator (its uploads lack the
signed statements nodes require).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path

from coordinator.errors import EmptyStateFile, StateFileError

__all__ = ["SCHEMA_VERSION", "TABLES", "lock_path_for", "open_state_database"]

SCHEMA_VERSION = 5
# What each version added, for the sentence refusing an older state file.
_SCHEMA_CHANGES = {
    2: "uploads carry the node's signed upload statement",
    3: "uploads carry a self-mask commitment and sealed challenge contributions, unmask "
    "answers the self-mask seed and blinded aggregate-check tags",
    4: "sealed challenge contributions are signed, and the aggregate-check tags travel "
    "sealed and signed with the attestations instead of the unmask answers",
    5: "payload digests are BLAKE3-256 instead of SHA-256 (the columns named digest)",
}

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
    digest BLOB NOT NULL,
    size INTEGER NOT NULL,
    path TEXT NOT NULL UNIQUE,
    layout TEXT NOT NULL,
    fixed_point_bits INTEGER NOT NULL,
    received_ms INTEGER NOT NULL,
    statement_signature BLOB NOT NULL,
    self_mask_commitment BLOB NOT NULL,
    challenge TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (round_index, node_id)
);
CREATE TABLE results (
    round_index INTEGER PRIMARY KEY REFERENCES rounds (round_index),
    survivors TEXT NOT NULL,
    dropped TEXT NOT NULL,
    digest BLOB NOT NULL,
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
    tags TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (round_index, attempt, node_id),
    FOREIGN KEY (round_index, attempt) REFERENCES unmask_requests (round_index, attempt)
);
CREATE TABLE unmask_corrections (
    round_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    node_id TEXT NOT NULL REFERENCES roster (node_id),
    digest BLOB NOT NULL,
    size INTEGER NOT NULL,
    path TEXT UNIQUE,
    received_ms INTEGER NOT NULL,
    self_mask_seed BLOB NOT NULL,
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

TABLES = (
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


def lock_path_for(state_path: Path) -> Path:
    """The file a running coordinator keeps locked: ``state.sqlite`` → ``state.sqlite.lock``."""
    return state_path.with_name(state_path.name + ".lock")


def _lock_exclusively(state_path: Path) -> int:
    """Hold an exclusive lock on ``<state>.lock`` for as long as the process uses the state.

    Two coordinators on one state file would corrupt the session; the lock
    makes the second refuse to start. The operating system releases it when
    the process ends, however it ends (``kill -9`` included).
    """
    lock_path = lock_path_for(state_path)
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


def _make_private(path: Path) -> None:
    """Create ``path`` mode 0600 (or take an existing one to 0600), with its WAL and journal.

    The state holds every session key, upload statement and unmask answer. SQLite
    gives the ``-wal``, ``-shm`` and ``-journal`` files it creates the mode of
    the database file, so a private database keeps them private too; any left
    by an earlier, more open run are taken to 0600 as well.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm", "-journal"):
        companion = path.with_name(path.name + suffix)
        if companion.is_file() and not companion.is_symlink():
            os.chmod(companion, 0o600)


def open_state_database(path: Path, *, read_only: bool) -> tuple[sqlite3.Connection, int]:
    """The connection to the state file at ``path`` and the lock's descriptor (-1: none).

    Writable: creates the folder and the schema if needed and holds the
    exclusive lock. ``read_only``: opens an existing file for inspection only,
    without the lock (so it works beside a running coordinator), creating
    nothing. Raises StateFileError for a file that is locked, missing (read
    only), not a state file, or of another schema version.
    """
    if read_only:
        if not path.is_file():
            raise StateFileError(f"state file {path} does not exist.")
        owner = -1
        db = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        owner = _lock_exclusively(path)
        _make_private(path)
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        if not read_only:
            db.execute("PRAGMA journal_mode=WAL")
            # Commits are made durable in groups (Store.sync), not one by one.
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
        _ensure_schema(db, path, read_only=read_only)
    except sqlite3.DatabaseError as exc:
        db.close()
        if owner >= 0:
            os.close(owner)
        raise StateFileError(f"state file {path} cannot be opened: {exc}.") from None
    except BaseException:
        db.close()
        if owner >= 0:
            os.close(owner)
        raise
    return db, owner


def _ensure_schema(db: sqlite3.Connection, path: Path, *, read_only: bool) -> None:
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables and read_only:
        raise EmptyStateFile(f"state file {path} holds no session yet.")
    if not tables:
        # One script, one transaction: a crash here leaves an empty file, not half a schema.
        db.executescript(
            "BEGIN IMMEDIATE;"
            + _SCHEMA
            + f"INSERT INTO schema_version (version) VALUES ({SCHEMA_VERSION});COMMIT;"
        )
        return
    if "schema_version" not in tables:
        raise StateFileError(f"state file {path} is not a zerosum coordinator state file.")
    row = db.execute("SELECT version FROM schema_version").fetchone()
    if row is None or row[0] != SCHEMA_VERSION:
        found = None if row is None else row[0]
        if isinstance(found, int) and found < SCHEMA_VERSION:
            # Not migrated: the uploads of an older file have no signed
            # statements, and nodes refuse an aggregate without them.
            since = "; ".join(
                f"version {v}: {what}" for v, what in sorted(_SCHEMA_CHANGES.items()) if v > found
            )
            raise StateFileError(
                f"state file {path} has schema version {found}, written by an "
                f"earlier coordinator; this coordinator reads version {SCHEMA_VERSION} "
                f"({since}). Finish that session with the release that started it, or "
                "start a new session with a new --state path."
            )
        raise StateFileError(
            f"state file {path} has schema version {found}; this coordinator "
            f"reads version {SCHEMA_VERSION}."
        )
