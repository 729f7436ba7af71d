"""The wire form of payload data chunks, written and read without protobuf objects.

``UploadChunk``, ``ResultChunk`` and ``UnmaskChunk`` carry a payload's bytes
the same way: their field 2 (``data``, in the ``part`` oneof) holds a
``PayloadChunk {uint64 offset = 1; bytes data = 2;}``. As protobuf writes it,
such a message is::

    0x12 <varint: n>  [0x08 <varint: offset>]  [0x12 <varint: size> <size bytes>]

(n the length of what follows; each inner field left out when it is zero or
empty). A payload of megabytes crosses the wire in such messages, and
building a ``PayloadChunk`` for each, serializing it and parsing it again
copies every byte several times. This module does without:

* :func:`encode_data_chunk` writes that message from a slice of the payload
  (its bytes copied once, into the message), bytes-identical to
  ``X(data=PayloadChunk(offset=o, data=d)).SerializeToString()``;
  :func:`encoded_chunks` / :func:`encoded_file_chunks` do so for a whole
  vector or stored file, cut as ``proto.chunks`` cuts them, and
  :class:`ChunkEncoder` for a payload handed over in pieces of any size (the
  coordinator's aggregate as it writes its file);
* :func:`decode_data_chunk` reads a message of exactly that shape, as
  protobuf writes it, into (offset, a memoryview of the received bytes)
  without copying them; :func:`data_chunk_decoder` turns it into a gRPC
  deserializer that hands every other message (headers, refusals, unknown
  fields, any other encoding, malformed bytes) to the real protobuf parser,
  so those parse, or fail, exactly as before;
* :func:`passthrough_serializer`: a gRPC serializer that sends encoded bytes as
  they are and serializes anything else as protobuf does;
* :func:`message_part` / :func:`as_data_chunk`: which part a decoded message
  carries, and its data chunk, whichever of the two forms it arrived in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from google.protobuf.message import Message

from proto.chunks import CHUNK_BYTES, U64, Chunk, chunk_views

__all__ = [
    "ChunkEncoder",
    "DataChunk",
    "as_data_chunk",
    "data_chunk_decoder",
    "decode_data_chunk",
    "encode_data_chunk",
    "encoded_chunks",
    "encoded_file_chunks",
    "message_part",
    "passthrough_serializer",
]

_DATA_TAG = 0x12  # field 2, length-delimited: the message's data and the chunk's bytes
_OFFSET_TAG = 0x08  # field 1, varint: the chunk's offset
_UINT64_LIMIT = 1 << 64
_MAX_VARINT_BYTES = 10

_M = TypeVar("_M", bound=Message)


@dataclass(frozen=True, slots=True)
class DataChunk:
    """A data chunk as read off the wire: its offset and a view of its bytes (no copy)."""

    offset: int
    data: memoryview


class _ChunkMessage(Protocol):
    """An ``UploadChunk``, ``ResultChunk`` or ``UnmaskChunk`` as protobuf parsed it."""

    @property
    def data(self) -> Chunk: ...

    def WhichOneof(self, oneof_group: Literal["part"], /) -> str | None: ...


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_data_chunk(offset: int, data: bytes | bytearray | memoryview) -> bytes:
    """The data chunk message (field 2 of each chunk message) of ``data`` at ``offset``.

    Bytes-identical to ``pb.UploadChunk(data=pb.PayloadChunk(offset=offset,
    data=data)).SerializeToString()`` (and the same for ``ResultChunk`` and
    ``UnmaskChunk``); ``data`` is copied once, into the result.
    """
    if not 0 <= offset < _UINT64_LIMIT:
        raise ValueError(f"offset = {offset}: a chunk's offset must be a uint64.")
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    size = view.nbytes
    head = b""
    if offset:
        head += bytes((_OFFSET_TAG,)) + _varint(offset)
    if size:
        head += bytes((_DATA_TAG,)) + _varint(size)
    return b"".join((bytes((_DATA_TAG,)), _varint(len(head) + size), head, view))


def encoded_chunks(
    data: U64 | bytes | memoryview, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[bytes]:
    """``data`` as encoded data chunk messages of at most ``chunk_bytes`` bytes each.

    The same chunks as ``proto.chunks.payload_chunks``, each written by
    :func:`encode_data_chunk` (one copy of each slice, none of the whole).
    """
    for offset, view in chunk_views(data, chunk_bytes):
        yield encode_data_chunk(offset, view)


class ChunkEncoder:
    """Encoded data chunk messages of a payload handed over in pieces of any size.

    The chunks are those :func:`encoded_chunks` makes of the whole payload:
    cut every ``chunk_bytes`` bytes wherever the pieces end, each byte copied
    once into its message (a chunk that spans pieces gathers its bytes first).
    """

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        if not 0 < chunk_bytes <= CHUNK_BYTES:
            raise ValueError(f"chunk_bytes = {chunk_bytes}: must be between 1 and {CHUNK_BYTES}.")
        self.chunk_bytes = chunk_bytes
        self._chunks: list[bytes] = []
        self._carry = bytearray()  # the bytes of an unfinished chunk
        self._offset = 0  # where the next chunk starts

    def add(self, data: bytes | bytearray | memoryview) -> None:
        """Take the next ``data`` of the payload."""
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        size = self.chunk_bytes
        taken = 0
        if self._carry:
            taken = min(size - len(self._carry), len(view))
            self._carry += view[:taken]
            if len(self._carry) < size:
                return
            self._emit(self._carry)
            self._carry = bytearray()
        while len(view) - taken >= size:
            self._emit(view[taken : taken + size])
            taken += size
        self._carry += view[taken:]

    def _emit(self, data: bytes | bytearray | memoryview) -> None:
        self._chunks.append(encode_data_chunk(self._offset, data))
        self._offset += len(data)

    def finish(self) -> tuple[bytes, ...]:
        """Every chunk of the payload, the last one short if the payload is."""
        if self._carry:
            self._emit(self._carry)
            self._carry = bytearray()
        return tuple(self._chunks)


def encoded_file_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """A stored payload file as encoded data chunk messages, read one chunk at a time.

    The same chunks as ``proto.chunks.file_chunks``.
    """
    if not 0 < chunk_bytes <= CHUNK_BYTES:
        raise ValueError(f"chunk_bytes = {chunk_bytes}: must be between 1 and {CHUNK_BYTES}.")
    with path.open("rb") as handle:
        offset = 0
        while block := handle.read(chunk_bytes):
            yield encode_data_chunk(offset, block)
            offset += len(block)


def _read_varint(buffer: bytes, pos: int) -> tuple[int, int] | None:
    """(value, position after it) of a minimally written varint at ``pos``; else None."""
    value = 0
    shift = 0
    end = min(len(buffer), pos + _MAX_VARINT_BYTES)
    while pos < end:
        byte = buffer[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and shift:
                return None  # a trailing zero group: protobuf never writes one
            return value, pos
        shift += 7
    return None


def _delimited(buffer: bytes, pos: int) -> int | None:
    """Where the contents of a field 2 at ``pos`` start, if they run exactly to the end."""
    if pos >= len(buffer) or buffer[pos] != _DATA_TAG:
        return None
    read = _read_varint(buffer, pos + 1)
    if read is None or read[1] + read[0] != len(buffer):
        return None
    return read[1]


def decode_data_chunk(buffer: bytes) -> tuple[int, memoryview] | None:
    """(offset, view of the bytes) of a data chunk message written as protobuf writes one.

    None for anything else: another part, unknown or repeated fields,
    fields out of order, explicit zero values, non-minimal varints,
    truncated or trailing bytes. The view shares ``buffer``'s memory.
    """
    pos = _delimited(buffer, 0)
    if pos is None:
        return None
    offset = 0
    if pos < len(buffer) and buffer[pos] == _OFFSET_TAG:
        read = _read_varint(buffer, pos + 1)
        if read is None or not 0 < read[0] < _UINT64_LIMIT:
            return None
        offset, pos = read
    if pos == len(buffer):
        return offset, memoryview(b"")
    start = _delimited(buffer, pos)
    if start is None or start == len(buffer):
        return None
    return offset, memoryview(buffer)[start:]


def data_chunk_decoder(parse: Callable[[bytes], _M]) -> Callable[[bytes], DataChunk | _M]:
    """A deserializer: a :class:`DataChunk` for a data chunk as protobuf writes it, else ``parse``.

    ``parse`` is the message type's ``FromString``: whatever it raises on
    malformed bytes, the deserializer raises too.
    """

    def decode(buffer: bytes) -> DataChunk | _M:
        chunk = decode_data_chunk(buffer)
        if chunk is None:
            return parse(buffer)
        return DataChunk(chunk[0], chunk[1])

    return decode


def passthrough_serializer(message: bytes | Message) -> bytes:
    """A serializer: encoded bytes as they are, a protobuf message serialized."""
    if isinstance(message, bytes):
        return message
    return message.SerializeToString()


def message_part(message: DataChunk | _ChunkMessage) -> str | None:
    """The part a chunk message carries ("header", "data", "refusal"), None when empty."""
    if isinstance(message, DataChunk):
        return "data"
    return message.WhichOneof("part")


def as_data_chunk(message: DataChunk | _ChunkMessage) -> DataChunk | None:
    """The data chunk a message carries (its bytes not copied); None for any other part."""
    if isinstance(message, DataChunk):
        return message
    if message.WhichOneof("part") != "data":
        return None
    chunk = message.data
    return DataChunk(chunk.offset, memoryview(chunk.data))
