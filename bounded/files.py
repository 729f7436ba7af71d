"""Reading a local file that someone else may have put there: bounded, regular, or refused.

Nodes and the coordinator read files an operator supplies (the federation
config, keys, certificates, cohorts, models). Any of them may be replaced by a
symlink to ``/dev/zero``, a FIFO nobody writes to, or a file of gigabytes. A
plain ``read_bytes()`` would then grow memory until the process is killed, or
block forever. :func:`read_limited` opens without blocking, refuses anything
that is not a regular file, and reads at most ``limit`` bytes, each refusal a
:class:`LocalFileError` with one sentence naming the file; :func:`open_limited`
does the same for a file too large to hold in memory at once (a cohort table),
as a stream that stops at the limit.

A secret key (a node's identity key, a TLS private key, an output checker's
signing key) is read with :func:`read_secret`, which also refuses a file that
its group or other users may read or write: such a key may have been copied
already, and a process that used it anyway would hide that. The sentence says
which file, its mode and the ``chmod`` that fixes it.

This module imports only the standard library, so every package may use it.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO, Final

from bounded.errors import BoundedReadError

__all__ = [
    "GIB",
    "KIB",
    "MIB",
    "LocalFileError",
    "MissingFileError",
    "open_limited",
    "read_limited",
    "read_limited_text",
    "read_secret",
]

KIB: Final = 1 << 10
MIB: Final = 1 << 20
GIB: Final = 1 << 30


class LocalFileError(BoundedReadError, OSError):
    """A local file is missing, not a regular file, too large or unreadable; says which."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "a local file cannot be read"


class MissingFileError(LocalFileError, FileNotFoundError):
    """The file does not exist (also a FileNotFoundError, for callers that allow that)."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_checked(target: Path, limit: int, what: str) -> tuple[int, os.stat_result]:
    """A descriptor of ``target``, checked to be a regular file of at most ``limit`` bytes."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except FileNotFoundError:
        raise MissingFileError(f"{what} {target} does not exist") from None
    except IsADirectoryError:
        raise LocalFileError(f"{what} {target} is a folder, not a file") from None
    except OSError as error:
        raise LocalFileError(f"{what} {target} cannot be opened: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LocalFileError(
                f"{what} {target} is {_kind(info.st_mode)}; only a regular file is read"
            )
        if info.st_size > limit:
            raise LocalFileError(
                f"{what} {target} holds {info.st_size} bytes, more than the {limit} bytes a "
                f"{what} may have"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _read_all(fd: int, target: Path, limit: int, what: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    try:
        while True:
            block = os.read(fd, min(1 << 20, limit + 1 - total))
            if not block:
                break
            chunks.append(block)
            total += len(block)
            if total > limit:
                raise LocalFileError(
                    f"{what} {target} grew beyond the {limit} bytes a {what} may have while "
                    "it was read"
                )
    except LocalFileError:
        raise
    except OSError as error:
        raise LocalFileError(f"{what} {target} cannot be read: {error.strerror}") from None
    return b"".join(chunks)


def read_limited(path: str | Path, limit: int, *, what: str = "file") -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes.

    The file is opened with ``O_NONBLOCK`` (a FIFO cannot stall the open) and
    checked with ``fstat`` on the open descriptor, so what is read is what was
    checked even if the name is swapped meanwhile. ``what`` names the file's
    role in the error ("federation config", "identity key", ...).
    """
    target = Path(path)
    fd, _ = _open_checked(target, limit, what)
    try:
        return _read_all(fd, target, limit, what)
    finally:
        os.close(fd)


def read_secret(path: str | Path, limit: int, *, what: str) -> bytes:
    """:func:`read_limited` for a secret key, refused when group or others have any access.

    The mode is read from the open descriptor (so a symlink is judged by the
    file it reaches). Only the owner's bits may be set: 0600 or 0400.
    """
    target = Path(path)
    fd, info = _open_checked(target, limit, what)
    try:
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise LocalFileError(
                f"{what} {target} is a secret key but has mode {mode:04o}, so other users "
                f"may read it; make it private with `chmod 600 {target}` (and replace the "
                "key if someone else may have copied it)"
            )
        return _read_all(fd, target, limit, what)
    finally:
        os.close(fd)


class _Bounded(io.RawIOBase):
    """A read-only stream over a checked descriptor that refuses to pass ``limit`` bytes."""

    def __init__(self, fd: int, target: Path, limit: int, what: str) -> None:
        super().__init__()
        self._fd = fd
        self._target = target
        self._limit = limit
        self._what = what
        self._total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        try:
            block = os.read(self._fd, min(len(view), self._limit + 1 - self._total))
        except OSError as error:
            raise LocalFileError(
                f"{self._what} {self._target} cannot be read: {error.strerror}"
            ) from None
        self._total += len(block)
        if self._total > self._limit:
            raise LocalFileError(
                f"{self._what} {self._target} grew beyond the {self._limit} bytes a "
                f"{self._what} may have while it was read"
            )
        view[: len(block)] = block
        return len(block)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def open_limited(path: str | Path, limit: int, *, what: str = "file") -> BinaryIO:
    """``path`` opened for reading as a buffered binary stream, with :func:`read_limited`'s checks.

    For files read line by line rather than held whole. Reading past
    ``limit`` bytes (a file that grows while it is read) raises
    :class:`LocalFileError`. Close the stream (``with open_limited(...)``).
    """
    target = Path(path)
    fd, _ = _open_checked(target, limit, what)
    return io.BufferedReader(_Bounded(fd, target, limit, what), buffer_size=1 << 16)


def read_limited_text(path: str | Path, limit: int, *, what: str = "file") -> str:
    """:func:`read_limited`, decoded as UTF-8 (a LocalFileError when it is not)."""
    data = read_limited(path, limit, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise LocalFileError(f"{what} {path} is not UTF-8 text ({error.reason})") from None
