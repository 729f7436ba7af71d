"""Payloads on the wire: one header, one chunker and one assembler for both ends.

Every payload of the session protocol (an upload, an aggregate, unmask
corrections) is a flat vector of little-endian uint64 words laid out by a
:class:`noise.layout.Layout`, announced by a ``PayloadHeader`` (size, digest,
fixed-point scale, the layout) and sent as ``PayloadChunk`` messages of at
most :data:`CHUNK_BYTES` bytes, so no message comes near gRPC's 4 MiB default
limit whatever the model size. Node and coordinator both use this module, so
they cannot disagree on the byte layout:

* :func:`tensor_layouts` / :func:`layout_of`: a Layout to and from the wire form;
* :func:`payload_spec` / :func:`payload_header`: the header of a payload, plain
  (``proto.messages.PayloadSpec``) or as the message (its digest computed here, or given);
* :func:`payload_chunks` / :func:`file_chunks`: the chunk messages of a vector or a file,
  :func:`chunk_views` the same cuts as views (``proto.chunk_wire`` encodes them);
* :class:`PayloadAssembler`: rebuilds a payload from chunks and checks offsets,
  size, digest (unless the receiver checks the words otherwise) and (when
  given) the layout the receiver expects, raising :class:`PayloadError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from noise.layout import (
    DIGEST_BYTES,
    WORD,
    WORD_BYTES,
    Layout,
    LayoutError,
    TensorSlot,
    as_words,
    payload_digest,
    payload_hasher,
)
from proto.errors import ProtoError
from proto.messages import PayloadSpec
from proto.zerosum.v1 import session_pb2 as pb

__all__ = [
    "CHUNK_BYTES",
    "WORD_BYTES",
    "Chunk",
    "PayloadAssembler",
    "PayloadError",
    "chunk_views",
    "file_chunks",
    "layout_of",
    "payload_chunks",
    "payload_header",
    "payload_spec",
    "tensor_layouts",
]

CHUNK_BYTES = 1 << 20  # 1 MiB: a quarter of gRPC's default message limit
U64 = NDArray[np.uint64]


class PayloadError(ProtoError, ValueError):
    """A payload, its header or its chunks are inconsistent; the message says how."""


class Chunk(Protocol):
    """A data chunk: a ``PayloadChunk`` or a ``proto.chunk_wire.DataChunk`` read off the wire."""

    @property
    def offset(self) -> int: ...

    @property
    def data(self) -> bytes | memoryview: ...


def tensor_layouts(layout: Iterable[TensorSlot]) -> list[pb.TensorLayout]:
    """The wire form of ``layout`` (or of its slots), in its order."""
    return [
        pb.TensorLayout(name=s.name, shape=list(s.shape), offset=s.offset, size=s.size)
        for s in layout
    ]


def layout_of(tensors: Sequence[pb.TensorLayout]) -> Layout:
    """The Layout a header announces; PayloadError naming the fault when it is malformed."""
    try:
        return Layout(
            TensorSlot(t.name, tuple(int(n) for n in t.shape), int(t.offset), int(t.size))
            for t in tensors
        )
    except LayoutError as error:
        raise PayloadError(f"the payload header's layout is malformed: {error}") from None


def payload_spec(
    words: U64 | None,
    layout: Layout,
    fixed_point_bits: int,
    *,
    digest: bytes | None = None,
) -> PayloadSpec:
    """What the header of a payload of ``layout`` says: sizes, digest, scale and layout.

    The digest is computed from ``words`` unless ``digest`` gives it (a
    stored payload whose digest is known); ``words`` must then be None.
    """
    if digest is None:
        if words is None:
            raise ValueError("a payload header needs the payload's words or their digest")
        data = as_words(words)
        if data.shape != (layout.size,):
            raise PayloadError(
                f"a payload of {data.size} words does not fit a layout of {layout.size} words"
            )
        digest = payload_digest(data)
    elif words is not None:
        raise ValueError("a payload header takes either the words or their digest, not both")
    return PayloadSpec(
        total_bytes=layout.nbytes,
        total_elements=layout.size,
        digest=digest,
        fixed_point_bits=fixed_point_bits,
        tensors=layout.slots,
    )


def payload_header(
    words: U64 | None,
    layout: Layout,
    fixed_point_bits: int,
    *,
    digest: bytes | None = None,
) -> pb.PayloadHeader:
    """The header message of a payload of ``layout`` (see :func:`payload_spec`)."""
    spec = payload_spec(words, layout, fixed_point_bits, digest=digest)
    return pb.PayloadHeader(
        total_bytes=spec.total_bytes,
        total_elements=spec.total_elements,
        digest=spec.digest,
        fixed_point_bits=spec.fixed_point_bits,
        tensors=tensor_layouts(layout),
    )


def payload_chunks(
    data: U64 | bytes | memoryview, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[pb.PayloadChunk]:
    """``data`` as consecutive chunks of at most ``chunk_bytes`` bytes (none when empty).

    ``data`` may be a uint64 vector (sent as little-endian words) or bytes;
    each chunk copies only its own slice.
    """
    for start, view in chunk_views(data, chunk_bytes):
        yield pb.PayloadChunk(offset=start, data=bytes(view))


def chunk_views(
    data: U64 | bytes | memoryview, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[int, memoryview]]:
    """(offset, view) of each chunk of ``data`` (as :func:`payload_chunks` cuts it), no copy."""
    if not 0 < chunk_bytes <= CHUNK_BYTES:
        raise ValueError(f"chunk_bytes = {chunk_bytes}: must be between 1 and {CHUNK_BYTES}.")
    view = as_words(data).view(np.uint8).data if isinstance(data, np.ndarray) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    for start in range(0, len(view), chunk_bytes):
        yield start, view[start : start + chunk_bytes]


def file_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pb.PayloadChunk]:
    """The bytes of a stored payload file as chunks, read one chunk at a time."""
    if not 0 < chunk_bytes <= CHUNK_BYTES:
        raise ValueError(f"chunk_bytes = {chunk_bytes}: must be between 1 and {CHUNK_BYTES}.")
    with path.open("rb") as handle:
        offset = 0
        while block := handle.read(chunk_bytes):
            yield pb.PayloadChunk(offset=offset, data=block)
            offset += len(block)


class PayloadAssembler:
    """Collects the chunks announced by a header and returns the verified payload.

    The words are written straight into one buffer allocated from the
    header's size (each chunk copied once) and hashed as they arrive, so
    :meth:`finish` needs neither a further copy nor a second pass. With
    ``layout`` the header must announce exactly that layout. With
    ``check_digest=False`` the words are not hashed and the header's digest
    is not compared (for a receiver that checks the words by other means: a
    node's aggregate-check tags, docs/design.md §4.5).
    """

    def __init__(
        self,
        header: pb.PayloadHeader,
        *,
        layout: Layout | None = None,
        max_bytes: int | None = None,
        check_digest: bool = True,
    ) -> None:
        announced = layout_of(header.tensors)
        if layout is not None and announced != layout:
            raise PayloadError(
                f"the payload header's layout differs from the expected one: "
                f"{layout.difference(announced)}"
            )
        if header.total_elements != announced.size or header.total_bytes != announced.nbytes:
            raise PayloadError(
                f"header announces {header.total_bytes} bytes and {header.total_elements} "
                f"elements for a layout of {announced.size} words ({announced.nbytes} bytes)."
            )
        if max_bytes is not None and header.total_bytes > max_bytes:
            raise PayloadError(
                f"payload of {header.total_bytes} bytes exceeds the limit of {max_bytes} bytes."
            )
        if len(header.digest) != DIGEST_BYTES:
            raise PayloadError(
                f"header digest has {len(header.digest)} bytes; expected {DIGEST_BYTES}."
            )
        self.header = header
        self.layout = announced
        self._words: U64 = np.empty(announced.size, dtype=WORD)
        self._target = self._words.view(np.uint8).data
        self._digest = payload_hasher() if check_digest else None
        self._filled = 0

    @property
    def received_bytes(self) -> int:
        return self._filled

    def add(self, chunk: Chunk) -> None:
        """Take one chunk; it must start where the previous one ended."""
        if chunk.offset != self._filled:
            raise PayloadError(
                f"chunk at byte {chunk.offset} arrived; expected byte {self._filled}."
            )
        data = chunk.data
        size = len(data)
        if size > CHUNK_BYTES:
            raise PayloadError(f"chunk of {size} bytes exceeds {CHUNK_BYTES} bytes.")
        end = self._filled + size
        if end > self.header.total_bytes:
            raise PayloadError(
                f"chunks exceed the {self.header.total_bytes} bytes the header announced."
            )
        self._target[self._filled : end] = data
        if self._digest is not None:
            self._digest.update(data)
        self._filled = end

    def finish(self) -> U64:
        """The complete payload as uint64 words, after checking its size and (unless told
        not to) its digest (``noise.layout.payload_digest``).

        On a little-endian machine this is the assembler's own buffer (no copy).
        """
        if self._filled != self.header.total_bytes:
            raise PayloadError(
                f"received {self._filled} of the {self.header.total_bytes} bytes announced."
            )
        if self._digest is not None and self._digest.digest() != self.header.digest:
            raise PayloadError("payload digest does not match the header; it was altered.")
        if self._words.dtype == np.dtype(np.uint64):
            return self._words
        return self._words.astype(np.uint64)  # pragma: no cover - big-endian hosts only
