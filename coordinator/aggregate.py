"""The round's running sum: uint64 words added modulo 2^64 as chunks arrive.

Every payload is a vector of little-endian uint64 fixed-point words
(noise/fixed_point.py). Fixed-point addition modulo 2^64 is exact and
associative, so the coordinator can add each chunk into one running vector the
moment it arrives and needs a single d-word vector per round, however many
nodes submit (memory independent of K). Each node's mask is a signed sum of
pair terms that its partner adds with the opposite sign, so the masks cancel
exactly in this sum; with dropouts the survivors' corrections are subtracted
from it (Bonawitz et al. 2017, ACM CCS, "Practical Secure
Aggregation for Privacy-Preserving Machine Learning", §4).

Chunks need not be aligned to 8 bytes: a contribution keeps the at most seven
bytes of a word split across two chunks and adds the word when it completes.

A contribution that fails part-way (checksum mismatch, cancelled stream, a
node dropped at the deadline) must leave no trace, so it can be *withdrawn*:
its words added so far are subtracted again, read back from the file the
receiver wrote them to before adding them. The files are the durable truth;
after a restart the sum is rebuilt by streaming them (:meth:`RoundSum.add_file`).

numpy wraps unsigned array arithmetic modulo 2^64 without a warning (only
scalar overflow warns), which is exactly the arithmetic wanted here; every
operation below works on arrays, never on numpy scalars.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from coordinator.errors import CoordinatorFailure

__all__ = [
    "WORD",
    "WORD_BYTES",
    "Contribution",
    "ContributionWithdrawn",
    "RoundSum",
    "iter_file_words",
]

WORD = np.dtype("<u8")
WORD_BYTES = 8
# Words read per block when streaming a stored payload: 4 MiB of memory, whatever d.
_BLOCK_WORDS = 1 << 19


class ContributionWithdrawn(CoordinatorFailure):
    """A chunk arrived for a contribution that has already been withdrawn from the sum."""


@dataclass(eq=False)
class Contribution:
    """One payload being added to a :class:`RoundSum` chunk by chunk.

    ``source`` is the file the receiver writes every chunk to *before* feeding
    it here, so that the words added so far can be read back and subtracted.
    """

    label: str
    source: Path
    expected_bytes: int
    received_bytes: int = 0
    added_words: int = 0
    withdrawn: bool = False
    closed: bool = False
    _carry: bytes = field(default=b"", repr=False)


def iter_file_words(path: Path, *, limit_words: int | None = None) -> Iterator[NDArray[np.uint64]]:
    """Yield the little-endian uint64 words of ``path`` in blocks of at most 4 MiB.

    Each block is a view of one reused buffer, valid until the next block is
    read (constant memory whatever the file size). Reads at most
    ``limit_words`` words when given. Raises ValueError when the file holds a
    partial word or fewer words than asked for.
    """
    remaining = limit_words
    buffer = bytearray(_BLOCK_WORDS * WORD_BYTES)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as handle:
        while remaining is None or remaining > 0:
            want = len(buffer) if remaining is None else min(len(buffer), remaining * WORD_BYTES)
            got = 0
            while got < want:
                n = handle.readinto(view[got:want])
                if not n:
                    break
                got += n
            if got % WORD_BYTES:
                raise ValueError(f"payload file {path.name} ends inside a uint64 word.")
            if got == 0:
                break
            yield np.frombuffer(buffer, dtype=WORD, count=got // WORD_BYTES)
            if remaining is not None:
                remaining -= got // WORD_BYTES
            if got < want:
                break
    if remaining:
        raise ValueError(f"payload file {path.name} holds {remaining} word(s) fewer than expected.")


class RoundSum:
    """One running uint64 vector per round, added to and subtracted from modulo 2^64.

    Thread-safe: chunks of several nodes' uploads may arrive concurrently, and
    the deadline ticker may withdraw a dropped node's contribution while its
    stream is still running.
    """

    def __init__(self, n_words: int) -> None:
        if n_words < 0:
            raise ValueError(f"a round sum needs a non-negative number of words; got {n_words}.")
        self._words = np.zeros(n_words, dtype=WORD)
        self._lock = threading.Lock()
        self._open: set[Contribution] = set()

    @property
    def n_words(self) -> int:
        """Number of uint64 words in the payloads of this round."""
        return int(self._words.shape[0])

    @property
    def open_contributions(self) -> int:
        """Contributions begun and neither closed nor withdrawn."""
        with self._lock:
            return len(self._open)

    def begin(self, label: str, source: Path) -> Contribution:
        """Start adding one payload of ``n_words`` words whose chunks are written to ``source``."""
        contribution = Contribution(
            label=label, source=source, expected_bytes=self.n_words * WORD_BYTES
        )
        with self._lock:
            self._open.add(contribution)
        return contribution

    def feed(self, contribution: Contribution, data: bytes | memoryview) -> None:
        """Add the complete words of ``data`` (plus bytes carried from the last chunk).

        Raises :class:`ContributionWithdrawn` if the contribution was withdrawn
        meanwhile and ValueError if the data would run past the payload's end.
        """
        with self._lock:
            if contribution.withdrawn:
                raise ContributionWithdrawn(contribution.label)
            if contribution.closed:
                raise ValueError(
                    f"{contribution.label}: data arrived after the payload was closed."
                )
            if contribution.received_bytes + len(data) > contribution.expected_bytes:
                raise ValueError(
                    f"{contribution.label}: {contribution.received_bytes + len(data)} bytes "
                    f"exceed the payload size of {contribution.expected_bytes} bytes."
                )
            joined = contribution._carry + data if contribution._carry else data
            usable = len(joined) - len(joined) % WORD_BYTES
            if usable:
                words = np.frombuffer(joined, dtype=WORD, count=usable // WORD_BYTES)
                start = contribution.added_words
                target = self._words[start : start + words.shape[0]]
                np.add(target, words, out=target)
                contribution.added_words += int(words.shape[0])
            contribution._carry = bytes(joined[usable:])
            contribution.received_bytes += len(data)

    def close(self, contribution: Contribution) -> None:
        """Mark a contribution complete; raises ValueError if bytes are missing."""
        with self._lock:
            if contribution.withdrawn:
                raise ContributionWithdrawn(contribution.label)
            if contribution.received_bytes != contribution.expected_bytes:
                raise ValueError(
                    f"{contribution.label}: received {contribution.received_bytes} of "
                    f"{contribution.expected_bytes} bytes."
                )
            contribution.closed = True
            self._open.discard(contribution)

    def withdraw(self, contribution: Contribution) -> None:
        """Subtract everything ``contribution`` added so far; later chunks are refused.

        Idempotent. The words are read back from ``contribution.source``, which
        the receiver wrote (unbuffered) before feeding them.
        """
        with self._lock:
            if contribution.withdrawn:
                return
            contribution.withdrawn = True
            self._open.discard(contribution)
            if contribution.added_words:
                self._apply_file(contribution.source, contribution.added_words, np.subtract)

    def relocate(self, contribution: Contribution, move: Callable[[], Path]) -> None:
        """Run ``move`` (which renames the contribution's file) and follow it to its new path.

        Under the sum's lock, so a withdrawal never looks for the file between
        the rename and the new path.
        """
        with self._lock:
            contribution.source = move()

    def add_file(self, path: Path) -> None:
        """Add a complete stored payload (streamed in 4 MiB blocks)."""
        with self._lock:
            self._apply_file(path, self.n_words, np.add)

    def subtract_file(self, path: Path) -> None:
        """Subtract a complete stored payload (streamed in 4 MiB blocks)."""
        with self._lock:
            self._apply_file(path, self.n_words, np.subtract)

    def subtract_words(self, words: NDArray[np.uint64]) -> None:
        """Subtract a whole vector of this round's size (a self-mask) modulo 2^64."""
        if words.shape != self._words.shape:
            raise ValueError(
                f"a vector of {words.shape} words cannot be subtracted from a sum of "
                f"{self.n_words} words."
            )
        with self._lock:
            np.subtract(self._words, words.astype(WORD, copy=False), out=self._words)

    def _apply_file(self, path: Path, n_words: int, op: np.ufunc) -> None:
        start = 0
        for block in iter_file_words(path, limit_words=n_words):
            target = self._words[start : start + block.shape[0]]
            op(target, block, out=target)
            start += int(block.shape[0])

    def to_bytes(self) -> bytes:
        """The current sum as little-endian bytes (a copy)."""
        with self._lock:
            return self._words.tobytes()

    def words(self) -> NDArray[np.uint64]:
        """A copy of the current sum."""
        with self._lock:
            return self._words.copy()

    def write_to(self, write: Callable[[memoryview], None]) -> None:
        """Hand the current sum to ``write`` as little-endian byte views, no copy made.

        Under the sum's lock, so nothing is added or withdrawn while it is
        written; each view is valid only during its call.
        """
        with self._lock:
            for start in range(0, self.n_words, _BLOCK_WORDS):
                with (
                    self._words[start : start + _BLOCK_WORDS].data as view,
                    view.cast("B") as block,
                ):
                    write(block)
