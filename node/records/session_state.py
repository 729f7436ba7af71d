"""What a node keeps on disk so that a restart can rejoin the session it was in.

A node's X25519 session key (docs/design.md §4.1) is the one secret the
coordinator cannot replace: it has accepted exactly one signed public key per
node and session and refuses a second, and every pairwise seed
s_ij = HKDF(X25519(sk_i, pk_j), …) is derived from it. A node that crashes —
``kill -9``, power loss, a TRE VM restart — can therefore only rejoin if the
private key survived. Two files in the node's private output folder OUT
(inside the TRE, never exported) hold what is needed:

``OUT/session.json``
    Format ``zerosum-node-session`` version 1: the session id, the node id,
    the federation config hash (hex), the ephemeral public key (hex), when the
    key was made and, once the model is written, when the session completed.
``OUT/session.key``
    The raw 32-byte X25519 private key (RFC 7748), mode 0600.

Because X25519 and Ed25519 (RFC 8032) are deterministic, the same private key
signed again with the same identity key gives the very same key bundle, which
the coordinator accepts as a rejoin; the pairwise seeds, and with them every
pairwise mask, come out bit for bit as before the crash.

The key is written before the node sends its join, atomically (temporary file,
fsync, rename: node/records/atomic.py). The temporary file comes from
``tempfile.mkstemp``, which creates it with ``O_CREAT | O_EXCL`` and mode 0600
whatever the umask, so the key is never readable by anyone else, not even
between creation and rename. It is deleted as soon as it has no use: when the
session completes at this node (model written) and when a different session
starts; temporary copies a crash left behind mid-write
(``OUT/.session.key.*.tmp``) go with it. A key file readable by other users
is refused on load, as ``ssh`` refuses such a private key.

``OUT/node.lock``
    Held with an exclusive ``flock`` by the one process running the node on
    OUT (:meth:`SessionStore.exclusive`). A second process on the same folder
    — the same command started twice, or a rerun while the first still
    lives — would overwrite the saved key, compute a second, differently
    noised release of the same round and lose privacy-ledger entries (each
    process rewrites the ledger from its own memory), so it is refused. The
    operating system drops the lock when the holder ends, however it ends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bounded.files import LocalFileError, read_limited_text
from bounded.nesting import NestingError, parse_json
from node.errors import SessionStateError
from node.records.atomic import (
    ExposedFileError,
    atomic_write_bytes,
    atomic_write_json,
    read_private_bytes,
)
from node.records.folder_lock import held_exclusively
from noise.keys import EphemeralKey, key_fingerprint

# The session record holds ids, hashes and keys: kilobytes.
_RECORD_BYTES = 16 << 20

__all__ = [
    "KEY_FILE",
    "LOCK_FILE",
    "SESSION_FILE",
    "SESSION_FORMAT",
    "SESSION_VERSION",
    "SessionRecord",
    "SessionStateError",
    "SessionStore",
]

SESSION_FORMAT = "zerosum-node-session"
SESSION_VERSION = 1
SESSION_FILE = "session.json"
KEY_FILE = "session.key"
LOCK_FILE = "node.lock"
KEY_MODE = 0o600
_KEY_BYTES = 32


@dataclass(frozen=True)
class SessionRecord:
    """The public facts of the session key this node saved (``OUT/session.json``)."""

    session_id: str
    node_id: str
    config_hash: bytes
    public_key: bytes
    created: str
    completed: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SESSION_FORMAT,
            "version": SESSION_VERSION,
            "session_id": self.session_id,
            "node_id": self.node_id,
            "config_hash": self.config_hash.hex(),
            "public_key": self.public_key.hex(),
            "created": self.created,
            "completed": self.completed,
        }

    @classmethod
    def from_json(cls, data: Any, where: Path) -> SessionRecord:
        if not isinstance(data, dict):
            raise SessionStateError(f"{where} must hold a JSON object; found {type(data).__name__}")
        if data.get("format") != SESSION_FORMAT or data.get("version") != SESSION_VERSION:
            raise SessionStateError(
                f"{where} is not a {SESSION_FORMAT} version {SESSION_VERSION} file "
                f"(format={data.get('format')!r}, version={data.get('version')!r})"
            )
        fields: dict[str, str] = {}
        for name in ("session_id", "node_id", "config_hash", "public_key", "created"):
            value = data.get(name)
            if not isinstance(value, str) or not value:
                raise SessionStateError(f"{where}: field {name!r} must be a non-empty string")
            fields[name] = value
        raw: dict[str, bytes] = {}
        for name in ("config_hash", "public_key"):
            try:
                raw[name] = bytes.fromhex(fields[name])
            except ValueError:
                raw[name] = b""
            if len(raw[name]) != 32:
                raise SessionStateError(
                    f"{where}: field {name!r} must be 64 hex digits; got {fields[name]!r}"
                )
        completed = data.get("completed", "")
        if not isinstance(completed, str):
            raise SessionStateError(f"{where}: field 'completed' must be a string")
        return cls(
            session_id=fields["session_id"],
            node_id=fields["node_id"],
            config_hash=raw["config_hash"],
            public_key=raw["public_key"],
            created=fields["created"],
            completed=completed,
        )


class SessionStore:
    """The saved session key of the node whose output folder is ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.record_path = self.out / SESSION_FILE
        self.key_path = self.out / KEY_FILE
        self.lock_path = self.out / LOCK_FILE

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold ``OUT/node.lock`` exclusively while the block runs (see the module docstring).

        Raises :class:`SessionStateError` naming the holder's process id when
        another process holds it. The lock file stays (removing it would let
        a third process lock a new file while the second still holds the old).
        """
        self.out.mkdir(parents=True, exist_ok=True)
        with held_exclusively(
            self.lock_path,
            lambda holder: (
                f"{self.out} is in use by another process running a node (process "
                f"{holder} holds {self.lock_path.name}); one output folder serves one "
                "running node: stop that process, or wait for it to end"
            ),
        ):
            yield

    def read(self) -> SessionRecord | None:
        """``session.json`` parsed and checked, or None when there is none."""
        try:
            text = read_limited_text(self.record_path, _RECORD_BYTES, what="session record")
        except FileNotFoundError:
            return None
        except LocalFileError as exc:
            raise SessionStateError(str(exc)) from None
        try:
            data = parse_json(text, what=f"session record {self.record_path}")
        except (json.JSONDecodeError, NestingError) as exc:
            raise SessionStateError(
                f"{self.record_path} is not valid JSON ({exc}); it records this node's session "
                "key — restore it, or remove it together with "
                f"{self.key_path.name} to start afresh in a new session"
            ) from exc
        return SessionRecord.from_json(data, self.record_path)

    def start(
        self, *, session_id: str, node_id: str, config_hash: bytes, key: EphemeralKey
    ) -> SessionRecord:
        """Save a fresh session key: first the key file (0600), then ``session.json``.

        In that order a crash leaves either no record (the key is made again)
        or a record whose key is on disk.
        """
        if len(config_hash) != 32:
            raise SessionStateError(
                f"config_hash must be a 32-byte SHA-256; got {len(config_hash)} bytes"
            )
        record = SessionRecord(
            session_id=session_id,
            node_id=node_id,
            config_hash=bytes(config_hash),
            public_key=key.public_bytes(),
            created=datetime.now(UTC).isoformat(),
        )
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.key_path, key.private_bytes(), mode=KEY_MODE)
        atomic_write_json(self.record_path, record.to_json())
        return record

    def resume(
        self, *, session_id: str, node_id: str, config_hash: bytes
    ) -> tuple[SessionRecord, EphemeralKey] | None:
        """The saved record and key for ``session_id``, or None when none is saved for it.

        None also for a record of another session, or one this node already
        completed (its key is gone). Raises :class:`SessionStateError` when the
        folder belongs to another node, when the record of this session names
        another federation config, or when its key file is missing, readable
        by others, malformed, or not the key the record names.
        """
        record = self.read()
        if record is None:
            return None
        if record.node_id != node_id:
            raise SessionStateError(
                f"{self.record_path} belongs to node {record.node_id!r}, not {node_id!r}; "
                "every node needs its own output folder (--out)"
            )
        if record.session_id != session_id or record.completed:
            return None
        if record.config_hash != config_hash:
            raise SessionStateError(
                f"{self.record_path} saved session {session_id} under the federation config "
                f"with hash {record.config_hash.hex()[:16]}…, but this node's config hashes to "
                f"{bytes(config_hash).hex()[:16]}…; was the federation file changed?"
            )
        return record, self._load_key(record)

    def _load_key(self, record: SessionRecord) -> EphemeralKey:
        shown = key_fingerprint(record.public_key)
        try:
            raw = read_private_bytes(self.key_path)
        except ExposedFileError as error:
            raise SessionStateError(
                f"{self.key_path} is accessible to other users (mode {error.mode:04o}); a session "
                f"key must be private to its owner: chmod 600 {self.key_path}"
            ) from None
        if raw is None:
            raise SessionStateError(
                f"{self.key_path} is missing, but {self.record_path} says this node joined "
                f"session {record.session_id} with key {shown}; without it the node cannot "
                "rejoin that session"
            )
        if len(raw) != _KEY_BYTES:
            raise SessionStateError(
                f"{self.key_path} must hold a raw {_KEY_BYTES}-byte X25519 private key; "
                f"it holds {len(raw)} bytes"
            )
        # Every 32-byte string is a valid X25519 private key (RFC 7748 clamps it).
        key = EphemeralKey.from_private_bytes(raw)
        if key.public_bytes() != record.public_key:
            raise SessionStateError(
                f"{self.key_path} holds key {key_fingerprint(key.public_bytes())}, not the key "
                f"{shown} that {self.record_path} names for session {record.session_id}"
            )
        return key

    def complete(self) -> None:
        """The session is over at this node: mark the record and delete the key."""
        record = self.read()
        if record is not None and not record.completed:
            done = replace(record, completed=datetime.now(UTC).isoformat())
            atomic_write_json(self.record_path, done.to_json())
        self.discard_key()

    def discard_key(self) -> None:
        """Delete the saved private key and any half-written copy (a no-op when there is none).

        ``node.records.atomic`` writes the key to ``.session.key.<random>.tmp`` first;
        a process killed before the rename leaves that file, a private key
        like the other, behind.
        """
        self.key_path.unlink(missing_ok=True)
        for leftover in self.out.glob(f".{KEY_FILE}.*.tmp"):
            leftover.unlink(missing_ok=True)
