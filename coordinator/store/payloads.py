"""Payload files: raw uint64 files beside the state file, written so a crash leaves no doubt.

Payloads (uploads, corrections, results) live as raw little-endian uint64
files in ``<stem>.payloads/`` next to the SQLite file; a row names its file
and records its SHA-256 and size. A payload is written to a temporary
``.part-*`` name, fsynced, renamed to its final content-addressed name and
the directory fsynced, and only *then* is the row that refers to it inserted.
A ``kill -9`` before the insert leaves an unreferenced file, which
:func:`remove_unreferenced` deletes at the next start, as it deletes every
temporary file; the node's retry then stores it again.

Final names contain the round, the kind, the node and the first 16 hex digits
of the content's SHA-256, so a rename never replaces a file with different
content.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path

from coordinator.errors import StateFileError

__all__ = [
    "PayloadWriter",
    "correction_name",
    "fsync_dir",
    "payload_dir_for",
    "remove_unreferenced",
    "result_name",
    "upload_name",
]

_PART_PREFIX = ".part-"


def payload_dir_for(state_path: Path) -> Path:
    """The payload directory that belongs to a state file: ``state.sqlite`` → ``state.payloads``."""
    return state_path.with_name(state_path.stem + ".payloads")


def _name_tag(node_id: str) -> str:
    """A file-name-safe tag for a node id (the id itself when it is already safe)."""
    if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", node_id):
        return node_id
    return "x" + hashlib.sha256(node_id.encode("utf-8")).hexdigest()[:16]


def upload_name(round_index: int, node_id: str, sha256: bytes) -> str:
    """Final file name of an upload."""
    return f"r{round_index:04d}-upload-{_name_tag(node_id)}-{sha256.hex()[:16]}.u64"


def correction_name(round_index: int, attempt: int, node_id: str, sha256: bytes) -> str:
    """Final file name of an unmask correction."""
    return f"r{round_index:04d}-unmask{attempt}-{_name_tag(node_id)}-{sha256.hex()[:16]}.u64"


def result_name(round_index: int, sha256: bytes) -> str:
    """Final file name of a round's aggregate."""
    return f"r{round_index:04d}-result-{sha256.hex()[:16]}.u64"


def fsync_dir(directory: Path) -> None:
    """Make a rename or deletion in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

    def write(self, data: bytes | memoryview) -> None:
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

    def rename(self, final_name: str) -> Path:
        """fsync the file and rename it to ``final_name``; not yet durable (see :meth:`place`).

        Renaming it again to the same name does nothing more.
        """
        target = self.directory / final_name
        if self.placed == target:
            return target
        self.finish()
        os.replace(self.path, target)
        self.placed = target
        return target

    def place(self, final_name: str) -> Path:
        """Rename the finished file to ``final_name`` in the payload directory, durably."""
        target = self.rename(final_name)
        fsync_dir(self.directory)
        return target

    def discard(self) -> None:
        """Close and delete the temporary file (never a placed one)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.placed is None:
            self.path.unlink(missing_ok=True)


def remove_unreferenced(
    payload_dir: Path, sizes: Iterable[tuple[str, int]], *, state_path: Path
) -> list[str]:
    """Delete every file of ``payload_dir`` no row names; check the named ones exist.

    ``sizes`` are (file name, size) of every payload some row refers to.
    Returns the names deleted. Raises StateFileError if a row names a file
    that is missing or has the wrong size (the state file and the payload
    directory do not belong together).
    """
    expected = list(sizes)
    referenced = {name for name, _ in expected}
    removed: list[str] = []
    for entry in sorted(payload_dir.iterdir()):
        if entry.name not in referenced:
            entry.unlink()
            removed.append(entry.name)
    for name, size in expected:
        path = payload_dir / name
        if not path.is_file() or path.stat().st_size != size:
            raise StateFileError(
                f"payload file {path} named in {state_path} is missing or does not hold "
                f"{size} bytes; the state file and its payload directory do not match."
            )
    if removed:
        fsync_dir(payload_dir)
    return removed
