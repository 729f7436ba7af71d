"""The coordinator's durable state: typed reads and writes of one SQLite file and its payloads.

The state file holds the session (id, config hash, state, reason), the roster
of signed ephemeral keys, every round with its status and deadline, the
uploads with their signed upload statements, results, unmask requests,
survivor attestations, corrections and refusals (coordinator/store/schema.py);
payload files sit in a directory beside it (coordinator/store/payloads.py).

Crash safety (a ``kill -9`` at any instant leaves a consistent state): every
write happens inside :meth:`Store.transaction`, and every state transition of
the session is exactly one such transaction; a payload file is durably in
place before the row that names it is inserted, and :meth:`Store.recover`
deletes whatever no row names.

Durability is grouped (group commit). A transaction commits with
``synchronous=NORMAL``: its WAL frames are written to the operating system,
which keeps them whatever happens to the process, but not flushed to disk.
:meth:`Store.sync` flushes the WAL once for every commit made so far; the
server calls it before any reply leaves (coordinator/server.py), so nothing a
node is told rests on a commit that power loss could undo, and concurrent
calls share one flush instead of paying one each under the session lock.

Typed reads are remembered until the next write to their table. Every step
and every result poll reads the session, the round and its uploads again,
and turning rows back into layouts and sealed items was most of a poll's
work; this process is the file's only writer, so a read stays true until
this store writes to the table it read, and every write forgets the reads of
its table (a rollback forgets them all). The JSON columns of upload and
attestation rows are decoded once per stored text, so reading a round's
rows again after one more was added decodes only the new one (for the
newest two rounds): at K nodes a round re-read its K rows of K − 1 sealed
copies at each of about 4K commits, K^3 copies decoded a round. A store
opened read-only (beside a running coordinator) remembers nothing.

Each setter writes named columns with typed arguments; the session's state
and a round's status are written only by the status changes of
coordinator/transitions.py, so those are the one place to read which changes
exist.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from coordinator.store.payloads import (
    PayloadWriter,
    correction_name,
    payload_dir_for,
    remove_unreferenced,
    result_name,
    upload_name,
)
from coordinator.store.rows import (
    ROUND_STATUSES,
    SESSION_STATES,
    AttestationRow,
    CorrectionRow,
    MemberRow,
    RefusalRow,
    ResultRow,
    RoundRow,
    SessionRow,
    UnmaskRow,
    UploadRow,
    ids_from_json,
    ids_json,
    layout_from_json,
    layout_json,
)
from coordinator.store.schema import TABLES, open_state_database
from noise.layout import Layout

__all__ = ["Store"]

_Read = TypeVar("_Read", bound=Callable[..., Any])


def _remembered(table: str) -> Callable[[_Read], _Read]:
    """A typed read of ``table``, answered from memory until the store next writes to it.

    Rows are frozen dataclasses; a list or set is copied on the way out, so a
    caller that changes what it got changes nothing remembered. A write forgets
    the reads of its own table only (:func:`_written_table`), so a round's
    uploads stay remembered across its deliveries, answers and status changes;
    a rollback forgets everything.
    """

    def remember(read: _Read) -> _Read:
        name = read.__name__

        @functools.wraps(read)
        def remembered(self: Store, *args: Any) -> Any:
            if self.read_only:
                return read(self, *args)
            key = (name, *args)
            with self._lock:
                reads = self._memo.setdefault(table, {})
                try:
                    value = reads[key]
                except KeyError:
                    value = reads[key] = read(self, *args)
            if isinstance(value, list | set):
                return value.copy()
            return value

        return remembered  # type: ignore[return-value]

    return remember


_WRITE = re.compile(
    r"\s*(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|REPLACE\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)",
    re.IGNORECASE,
)


def _written_table(sql: str) -> str | None:
    """The table an INSERT, UPDATE or DELETE statement writes; None for anything else."""
    found = _WRITE.match(sql)
    return found.group(1).lower() if found else None


_Column = TypeVar("_Column")
# Rounds whose rows' decoded JSON columns a store keeps (Store._decoded): the one
# under way and the one before it, whose result nodes may still be reading.
_DECODED_ROUNDS = 2


def _sealed_to_json(items: Sequence[tuple[str, bytes, bytes]]) -> str:
    """(recipient, sealed, signature) triples as stored: a JSON list of [id, hex, hex]."""
    return json.dumps([[n, sealed.hex(), signature.hex()] for n, sealed, signature in items])


def _sealed_from_json(text: str) -> tuple[tuple[str, bytes, bytes], ...]:
    return tuple((str(n), bytes.fromhex(s), bytes.fromhex(g)) for n, s, g in json.loads(text))


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
        self._memo: dict[str, dict[tuple[Any, ...], Any]] = {}  # table -> read -> value
        # Decoded JSON columns by round, then by their stored text (see _decoded).
        self._decoded_rounds: dict[int, dict[tuple[str, str], Any]] = {}
        self.read_only = read_only
        self._db, self._owner = open_state_database(self.path, read_only=read_only)
        # Group commit (see the module docstring): commits made, commits flushed.
        self._committed = 0
        self._synced = 0
        self._sync_lock = threading.Lock()
        self._wal_fd = -1
        if not read_only:
            self.payload_dir.mkdir(exist_ok=True)

    def close(self) -> None:
        """Flush the WAL, close the connection and release the state file for another process."""
        self.sync()
        with self._sync_lock, self._lock:
            self._db.close()
            if self._wal_fd >= 0:
                os.close(self._wal_fd)
                self._wal_fd = -1
            if self._owner >= 0:
                os.close(self._owner)
                self._owner = -1

    def sync(self) -> None:
        """Make every transaction committed so far durable against power loss.

        One ``fsync`` of the WAL file covers all the commits written before
        it (SQLite appends each commit's frames to the WAL, and
        ``synchronous=NORMAL`` only leaves out that flush: sqlite.org/wal.html);
        a caller whose commits an earlier flush already covered returns at
        once, and one that arrives during a flush waits for the next, which
        also covers whoever arrived meanwhile. Neither lock of the session is
        held during the flush.
        """
        if self.read_only:
            return
        with self._lock:
            wanted = self._committed
        if self._synced >= wanted:
            return
        with self._sync_lock:
            if self._synced >= wanted:
                return  # a flush that started after our commit covered it
            with self._lock:
                covered = self._committed
            os.fsync(self._wal_descriptor())
            self._synced = covered

    def _wal_descriptor(self) -> int:
        """A descriptor of the state file's WAL (the ``-wal`` file beside it), opened once.

        Should SQLite have kept its rollback journal (a file system without
        WAL support), the database file itself is what holds the commits.
        """
        wal = self.path.with_name(self.path.name + "-wal")
        if not wal.exists():
            wal = self.path
        if self._wal_fd >= 0 and os.fstat(self._wal_fd).st_ino == wal.stat().st_ino:
            return self._wal_fd
        if self._wal_fd >= 0:
            os.close(self._wal_fd)
        self._wal_fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
        return self._wal_fd

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
                self._memo.clear()  # a rollback undoes writes read back inside it
                raise
            else:
                self._db.execute("COMMIT")
                self._committed += 1
            finally:
                self._in_transaction = False

    @property
    def in_transaction(self) -> bool:
        """True inside :meth:`transaction` (status changes check it)."""
        return self._in_transaction

    def _write(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        if not self._in_transaction:
            raise RuntimeError("state writes must happen inside Store.transaction().")
        table = _written_table(sql)
        if table is None:
            self._memo.clear()
        else:
            self._memo.pop(table, None)
        return self._db.execute(sql, params)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, params).fetchall())

    def _decoded(
        self, round_index: int, kind: str, text: str, parse: Callable[[str], _Column]
    ) -> _Column:
        """``parse(text)`` for a row of round ``round_index``, kept by the stored text: a
        JSON column decodes to immutable values (tuples, frozen rows, a layout), and the
        same text always to the same.

        Each upload or attestation added forgets the remembered reads of its
        table, and the round's rows read after it would otherwise parse again
        every row's K − 1 sealed copies: K^3 copies decoded a round, where this
        decodes each row once. Only the newest :data:`_DECODED_ROUNDS` rounds are
        kept, so what it holds does not grow with the session.
        """
        key = (kind, text)
        with self._lock:
            rounds = self._decoded_rounds
            kept = rounds.get(round_index)
            if kept is None:
                kept = rounds[round_index] = {}
                while len(rounds) > _DECODED_ROUNDS:
                    del rounds[min(rounds)]  # perhaps this one: an old round is not kept
            try:
                value: _Column = kept[key]
            except KeyError:
                value = kept[key] = parse(text)
            return value

    # ------------------------------------------------------------ session

    @_remembered("session")
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

    def set_session_state(
        self, state: str, *, reason: str = "", ended_ms: int | None = None
    ) -> None:
        """Set the session's state with its reason and, once it has ended, when.

        Only the status changes of coordinator/transitions.py call this.
        """
        if state not in SESSION_STATES:
            raise ValueError(f"session state {state!r} is not one of {', '.join(SESSION_STATES)}.")
        self._write(
            "UPDATE session SET state = ?, reason = ?, ended_ms = ?", (state, reason, ended_ms)
        )

    def finalise_roster(self) -> None:
        """Mark the roster final: nobody else may join."""
        self._write("UPDATE session SET roster_final = 1")

    def set_roster_version(self, version: int) -> None:
        """Set the roster's version (the number of joins so far)."""
        self._write("UPDATE session SET roster_version = ?", (version,))

    def set_current_round(self, round_index: int) -> None:
        """Make ``round_index`` the session's current round."""
        self._write("UPDATE session SET current_round = ?", (round_index,))

    def set_join_deadline(self, deadline_ms: int) -> None:
        """Move the join deadline."""
        self._write("UPDATE session SET join_deadline_ms = ?", (deadline_ms,))

    # ------------------------------------------------------------ roster

    @_remembered("roster")
    def members(self) -> list[MemberRow]:
        """Every joined node, sorted by node id."""
        return [
            MemberRow(r[0], bytes(r[1]), bytes(r[2]), r[3], r[4], r[5], r[6])
            for r in self._read(
                "SELECT node_id, public_key, signature, joined_ms, status, dropped_round, "
                "dropped_reason FROM roster ORDER BY node_id"
            )
        ]

    @_remembered("roster")
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

    @_remembered("rounds")
    def rounds(self) -> list[RoundRow]:
        """Every round opened so far, in order."""
        return [
            self._round_row(r)
            for r in self._read(
                "SELECT round_index, name, status, participants, opened_ms, deadline_ms, layout, "
                "fixed_point_bits, unmask_attempt, reason FROM rounds ORDER BY round_index"
            )
        ]

    @_remembered("rounds")
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
            participants=ids_from_json(r[3]),
            opened_ms=r[4],
            deadline_ms=r[5],
            layout=None if r[6] is None else layout_from_json(r[6]),
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
        *,
        layout: Layout | None = None,
        fixed_point_bits: int | None = None,
    ) -> None:
        """Insert a new round in status 'open' with its public layout and scale."""
        self._write(
            "INSERT INTO rounds (round_index, name, status, participants, opened_ms, deadline_ms, "
            "layout, fixed_point_bits) VALUES (?, ?, 'open', ?, ?, ?, ?, ?)",
            (
                round_index,
                name,
                ids_json(participants),
                opened_ms,
                deadline_ms,
                None if layout is None else layout_json(layout),
                fixed_point_bits,
            ),
        )

    def set_round_status(self, round_index: int, status: str, reason: str) -> None:
        """Set a round's status and the sentence explaining it ('' for none).

        Only the status changes of coordinator/transitions.py call this.
        """
        if status not in ROUND_STATUSES:
            raise ValueError(f"round status {status!r} is not one of {', '.join(ROUND_STATUSES)}.")
        self._write(
            "UPDATE rounds SET status = ?, reason = ? WHERE round_index = ?",
            (status, reason, round_index),
        )

    def set_round_reason(self, round_index: int, reason: str) -> None:
        """Set the sentence shown with a round, leaving its status."""
        self._write("UPDATE rounds SET reason = ? WHERE round_index = ?", (reason, round_index))

    def set_unmask_attempt(self, round_index: int, attempt: int) -> None:
        """Name the unmask attempt a round is waiting for."""
        self._write(
            "UPDATE rounds SET unmask_attempt = ? WHERE round_index = ?", (attempt, round_index)
        )

    def set_round_deadline(self, round_index: int, deadline_ms: int) -> None:
        """Move a round's upload deadline."""
        self._write(
            "UPDATE rounds SET deadline_ms = ? WHERE round_index = ?", (deadline_ms, round_index)
        )

    # ------------------------------------------------------------ uploads

    @_remembered("uploads")
    def uploads(self, round_index: int) -> list[UploadRow]:
        """Stored uploads of a round, sorted by node id."""
        return [
            UploadRow(
                r[0],
                r[1],
                bytes(r[2]),
                r[3],
                r[4],
                self._decoded(r[0], "layout", r[5], layout_from_json),
                r[6],
                r[7],
                bytes(r[8]),
                bytes(r[9]),
                self._decoded(r[0], "sealed", r[10], _sealed_from_json),
            )
            for r in self._read(
                "SELECT round_index, node_id, digest, size, path, layout, fixed_point_bits, "
                "received_ms, statement_signature, self_mask_commitment, challenge FROM uploads "
                "WHERE round_index = ? ORDER BY node_id",
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
            "INSERT INTO uploads (round_index, node_id, digest, size, path, layout, "
            "fixed_point_bits, received_ms, statement_signature, self_mask_commitment, "
            "challenge) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                row.node_id,
                row.digest,
                row.size,
                row.path,
                layout_json(row.layout),
                row.fixed_point_bits,
                row.received_ms,
                row.statement_signature,
                row.self_mask_commitment,
                _sealed_to_json(row.challenge),
            ),
        )

    # ------------------------------------------------------------ results

    @_remembered("results")
    def result(self, round_index: int) -> ResultRow | None:
        """The stored result of a round, or None."""
        rows = self._read(
            "SELECT round_index, survivors, dropped, digest, size, path, computed_ms "
            "FROM results WHERE round_index = ?",
            (round_index,),
        )
        if not rows:
            return None
        r = rows[0]
        return ResultRow(
            r[0], ids_from_json(r[1]), ids_from_json(r[2]), bytes(r[3]), r[4], r[5], r[6]
        )

    def add_result(self, row: ResultRow) -> None:
        """Record a round's aggregate (its file must already be placed)."""
        self._write(
            "INSERT INTO results (round_index, survivors, dropped, digest, size, path, "
            "computed_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                ids_json(row.survivors),
                ids_json(row.dropped),
                row.digest,
                row.size,
                row.path,
                row.computed_ms,
            ),
        )

    @_remembered("deliveries")
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

    @_remembered("unmask_requests")
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
        return UnmaskRow(
            r[0], r[1], ids_from_json(r[2]), ids_from_json(r[3]), bytes(r[4]), r[5], r[6]
        )

    def add_unmask_request(self, row: UnmaskRow) -> None:
        """Record a new unmask attempt."""
        self._write(
            "INSERT INTO unmask_requests (round_index, attempt, survivors, dropped, "
            "survivor_hash, opened_ms, deadline_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                row.attempt,
                ids_json(row.survivors),
                ids_json(row.dropped),
                row.survivor_hash,
                row.opened_ms,
                row.deadline_ms,
            ),
        )

    def set_unmask_deadline(self, round_index: int, attempt: int, deadline_ms: int) -> None:
        """Move an unmask attempt's deadline (used when resuming after downtime)."""
        self._write(
            "UPDATE unmask_requests SET deadline_ms = ? WHERE round_index = ? AND attempt = ?",
            (deadline_ms, round_index, attempt),
        )

    @_remembered("unmask_acks")
    def attestations(self, round_index: int, attempt: int) -> list[AttestationRow]:
        """Survivor attestations of an attempt, sorted by node id."""
        return [
            AttestationRow(
                r[0],
                r[1],
                r[2],
                bytes(r[3]),
                r[4],
                self._decoded(r[0], "sealed", r[5], _sealed_from_json),
            )
            for r in self._read(
                "SELECT round_index, attempt, node_id, signature, received_ms, tags "
                "FROM unmask_acks "
                "WHERE round_index = ? AND attempt = ? ORDER BY node_id",
                (round_index, attempt),
            )
        ]

    def add_attestation(self, row: AttestationRow) -> None:
        """Record a survivor's attestation."""
        self._write(
            "INSERT INTO unmask_acks (round_index, attempt, node_id, signature, received_ms, "
            "tags) VALUES (?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                row.attempt,
                row.node_id,
                row.signature,
                row.received_ms,
                _sealed_to_json(row.tags),
            ),
        )

    @_remembered("unmask_corrections")
    def corrections(self, round_index: int, attempt: int) -> list[CorrectionRow]:
        """Stored corrections of an attempt, sorted by node id."""
        return [
            CorrectionRow(r[0], r[1], r[2], bytes(r[3]), r[4], r[5], r[6], bytes(r[7]))
            for r in self._read(
                "SELECT round_index, attempt, node_id, digest, size, path, received_ms, "
                "self_mask_seed FROM unmask_corrections "
                "WHERE round_index = ? AND attempt = ? ORDER BY node_id",
                (round_index, attempt),
            )
        ]

    def add_correction(self, row: CorrectionRow) -> None:
        """Record a stored correction (its file must already be placed)."""
        self._write(
            "INSERT INTO unmask_corrections (round_index, attempt, node_id, digest, size, path, "
            "received_ms, self_mask_seed) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                row.attempt,
                row.node_id,
                row.digest,
                row.size,
                row.path,
                row.received_ms,
                row.self_mask_seed,
            ),
        )

    @_remembered("unmask_refusals")
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
    def upload_name(round_index: int, node_id: str, digest: bytes) -> str:
        """Final file name of an upload."""
        return upload_name(round_index, node_id, digest)

    @staticmethod
    def correction_name(round_index: int, attempt: int, node_id: str, digest: bytes) -> str:
        """Final file name of an unmask correction."""
        return correction_name(round_index, attempt, node_id, digest)

    @staticmethod
    def result_name(round_index: int, digest: bytes) -> str:
        """Final file name of a round's aggregate."""
        return result_name(round_index, digest)

    def referenced_files(self) -> set[str]:
        """Names of every payload file some row refers to."""
        return {
            r[0]
            for r in self._read(
                "SELECT path FROM uploads UNION SELECT path FROM results "
                "UNION SELECT path FROM unmask_corrections WHERE path IS NOT NULL"
            )
        }

    def recover(self) -> list[str]:
        """Delete temporary and unreferenced payload files; check referenced ones exist.

        Returns the names deleted. Raises StateFileError if a row names a file
        that is missing or has the wrong size (the state file and the payload
        directory do not belong together).
        """
        with self._lock:
            sizes = self._read(
                "SELECT path, size FROM uploads UNION ALL SELECT path, size FROM results "
                "UNION ALL SELECT path, size FROM unmask_corrections WHERE path IS NOT NULL"
            )
            return remove_unreferenced(
                self.payload_dir, [(str(n), int(s)) for n, s in sizes], state_path=self.path
            )

    # ------------------------------------------------------------ inspection

    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table plus the payload directory listing (name, size, sha256).

        Used by tests to show that a refused message changed nothing.
        """
        with self._lock:
            snapshot: dict[str, list[tuple[Any, ...]]] = {}
            for table in TABLES:
                rows = self._db.execute(f"SELECT * FROM {table}").fetchall()
                snapshot[table] = sorted(rows, key=repr)
            files = []
            for entry in sorted(self.payload_dir.iterdir()):
                digest = hashlib.sha256(entry.read_bytes()).hexdigest()
                files.append((entry.name, entry.stat().st_size, digest))
            snapshot["payload_files"] = files
            return snapshot
