"""Crash-safe file writes: write a sibling temporary file, fsync, then rename.

A reader (a reviewer's tool, the approval gate, a restarted node) therefore
sees either the previous complete file or the new complete file, never a
half-written one: ``os.replace`` is atomic on POSIX file systems when source
and target sit in the same directory.

:func:`read_private_bytes` is the matching reader for secrets the node keeps
in its output folder (its session key, its CAPE material): it does not follow
a symbolic link and refuses a file that group or others may access.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from node.errors import ExposedFileError

__all__ = [
    "ExposedFileError",
    "HashingWriter",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "atomic_writer",
    "json_bytes",
    "read_private_bytes",
    "sha256_file",
]

# The node's private records (a session key, CAPE material) are kilobytes to
# megabytes; a larger one was not written by the node.
_PRIVATE_FILE_BYTES = 256 << 20


class HashingWriter:
    """A binary file that keeps the SHA-256 of everything written to it.

    A large file (an egress bundle's ``values.csv`` of millions of rows) is
    written piece by piece and its digest taken on the way, so neither the
    whole content nor a second reading of it is ever held in memory.
    """

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._digest = hashlib.sha256()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._digest.update(data)
        return self._handle.write(data)

    def hexdigest(self) -> str:
        """Hex SHA-256 of the bytes written so far."""
        return self._digest.hexdigest()


@contextmanager
def atomic_writer(path: Path, *, mode: int | None = None) -> Iterator[HashingWriter]:
    """Write ``path`` through a temporary sibling, renamed into place when the block ends.

    The block writes to the :class:`HashingWriter` it is given; an exception
    inside it leaves ``path`` as it was and removes the temporary file.
    Parent directories are created.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield HashingWriter(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # The rename is durable only once the directory entry itself is on disk.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (parent directories are created)."""
    with atomic_writer(path, mode=mode) as handle:
        handle.write(data)


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of the file at ``path``, read in blocks (never whole)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def atomic_write_text(path: Path, text: str, *, mode: int | None = None) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def json_bytes(document: Any) -> bytes:
    """The project's JSON file encoding: UTF-8, two-space indent, trailing newline."""
    return (json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode(
        "utf-8"
    )


def atomic_write_json(path: Path, document: Any, *, mode: int | None = None) -> bytes:
    """Replace ``path`` with ``document`` as JSON atomically; returns the bytes written."""
    data = json_bytes(document)
    atomic_write_bytes(path, data, mode=mode)
    return data


def read_private_bytes(path: Path) -> bytes | None:
    """The bytes of ``path``, or None when it does not exist.

    Symbolic links are not followed (OSError), and a file whose mode grants
    group or others any access raises :class:`ExposedFileError`: the mode is
    read from the open descriptor, so the check and the read see one file.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file; a private file of the node must be one")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise ExposedFileError(path, mode)
        data = handle.read(_PRIVATE_FILE_BYTES + 1)
        if len(data) > _PRIVATE_FILE_BYTES:
            raise OSError(
                f"{path} holds more than {_PRIVATE_FILE_BYTES} bytes; it is not the node's"
            )
        return data
