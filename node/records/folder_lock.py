"""One node process per folder: an exclusive ``flock`` on a lock file in it.

The state folder and the output folder are each held this way while a node
runs (``StateFolder.exclusive``, ``SessionStore.exclusive``). The lock file
holds the holder's process id, so a second process is told which process
to stop. The operating system drops the lock when the holder ends, however
it ends; the file stays (removing it would let a third process lock a new
file while the second still holds the old one).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from node.errors import SessionStateError

__all__ = ["held_exclusively"]


@contextmanager
def held_exclusively(lock_path: Path, refusal: Callable[[str], str]) -> Iterator[None]:
    """Hold ``lock_path`` exclusively while the block runs.

    Raises :class:`SessionStateError` with ``refusal(holder)`` when another
    process holds it, ``holder`` being that process's id as it wrote it.
    """
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise SessionStateError(refusal(holder)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
