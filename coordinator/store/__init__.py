"""The coordinator's durable state: one SQLite file plus a directory of payload files.

``from coordinator.store import Store`` is all most code needs. The package
owns one idea per module: the SQL schema, its version and opening the file
under an exclusive lock (``schema``); the rows as dataclasses and their column
encodings (``rows``); payload files, their names and crash recovery
(``payloads``); the typed queries and writes, each inside one transaction
(``state``).
"""

from __future__ import annotations

from coordinator.store.payloads import PayloadWriter, payload_dir_for
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
)
from coordinator.store.schema import SCHEMA_VERSION, lock_path_for
from coordinator.store.state import Store

__all__ = [
    "ROUND_STATUSES",
    "SCHEMA_VERSION",
    "SESSION_STATES",
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
    "lock_path_for",
    "payload_dir_for",
]
