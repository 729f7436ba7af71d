"""Payload files: raw uint64 files beside the state file, written so a crash leaves no doubt.

Payloads (uploads, corrections, results) live as raw little-endian uint64
files in ``<stem>.payloads/`` next to the SQLite file; a row names its file
and records its payload digest (``noise.layout.payload_digest``) and size. A
payload is written to a temporary ``.part-*`` name, fsynced, renamed to its
final content-addressed name and the directory fsynced, and only *then* is
the row that refers to it inserted.
A ``kill -9`` before the insert leaves an unreferenced file, which
:func:`remove_unreferenced` deletes at the next start, as it deletes every
temporary file; the node's retry then stores it again.

Final names contain the round, the kind, the node and the first 16 hex digits
of the content's digest, so a rename never replaces a file with different
content.

Payload bytes go to the disk with direct I/O (``O_DIRECT``) where the file
system takes it: the coordinator writes K payloads a round and reads them
back only to withdraw one or after a restart, so keeping them in the page
cache buys nothing, and growing the page cache costs more than the write
itself on a virtual machine that hands freed memory back to its host (each
fresh page is faulted in from the host first; measured in
docs/how-it-works.md). Direct writes need aligned offsets, lengths and
buffers: bytes pass through a reused page-aligned staging buffer, every
whole 4 KiB block is written direct and a shorter tail through the page
cache, so every byte :meth:`PayloadWriter.write` was given is in the file
when it returns, as before. Where direct I/O is refused (tmpfs on older
kernels, some network and FUSE file systems, or a platform without it) the
file is written through the page cache; the durability argument is the same
either way, since it rests on the fsync before the rename.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import re
import secrets
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from coordinator.errors import StateFileError
from noise.layout import payload_hasher

__all__ = [
    "PayloadWriter",
    "correction_name",
    "fsync_dir",
    "payload_dir_for",
    "prepare_staging",
    "remove_unreferenced",
    "result_name",
    "upload_name",
]

_PART_PREFIX = ".part-"
# Direct I/O: offsets and lengths in whole blocks of this size (4 KiB covers
# disks of 512-byte and of 4 KiB sectors), from a buffer aligned to a page.
_ALIGN = 4096
_DIRECT = getattr(os, "O_DIRECT", 0)
# A staging buffer takes one 1 MiB data chunk and the tail before it at once.
_STAGE_BYTES = (1 << 20) + _ALIGN
# Staging buffers kept for reuse: one per payload stream read at once, and more.
_KEEP_STAGES = 16


def payload_dir_for(state_path: Path) -> Path:
    """The payload directory that belongs to a state file: ``state.sqlite`` → ``state.payloads``."""
    return state_path.with_name(state_path.stem + ".payloads")


def _name_tag(node_id: str) -> str:
    """A file-name-safe tag for a node id (the id itself when it is already safe)."""
    if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", node_id):
        return node_id
    return "x" + hashlib.sha256(node_id.encode("utf-8")).hexdigest()[:16]


def upload_name(round_index: int, node_id: str, digest: bytes) -> str:
    """Final file name of an upload."""
    return f"r{round_index:04d}-upload-{_name_tag(node_id)}-{digest.hex()[:16]}.u64"


def correction_name(round_index: int, attempt: int, node_id: str, digest: bytes) -> str:
    """Final file name of an unmask correction."""
    return f"r{round_index:04d}-unmask{attempt}-{_name_tag(node_id)}-{digest.hex()[:16]}.u64"


def result_name(round_index: int, digest: bytes) -> str:
    """Final file name of a round's aggregate."""
    return f"r{round_index:04d}-result-{digest.hex()[:16]}.u64"


def fsync_dir(directory: Path) -> None:
    """Make a rename or deletion in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# The one thread that hashes payload bytes beside their write (started at its first use).
_HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerosum-payload-hash")


class _StagingBuffers:
    """Page-aligned staging buffers, handed out and taken back (reused, never grown per write)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[mmap.mmap] = []

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free:
                return self._free.pop()
        return mmap.mmap(-1, _STAGE_BYTES)

    def prepare(self, count: int) -> None:
        """Have ``count`` buffers (at most the number kept) ready, their pages already in memory.

        A fresh buffer's pages are faulted in by its first copy, inside the
        first uploads; made here (``MAP_POPULATE`` where the platform has it)
        that cost is paid once, before any payload arrives.
        """
        populate = getattr(mmap, "MAP_POPULATE", 0)
        with self._lock:
            while len(self._free) < min(count, _KEEP_STAGES):
                if populate:
                    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate
                    buffer = mmap.mmap(-1, _STAGE_BYTES, flags=flags)
                else:
                    buffer = mmap.mmap(-1, _STAGE_BYTES)
                    for offset in range(0, _STAGE_BYTES, mmap.PAGESIZE):
                        buffer[offset] = 0  # touched: the page is in memory from now on
                self._free.append(buffer)

    def give(self, buffer: mmap.mmap) -> None:
        with self._lock:
            if len(self._free) < _KEEP_STAGES:
                self._free.append(buffer)
                return
        buffer.close()


_STAGES = _StagingBuffers()


def prepare_staging(streams: int) -> None:
    """Make the staging buffers for ``streams`` payload streams at once now (module docstring)."""
    _STAGES.prepare(streams)


class PayloadWriter:
    """Receives one payload into a temporary file, hashing it on the way.

    Every byte given to :meth:`write` is in the file when it returns (direct
    I/O for whole blocks, the page cache for a shorter tail; module
    docstring), so another reader of the file sees it at once; the running
    sum relies on that to withdraw a partial contribution
    (coordinator/aggregate.py). ``direct=False`` writes through the page
    cache only.
    """

    def __init__(self, directory: Path, *, direct: bool = True) -> None:
        self.directory = directory
        self.path = directory / f"{_PART_PREFIX}{secrets.token_hex(8)}"
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._digest = payload_hasher()
        self.size = 0
        self.placed: Path | None = None
        # While direct I/O is in use: the staging buffer, whose first ``_staged``
        # bytes are the file's bytes after its last whole block (already written,
        # through the page cache, and written again direct with the next block).
        self._stage: mmap.mmap | None = None
        self._staged = 0
        self._fd_direct = False  # whether O_DIRECT is set on the file now
        self._use_direct = bool(direct and _DIRECT and self._set_direct(True))
        if self._use_direct:
            self._stage = _STAGES.take()

    @property
    def direct(self) -> bool:
        """Whether whole blocks still go to the disk with direct I/O."""
        return self._use_direct

    def write(self, data: bytes | memoryview, *, hash_aside: bool = False) -> None:
        """Append ``data``; every byte of it is in the file on return.

        With ``hash_aside`` the bytes are hashed in a helper thread while they
        are written (the hash and the disk's write both leave the interpreter
        lock), for a caller on the path others wait on, with a core to spare;
        the digest is the same, and the helper is done with ``data`` when this
        returns, whether the write succeeded or not.
        """
        if self._fd is None:
            raise ValueError("payload writer is closed.")
        view = memoryview(data).cast("B")  # lengths and offsets in bytes from here on
        hashing = _HASHER.submit(self._digest.update, view) if hash_aside else None
        try:
            if self._stage is None:
                self._put(view, self.size)
            else:
                self._write_staged(view)
        finally:
            if hashing is not None:
                wait([hashing])
        if hashing is None:
            self._digest.update(view)
        else:
            hashing.result()
        self.size += len(view)

    def _write_staged(self, view: memoryview) -> None:
        stage = self._stage
        assert stage is not None
        start = self.size - self._staged  # a whole number of blocks
        taken = 0
        with memoryview(stage) as buffer:
            while taken < len(view):
                piece = view[taken : taken + len(buffer) - self._staged]
                end = self._staged + len(piece)
                buffer[self._staged : end] = piece
                whole = end - end % _ALIGN
                if whole:
                    self._put(buffer[:whole], start, direct=True)
                    # The tail (under one block) moves to the front; the two
                    # ranges cannot overlap, as whole >= _ALIGN > end - whole.
                    buffer[: end - whole] = buffer[whole:end]
                start += whole
                self._staged = end - whole
                taken += len(piece)
            if self._staged:
                self._put(buffer[: self._staged], start)
        if not self._use_direct:
            # Direct I/O was refused on the way: every byte is in the file, and the
            # buffer is given back only now that this write is done with it.
            self._release_stage()

    def _put(self, view: memoryview, offset: int, *, direct: bool = False) -> None:
        """Write all of ``view`` at ``offset``: direct if asked and still possible."""
        assert self._fd is not None
        done = 0
        while done < len(view):
            wanted = direct and self._use_direct
            if wanted != self._fd_direct and not self._set_direct(wanted):
                if not wanted:
                    raise OSError(errno.EIO, f"direct I/O could not be turned off for {self.path}")
                self._use_direct = False  # refused: the page cache from now on
                continue
            try:
                written = os.pwrite(self._fd, view[done:], offset + done)
            except OSError as error:
                if not (self._fd_direct and error.errno == errno.EINVAL):
                    raise
                self._use_direct = False  # refused for this file after all: the page cache
                continue
            if written <= 0:
                raise OSError(errno.EIO, f"no bytes were written to {self.path}")
            if self._fd_direct and written < len(view) - done:
                self._use_direct = False  # a short direct write: the rest through the page cache
            done += written

    def _set_direct(self, on: bool) -> bool:
        """Turn O_DIRECT on or off for the open file; False if the file system refuses."""
        assert self._fd is not None
        try:
            flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
            fcntl.fcntl(self._fd, fcntl.F_SETFL, flags | _DIRECT if on else flags & ~_DIRECT)
        except OSError:
            return False
        self._fd_direct = on
        return True

    def _release_stage(self) -> None:
        if self._stage is not None:
            _STAGES.give(self._stage)
            self._stage = None
            self._staged = 0

    def finish(self) -> bytes:
        """fsync and close the temporary file; return the payload digest of everything written."""
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            self._release_stage()
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
            self._release_stage()
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
