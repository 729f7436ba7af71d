"""A digest of everything the coordinator keeps: its SQLite rows and its state folder's files.

A refused message must change nothing the coordinator stores. This digest is
taken from outside the coordinator (its own read-only SQLite connection and
the file system), so it also sees a change the coordinator's code would not
report about itself: a stray payload file, a half-written row, a table the
schema grew.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

__all__ = ["integrity_ok", "state_digest"]

# SQLite's own journal files change with checkpoints, not with the state.
_JOURNAL_SUFFIXES = ("-wal", "-shm", "-journal")


def _rows_digest(database: Path, digest: hashlib._Hash) -> None:
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5.0)
    try:
        tables = [
            name
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        for table in tables:
            digest.update(f"table {table}\n".encode())
            rows = db.execute(f'SELECT * FROM "{table}"').fetchall()
            for row in sorted(repr(r) for r in rows):
                digest.update(row.encode())
                digest.update(b"\n")
    finally:
        db.close()


def state_digest(state: Path) -> str:
    """SHA-256 hex over the rows of every table of ``state`` and every other file beside it.

    ``state`` is the coordinator's SQLite file; its folder (payload files
    included, recursively) is its state folder. Rows are sorted, so the
    digest does not depend on SQLite's storage order.
    """
    digest = hashlib.sha256()
    _rows_digest(state, digest)
    folder = state.parent
    for path in sorted(folder.rglob("*")):
        if path == state or (
            path.name.startswith(state.name) and path.name.endswith(_JOURNAL_SUFFIXES)
        ):
            continue
        relative = path.relative_to(folder).as_posix()
        if path.is_dir():
            digest.update(f"dir {relative}\n".encode())
        elif path.is_file():
            digest.update(f"file {relative} ".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def integrity_ok(state: Path) -> str:
    """SQLite's ``PRAGMA integrity_check`` answer for ``state`` ('ok' when sound)."""
    db = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=5.0)
    try:
        return "; ".join(str(row[0]) for row in db.execute("PRAGMA integrity_check"))
    finally:
        db.close()
