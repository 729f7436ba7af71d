"""Reading a local file that someone else may have put there: bounded, regular, or refused.

Nodes and the coordinator read files an operator supplies (the federation
config, keys, certificates, cohorts, models). Any of them may be replaced by a
symlink to ``/dev/zero``, a FIFO nobody writes to, or a file of gigabytes. A
plain ``read_bytes()`` would then grow memory until the process is killed, or
block forever. :func:`read_limited` opens without blocking, refuses anything
that is not a regular file, and reads at most ``limit`` bytes, each refusal a
:class:`LocalFileError` with one sentence naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

__all__ = ["KIB", "MIB", "LocalFileError", "read_limited", "read_limited_text"]

KIB: Final = 1 << 10
MIB: Final = 1 << 20


class LocalFileError(OSError):
    """A local file is missing, not a regular file, too large or unreadable; says which."""


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


def read_limited(path: str | Path, limit: int, *, what: str = "file") -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes.

    The file is opened with ``O_NONBLOCK`` (a FIFO cannot stall the open) and
    checked with ``fstat`` on the open descriptor, so what is read is what was
    checked even if the name is swapped meanwhile. ``what`` names the file's
    role in the error ("federation config", "identity key", ...).
    """
    target = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except FileNotFoundError:
        raise LocalFileError(f"{what} {target} does not exist") from None
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
        chunks: list[bytes] = []
        total = 0
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
        return b"".join(chunks)
    except OSError as error:
        if isinstance(error, LocalFileError):
            raise
        raise LocalFileError(f"{what} {target} cannot be read: {error.strerror}") from None
    finally:
        os.close(fd)


def read_limited_text(path: str | Path, limit: int, *, what: str = "file") -> str:
    """:func:`read_limited`, decoded as UTF-8 (a LocalFileError when it is not)."""
    data = read_limited(path, limit, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise LocalFileError(f"{what} {path} is not UTF-8 text ({error.reason})") from None
