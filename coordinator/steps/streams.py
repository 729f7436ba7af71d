"""Payload streams: an upload or an unmask correction from its first chunk to a stored file.

A step that accepts a header opens a :class:`Ticket`; the server then feeds
it chunk by chunk (:meth:`Streams.receive`, without the session lock, so
streams of different nodes proceed at once) and ends it with
:meth:`Streams.finish`, which verifies size and digest and hands the ticket
to the step that opened it (``Ticket.commit``) to store it under the lock. An
upload's chunks go into the round's running sum as they arrive; bytes reach
the file before the sum, so a stream that fails or is cancelled can be taken
out of the sum again by reading them back (coordinator/aggregate.py).

When a node is dropped mid-stream (a deadline, a withdrawal, a refusal),
:meth:`Streams.cancel` withdraws its partial sum at once and its later
chunks are refused. Whatever is not stored leaves no file behind.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from coordinator.aggregate import Contribution, ContributionWithdrawn, RoundSum
from coordinator.context import CoordinatorContext, short_digest
from coordinator.errors import FailedPrecondition, InvalidArgument
from coordinator.events import ResultFile
from coordinator.layout import PayloadSpec
from coordinator.store import PayloadWriter
from coordinator.store.payloads import fsync_dir
from noise.layout import Layout
from proto.chunk_wire import ChunkEncoder
from proto.messages import (
    UnmaskReceipt,
    UploadReceipt,
)

__all__ = [
    "MAX_CHUNK_BYTES",
    "RESULT_CHUNK_BYTES",
    "EncodedResult",
    "Streams",
    "Ticket",
    "unlink_placed",
]

MAX_CHUNK_BYTES = 1 << 20
# The data chunks a round's aggregate is sent in (GetResult).
RESULT_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class EncodedResult:
    """A round's aggregate as encoded result data chunks, made while its file was written."""

    round_index: int
    name: str
    digest: bytes
    chunk_bytes: int
    chunks: tuple[bytes, ...]


def unlink_placed(path: Path | None) -> None:
    """Delete a placed payload file that no row will name."""
    if path is not None:
        path.unlink(missing_ok=True)


@dataclass(eq=False)
class Ticket:
    """A payload stream in progress: an upload (``attempt`` 0) or an unmask correction.

    ``commit`` stores the finished payload (under the session lock) and
    returns the node's receipt; the step that opened the ticket provides it.
    """

    kind: str  # "upload" | "correction"
    round_index: int
    node_id: str
    spec: PayloadSpec
    writer: PayloadWriter
    commit: Callable[[Ticket], UploadReceipt | UnmaskReceipt]
    running: RoundSum | None = None
    contribution: Contribution | None = None
    attempt: int = 0
    statement_signature: bytes = b""  # uploads only: the node's signed upload statement
    self_mask_commitment: bytes = b""  # uploads only: binds the seed revealed at unmask
    self_mask_seed: bytes = b""  # corrections only: the seed revealed with them
    # uploads only: (recipient, sealed, signature) of the sealed contributions
    challenge: tuple[tuple[str, bytes, bytes], ...] = ()
    layout: Layout | None = None  # the payload's layout, checked when the stream began
    # The file's final name, known from the header: the payload is placed under
    # it (fsynced, renamed, directory fsynced) before the session lock is taken.
    name: str = ""
    received: int = 0
    # cancelled: the session gave up on the stream (its node was dropped);
    # closed: the stream's owner has finished with it (stored or abandoned).
    cancelled: bool = False
    closed: bool = False
    committed: bool = False

    @property
    def what(self) -> str:
        noun = "upload" if self.kind == "upload" else "unmask correction"
        return f"{noun} of node {self.node_id!r} for round {self.round_index}"

    @property
    def key(self) -> tuple[str, int, str]:
        """At most one stream per kind, round and node is open."""
        return (self.kind, self.round_index, self.node_id)

    def cancelled_sentence(self) -> str:
        """Why a cancelled stream is refused."""
        deadline = "round's" if self.kind == "upload" else "unmask request's"
        return (
            f"{self.what}: the {deadline} deadline passed and node {self.node_id!r} was "
            "dropped while the stream was in progress."
        )


class Streams:
    """The open payload streams of a session, one per (kind, round, node)."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx
        self._open: dict[tuple[str, int, str], Ticket] = {}
        # The newest aggregate written by this process, already encoded for
        # GetResult, so serving it needs no read of the file it was just
        # written to (None after a restart: then the file is read).
        self.encoded_result: EncodedResult | None = None
        # Encodes the aggregate's chunks beside the writing of its file.
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerosum-encode")

    def in_progress(self, kind: str, round_index: int, node_id: str) -> bool:
        """True while a stream of this kind, round and node is open."""
        return (kind, round_index, node_id) in self._open

    def register(self, ticket: Ticket) -> Ticket:
        """Record a newly opened stream (the caller checked :meth:`in_progress`)."""
        self._open[ticket.key] = ticket
        return ticket

    def receive(self, ticket: Ticket, offset: int, data: bytes | memoryview) -> None:
        """Take one chunk of a stream (uploads go straight into the running sum).

        ``data`` may be a view of the received message (it is not kept).
        """
        if ticket.closed:
            raise FailedPrecondition(f"{ticket.what}: the stream has already ended.")
        if ticket.cancelled:
            raise FailedPrecondition(ticket.cancelled_sentence())
        if offset != ticket.received:
            raise InvalidArgument(
                f"{ticket.what}: chunk offset {offset}; expected {ticket.received} "
                "(chunks must be contiguous and in order)."
            )
        if len(data) > MAX_CHUNK_BYTES:
            raise InvalidArgument(
                f"{ticket.what}: a chunk of {len(data)} bytes exceeds the limit of "
                f"{MAX_CHUNK_BYTES} bytes."
            )
        if ticket.received + len(data) > ticket.spec.total_bytes:
            raise InvalidArgument(
                f"{ticket.what}: the payload runs past the {ticket.spec.total_bytes} bytes "
                "its header announced (wrong size)."
            )
        # Bytes reach the file before the sum, so a withdrawal can read them back.
        ticket.writer.write(data)
        if ticket.running is not None and ticket.contribution is not None:
            try:
                ticket.running.feed(ticket.contribution, data)
            except ContributionWithdrawn:
                raise FailedPrecondition(ticket.cancelled_sentence()) from None
        ticket.received += len(data)

    def finish(self, ticket: Ticket) -> UploadReceipt | UnmaskReceipt:
        """Verify size and checksum, then let the ticket's step store it (under the lock)."""
        try:
            if ticket.received != ticket.spec.total_bytes:
                raise InvalidArgument(
                    f"{ticket.what}: the stream ended after {ticket.received} of "
                    f"{ticket.spec.total_bytes} bytes (wrong size)."
                )
            digest = ticket.writer.finish()
            if digest != ticket.spec.digest:
                raise InvalidArgument(
                    f"{ticket.what}: the payload's digest is {short_digest(digest)} but the header "
                    f"announced {short_digest(ticket.spec.digest)}."
                )
            if ticket.name:
                # Durably in place before the row naming it can commit, and
                # without the lock: a refused commit unlinks it again (abandon).
                self._place(ticket)
            with self.ctx.lock:
                return ticket.commit(ticket)
        except BaseException:
            self.abandon(ticket)
            raise

    def _place(self, ticket: Ticket) -> None:
        """fsync, rename to ``ticket.name`` and fsync the directory; the sum follows the file."""
        writer = ticket.writer
        if ticket.running is not None and ticket.contribution is not None:
            ticket.running.relocate(ticket.contribution, lambda: writer.rename(ticket.name))
        else:
            writer.rename(ticket.name)
        fsync_dir(writer.directory)

    def abandon(self, ticket: Ticket) -> None:
        """Discard a stream that failed or was cancelled; undo its partial sum. Idempotent."""
        with self.ctx.lock:
            if ticket.closed:
                return
            ticket.closed = True
            if self._open.get(ticket.key) is ticket:
                del self._open[ticket.key]
            if ticket.committed:
                return
            if ticket.running is not None and ticket.contribution is not None:
                ticket.running.withdraw(ticket.contribution)
            ticket.writer.discard()
            unlink_placed(ticket.writer.placed)

    def cancel(self, kind: str, round_index: int, nodes: set[str]) -> None:
        """Cancel streams of dropped nodes: their partial sums leave the round at once."""
        for key, ticket in list(self._open.items()):
            if key[0] == kind and key[1] == round_index and key[2] in nodes:
                ticket.cancelled = True
                if ticket.running is not None and ticket.contribution is not None:
                    ticket.running.withdraw(ticket.contribution)
                del self._open[key]

    def write_result(self, running: RoundSum, round_index: int) -> ResultFile:
        """Place the running sum as the round's aggregate file (its row is written later).

        The same bytes are encoded as result chunks on the way
        (:attr:`encoded_result`), one copy made from the sum's memory.
        """
        writer = self.ctx.store.new_payload()
        encoder = ChunkEncoder(RESULT_CHUNK_BYTES)

        def write(block: memoryview) -> None:
            # Every node waits on this write, and meanwhile a core is idle: the
            # block is encoded and hashed in two helper threads as it is written.
            encoding = self._encoder.submit(encoder.add, block)
            try:
                writer.write(block, hash_aside=True)
            finally:
                wait([encoding])  # the helper is done with the block before it goes
            encoding.result()

        self.encoded_result = None  # the older one goes before the new is made
        try:
            running.write_to(write)
            digest = writer.finish()
            name = self.ctx.store.result_name(round_index, digest)
            writer.place(name)
        except BaseException:
            writer.discard()
            raise
        self.encoded_result = EncodedResult(
            round_index, name, digest, RESULT_CHUNK_BYTES, encoder.finish()
        )
        return ResultFile(name, digest)
