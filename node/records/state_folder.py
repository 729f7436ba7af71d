"""The node's state folder: its one privacy ledger and the record of its sessions.

A node's output folder OUT holds one session (``--out``, made afresh as an
operator likes); what must outlive it lives in the state folder STATE
(``zerosum node --state``, by default the federation folder's
``nodes/<id>/state/``, inside the TRE, never exported):

``STATE/ledger.json``
    The node's privacy ledger (``node.records.ledger``) over every session it has
    taken part in, so that ``privacy.epsilon_budget`` caps what the data have
    disclosed in total, not per session.
``STATE/sessions.json``
    Format ``zerosum-node-sessions`` version 1: per session this node has
    taken part in, the session id, the federation config hash, the public
    session key it joined with, its OUT folder, when it joined, when the
    record last changed, how far it got (``joined``, ``released``,
    ``completed`` or ``failed``), the round indices it released, for a
    failure why, and the roster it verified (node id → session key); and
    (``imported``) the sessions whose ledger entries came from an older
    ledger in OUT with no record of their own.
``STATE/last-failure.json``
    Why the node last stopped without completing a session, when, and in
    which session (if it had one yet): the one sentence it printed, so that
    ``zerosum node --status`` can say it later, also for a failure before
    joining (a TLS mismatch, an unreachable coordinator).
``STATE/node.lock``
    Held with an exclusive ``flock`` by the one process running the node on
    this state folder (two processes would each rewrite the ledger from
    their own memory and lose entries).

Both files are written atomically (``node.records.atomic``), and *before* the act
they record: a session's record before its key is sent, a release before its
bytes leave (``node.session.egress_steps``).

**Replay.** A session id names one run of the protocol. A coordinator that
presents an id this node already holds a record of (or ledger entries for) is
replaying that session: a node that joined it anew would release the same
data again under fresh noise. :meth:`NodeState.check_not_replayed` refuses
such a session unless this node is resuming it from its own saved state, the
session key in OUT (``node.records.session_state``) whose public key is the one
recorded here; a completed session is refused always.

**One story.** The ledger and the session list are checked against each
other before the node joins (:meth:`NodeState.check_records`): a round the
list records as released must have its release in the ledger, and a session
the ledger holds entries of must be in the list, each release among its
released rounds. A ledger missing or older than the list would restart the
ε budget below what was spent; a list missing or older than the ledger
would let a replayed session through; either stops the node with a
sentence. Only the ledger's latest release missing from the list (a stop
between the two writes, the ledger written first) is repaired.

**Import.** A ledger this node kept in OUT before it had a state folder
(``OUT/ledger.json``, ledger version 1 or 2) is read, and every entry of it the
state ledger lacks is added once (:meth:`NodeState.open_ledger`); entries are
compared whole, so the copy this module keeps in OUT adds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from bounded.files import LocalFileError, read_limited_text
from bounded.nesting import NestingError, parse_json
from node.errors import SessionFailed, SessionStateError
from node.records.atomic import atomic_write_json
from node.records.folder_lock import held_exclusively
from node.records.ledger import LedgerError, PrivacyLedger
from noise.keys import key_fingerprint

# One entry of a few hundred bytes per session this node took part in.
_SESSIONS_BYTES = 64 << 20

__all__ = [
    "FAILURE_FILE",
    "LEDGER_FILE",
    "LOCK_FILE",
    "SESSIONS_FILE",
    "SESSIONS_FORMAT",
    "SESSIONS_VERSION",
    "NodeState",
    "SessionEntry",
    "Stage",
]

SESSIONS_FORMAT = "zerosum-node-sessions"
SESSIONS_VERSION = 1
LEDGER_FILE = "ledger.json"
SESSIONS_FILE = "sessions.json"
LOCK_FILE = "node.lock"
FAILURE_FILE = "last-failure.json"
FAILURE_FORMAT = "zerosum-node-last-failure"

Stage = Literal["joined", "released", "completed", "failed"]
_STAGES: tuple[str, ...] = get_args(Stage)


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class SessionEntry:
    """One session this node has taken part in (a row of ``STATE/sessions.json``)."""

    session_id: str
    config_hash: str  # hex
    public_key: str  # hex, the X25519 session key this node joined with
    out: str
    joined: str
    updated: str
    stage: Stage
    released: tuple[int, ...] = ()
    reason: str = ""
    # node id -> hex X25519 session key of the roster this node verified (once final).
    roster: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"roster": dict(sorted(self.roster.items()))} if self.roster else {}
        return {
            "session_id": self.session_id,
            "config_hash": self.config_hash,
            "public_key": self.public_key,
            "out": self.out,
            "joined": self.joined,
            "updated": self.updated,
            "stage": self.stage,
            "released": list(self.released),
            "reason": self.reason,
            **extra,
        }

    @classmethod
    def from_json(cls, data: Any, where: Path) -> SessionEntry:
        if not isinstance(data, dict):
            raise SessionStateError(f"{where}: every session must be a JSON object; got {data!r}")
        fields: dict[str, str] = {}
        for name in ("session_id", "config_hash", "public_key", "out", "joined", "updated"):
            value = data.get(name)
            if not isinstance(value, str) or not value:
                raise SessionStateError(
                    f"{where}: field {name!r} of a session must be a non-empty string; "
                    f"got {value!r}"
                )
            fields[name] = value
        stage = data.get("stage")
        if stage not in _STAGES:
            raise SessionStateError(
                f"{where}: session {fields['session_id']} has stage {stage!r}, not one of "
                f"{', '.join(_STAGES)}"
            )
        released = data.get("released", [])
        if not isinstance(released, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in released
        ):
            raise SessionStateError(
                f"{where}: session {fields['session_id']} field 'released' must be a list of "
                f"round indices; got {released!r}"
            )
        reason = data.get("reason", "")
        if not isinstance(reason, str):
            raise SessionStateError(f"{where}: field 'reason' must be a string; got {reason!r}")
        roster = data.get("roster", {})
        if not isinstance(roster, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in roster.items()
        ):
            raise SessionStateError(
                f"{where}: session {fields['session_id']} field 'roster' must map node ids to "
                f"64 hex digits; got {roster!r}"
            )
        return cls(
            stage=stage,
            released=tuple(released),
            reason=reason,
            roster=dict(roster),
            **fields,
        )

    def progress(self) -> str:
        """How far this node got, as words ("released round 0; completed 2026-…")."""
        parts = []
        if self.released:
            rounds = ", ".join(str(r) for r in self.released)
            parts.append(f"released round{'s' if len(self.released) > 1 else ''} {rounds}")
        if self.stage == "completed":
            parts.append(f"completed {self.updated}")
        elif self.stage == "failed":
            parts.append(f"stopped {self.updated}: {self.reason or 'no reason recorded'}")
        elif not self.released:
            parts.append("joined, released nothing")
        return "; ".join(parts)


class NodeState:
    """The state folder of node ``node_id`` (see the module docstring)."""

    def __init__(self, folder: Path, node_id: str) -> None:
        self.folder = Path(folder)
        self.node_id = node_id
        self.ledger_path = self.folder / LEDGER_FILE
        self.sessions_path = self.folder / SESSIONS_FILE
        self.lock_path = self.folder / LOCK_FILE
        self.failure_path = self.folder / FAILURE_FILE

    # -- the lock -------------------------------------------------------

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold ``STATE/node.lock`` exclusively while the block runs.

        Raises :class:`SessionStateError` naming the holder's process id when
        another process holds it. The operating system drops the lock when the
        holder ends, however it ends; the file stays.
        """
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with held_exclusively(
            self.lock_path,
            lambda holder: (
                f"the state folder {self.folder} is in use by another process running "
                f"node {self.node_id!r} (process {holder} holds {self.lock_path.name}); "
                "one state folder serves one running node, as it holds the node's one "
                "privacy ledger: stop that process, or wait for it to end"
            ),
        ):
            yield

    # -- the last failure -----------------------------------------------

    def record_failure(self, reason: str, session_id: str = "") -> None:
        """Record why the node stopped (``session_id`` empty before it joined one)."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_json(
            self.failure_path,
            {
                "format": FAILURE_FORMAT,
                "version": 1,
                "node_id": self.node_id,
                "time": _now(),
                "session_id": session_id,
                "reason": reason[:1000],
            },
        )

    def last_failure(self) -> dict[str, str] | None:
        """The latest failure recorded here or in a session's record; None when none is."""
        found: list[dict[str, str]] = [
            {"time": e.updated, "session_id": e.session_id, "reason": e.reason}
            for e in self.sessions()
            if e.stage == "failed"
        ]
        try:
            text = read_limited_text(self.failure_path, 64 << 10, what="last failure")
            data = parse_json(text, what=f"last failure {self.failure_path}")
        except FileNotFoundError:
            data = None
        except (LocalFileError, json.JSONDecodeError, NestingError) as exc:
            raise SessionStateError(f"{self.failure_path} cannot be read: {exc}") from None
        if isinstance(data, dict) and data.get("format") == FAILURE_FORMAT:
            fields = {k: data.get(k) for k in ("time", "session_id", "reason")}
            if all(isinstance(v, str) for v in fields.values()):
                found.append({k: str(v) for k, v in fields.items()})
        return max(found, key=lambda f: f["time"]) if found else None

    # -- the ledger -----------------------------------------------------

    def open_ledger(self, delta: float, out: Path, say: Callable[[str], None]) -> PrivacyLedger:
        """The node's ledger, with any older ``OUT/ledger.json`` imported; copied to OUT.

        Raises :class:`SessionStateError` for a ledger that cannot be read
        (malformed, another node's, an unknown version): nothing is imported
        then, and the node does not start.
        """
        copy = Path(out) / LEDGER_FILE
        try:
            ledger = PrivacyLedger.open(self.ledger_path, self.node_id, delta, copies=(copy,))
        except LedgerError as error:
            raise SessionStateError(
                f"{error}; this is the node's privacy ledger across all its sessions, so the "
                "node does not start without it: restore it"
            ) from None
        if copy.exists() and copy.resolve() != self.ledger_path.resolve():
            try:
                older = PrivacyLedger.open(copy, self.node_id, delta)
            except LedgerError as error:
                raise SessionStateError(
                    f"{error}; it would be imported into {self.ledger_path}: repair it, or move "
                    "it away if it is not this node's ledger"
                ) from None
            fresh = not self.ledger_path.exists()
            added = ledger.merge(older)
            if added:
                say(
                    f"imported {added} entr{'y' if added == 1 else 'ies'} of the privacy ledger "
                    f"{copy} into {self.ledger_path}"
                    + (" (the node's ledger across sessions from now on)" if fresh else "")
                )
                self._note_imported(older.session_ids())
        self.check_records(ledger, say)
        return ledger

    def _note_imported(self, session_ids: frozenset[str]) -> None:
        """Keep the sessions of an imported ledger the session list does not record."""
        entries, imported = self._document()
        unrecorded = session_ids - {e.session_id for e in entries} - imported
        if unrecorded:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._save(entries, imported | unrecorded)

    def check_records(self, ledger: PrivacyLedger, say: Callable[[str], None]) -> None:
        """Refuse (SessionStateError) a ledger and a session list that do not tell one story.

        Every round ``sessions.json`` records as released must have its
        release in the ledger: a ledger missing, or older than the session
        list (restored from a backup), would let the ε budget start again
        below what was spent. And every session the ledger holds entries of
        must be in the session list (or imported from an older ledger), each
        release among its released rounds: a session list missing or older
        than the ledger would let a replayed session through. One exception
        is repaired, not refused: the ledger's latest release alone missing
        from the session list is a crash between the two writes (the ledger
        is written first), and is added to the list.
        """
        entries, imported = self._document()
        where = (
            f"the privacy ledger {self.ledger_path}"
            if self.ledger_path.exists()
            else f"the privacy ledger {self.ledger_path} does not exist, and so"
        )
        for entry in entries:
            for index in entry.released:
                if not ledger.has_release(entry.session_id, index):
                    raise SessionStateError(
                        f"{self.sessions_path} records that this node released round {index} of "
                        f"session {entry.session_id} ({entry.progress()}), but {where} holds no "
                        "release of it: the ledger is missing or older than the session record "
                        "(restored from a backup?), and the ε budget would start again below "
                        "what this node has spent. The node does not start until the ledger is "
                        "restored. Nothing was sent"
                    )
        recorded = {e.session_id: e for e in entries}
        releases = [e for e in ledger.entries if e.kind == "release"]
        for found in ledger.entries:
            if found.session_id in recorded or found.session_id in imported:
                continue
            held = "holds no record of it" if self.sessions_path.exists() else "does not exist"
            raise SessionStateError(
                f"the privacy ledger {self.ledger_path} holds entries of session "
                f"{found.session_id}, but {self.sessions_path} {held}: the session list is "
                "missing or older than the ledger (restored from a backup?), and without it "
                "this node could not refuse that session presented again. The node does not "
                "start until the session list is restored. Nothing was sent"
            )
        for position, found in enumerate(releases):
            listed = recorded.get(found.session_id)
            if listed is None or found.round_index in listed.released:
                continue
            if position == len(releases) - 1:
                say(
                    f"{self.sessions_path} lacked the release of round {found.round_index} of "
                    f"session {found.session_id} that the ledger records (the node stopped "
                    "between the two writes); recorded now"
                )
                self.record_release(found.session_id, found.round_index)
                continue
            raise SessionStateError(
                f"the privacy ledger {self.ledger_path} records the release of round "
                f"{found.round_index} of session {found.session_id}, but {self.sessions_path} "
                f"does not ({listed.progress()}): the session list is older than the ledger "
                "(restored from a backup?). The node does not start until it is restored. "
                "Nothing was sent"
            )

    # -- the sessions ---------------------------------------------------

    def sessions(self) -> tuple[SessionEntry, ...]:
        """Every session recorded in ``STATE/sessions.json`` (none when it does not exist)."""
        return self._document()[0]

    def imported_sessions(self) -> frozenset[str]:
        """Sessions whose ledger entries were imported from an older OUT ledger, unrecorded."""
        return self._document()[1]

    def _document(self) -> tuple[tuple[SessionEntry, ...], frozenset[str]]:
        try:
            text = read_limited_text(self.sessions_path, _SESSIONS_BYTES, what="session list")
        except FileNotFoundError:
            return (), frozenset()
        except LocalFileError as exc:
            raise SessionStateError(str(exc)) from None
        try:
            data = parse_json(text, what=f"session list {self.sessions_path}")
        except (json.JSONDecodeError, NestingError) as exc:
            raise SessionStateError(
                f"{self.sessions_path} is not valid JSON ({exc}); it records every session this "
                "node has taken part in, which it needs to refuse a replayed one: restore it"
            ) from None
        if (
            not isinstance(data, dict)
            or data.get("format") != SESSIONS_FORMAT
            or data.get("version") != SESSIONS_VERSION
        ):
            found = (data.get("format"), data.get("version")) if isinstance(data, dict) else data
            raise SessionStateError(
                f"{self.sessions_path} is not a {SESSIONS_FORMAT} version {SESSIONS_VERSION} "
                f"file (found {found!r})"
            )
        if data.get("node_id") != self.node_id:
            raise SessionStateError(
                f"{self.sessions_path} belongs to node {data.get('node_id')!r}, not "
                f"{self.node_id!r}; every node needs its own state folder (--state)"
            )
        rows = data.get("sessions")
        if not isinstance(rows, list):
            raise SessionStateError(f"{self.sessions_path}: 'sessions' must be a list")
        imported = data.get("imported", [])
        if not isinstance(imported, list) or not all(isinstance(i, str) for i in imported):
            raise SessionStateError(
                f"{self.sessions_path}: 'imported' must be a list of session ids; got {imported!r}"
            )
        entries = tuple(SessionEntry.from_json(row, self.sessions_path) for row in rows)
        return entries, frozenset(imported)

    def entry(self, session_id: str) -> SessionEntry | None:
        for found in self.sessions():
            if found.session_id == session_id:
                return found
        return None

    def _save(
        self, entries: tuple[SessionEntry, ...], imported: frozenset[str] | None = None
    ) -> None:
        if imported is None:
            imported = self.imported_sessions()
        document: dict[str, Any] = {
            "format": SESSIONS_FORMAT,
            "version": SESSIONS_VERSION,
            "node_id": self.node_id,
            "sessions": [e.to_json() for e in entries],
        }
        if imported:
            document["imported"] = sorted(imported)
        atomic_write_json(self.sessions_path, document)

    def _update(self, session_id: str, change: Callable[[SessionEntry], SessionEntry]) -> None:
        entries = self.sessions()
        if not any(e.session_id == session_id for e in entries):
            raise SessionStateError(
                f"{self.sessions_path} holds no record of session {session_id} to update"
            )
        self._save(tuple(change(e) if e.session_id == session_id else e for e in entries))

    def check_not_replayed(
        self,
        session_id: str,
        *,
        saved_public_key: bytes | None,
        ledger: PrivacyLedger,
        out: Path,
    ) -> bool:
        """Refuse (SessionFailed) a session id this node has taken part in, unless resuming it.

        ``saved_public_key`` is the public key of the session key OUT holds
        for ``session_id`` (None when it holds none). Returns True when the
        session is recorded here and is being resumed.
        """
        found = self.entry(session_id)
        replay = (
            "a coordinator that presents a session id again is replaying that session, "
            "and joining it anew would release the same data a second time under fresh noise"
        )
        if found is not None:
            when = f"this node took part in it from {found.joined} ({found.progress()})"
            if found.stage == "completed":
                raise SessionFailed(
                    f"refusing session {session_id}: {when}; a completed session is never "
                    f"taken part in again: {replay}. Nothing was sent"
                )
            if saved_public_key is not None and saved_public_key.hex() == found.public_key:
                return True
            held = (
                "holds no saved session key for it"
                if saved_public_key is None
                else f"holds another session key ({key_fingerprint(saved_public_key)})"
            )
            raise SessionFailed(
                f"refusing session {session_id}: {when} with session key "
                f"{key_fingerprint(bytes.fromhex(found.public_key))}, and {out} {held}. "
                f"Only a resume from this node's own saved session key (in {found.out}) may go "
                f"on with it; otherwise {replay}. Nothing was sent"
            )
        if session_id in ledger.session_ids() and saved_public_key is None:
            raise SessionFailed(
                f"refusing session {session_id}: the privacy ledger {ledger.path} already holds "
                f"entries of it, and {out} holds no saved session key for it; {replay}. "
                "Nothing was sent"
            )
        return False

    def record_join(
        self, *, session_id: str, config_hash: bytes, public_key: bytes, out: Path
    ) -> SessionEntry:
        """Record that this node joins ``session_id`` with ``public_key`` (before it is sent).

        A session recorded already (a resume) keeps its record.
        """
        entries = self.sessions()
        for found in entries:
            if found.session_id == session_id:
                return found
        now = _now()
        entry = SessionEntry(
            session_id=session_id,
            config_hash=bytes(config_hash).hex(),
            public_key=bytes(public_key).hex(),
            out=str(Path(out).resolve()),
            joined=now,
            updated=now,
            stage="joined",
        )
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._save((*entries, entry))
        return entry

    def record_release(self, session_id: str, round_index: int) -> None:
        """Record that this node releases round ``round_index`` (before its bytes leave)."""

        def change(entry: SessionEntry) -> SessionEntry:
            released = tuple(sorted({*entry.released, round_index}))
            stage: Stage = "released" if entry.stage in ("joined", "failed") else entry.stage
            return replace(entry, released=released, stage=stage, updated=_now(), reason="")

        found = self.entry(session_id)
        if found is not None and round_index in found.released and found.stage == "released":
            return
        self._update(session_id, change)

    def record_roster(self, session_id: str, public_keys: Mapping[str, bytes]) -> None:
        """Record the roster this node verified for ``session_id`` (once, before it uploads)."""
        roster = {node: bytes(key).hex() for node, key in sorted(public_keys.items())}
        self._update(session_id, lambda e: replace(e, roster=roster, updated=_now()))

    def record_end(self, session_id: str, stage: Stage, reason: str = "") -> None:
        """Record that the session completed or failed at this node (``reason`` for a failure)."""
        if stage not in ("completed", "failed"):
            raise ValueError(f"a session ends 'completed' or 'failed', not {stage!r}")
        found = self.entry(session_id)
        if found is None or found.stage == "completed":
            return
        self._update(
            session_id,
            lambda e: replace(e, stage=stage, updated=_now(), reason=reason[:1000]),
        )
