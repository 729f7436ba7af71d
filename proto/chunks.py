"""Payloads on the wire: named uint64 tensors, flattened, hashed and chunked.

Every payload of the session protocol (an upload, an aggregate, unmask
corrections) is the concatenation of named tensors of uint64 fixed-point words,
little-endian, described by a ``PayloadHeader`` (total size, SHA-256, layout)
and sent as ``PayloadChunk`` messages of at most :data:`CHUNK_BYTES` bytes, so
no message comes near gRPC's 4 MiB default limit whatever the model size.
Both ends use this module, so they cannot disagree on the byte layout.

* :func:`pack_tensors` / :func:`unpack_tensors`: tensors <-> bytes + layout;
* :func:`payload_header`: the header for a packed payload;
* :func:`payload_chunks`: the chunk messages for it;
* :class:`PayloadAssembler`: rebuilds a payload from chunks and checks offsets,
  size and SHA-256 against the header, raising :class:`PayloadError`; the one
  place where a downloaded payload is put back together.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from proto.zerosum.v1 import session_pb2 as pb

__all__ = [
    "CHUNK_BYTES",
    "WORD_BYTES",
    "PayloadAssembler",
    "PayloadError",
    "TensorSlot",
    "check_layout",
    "pack_tensors",
    "payload_chunks",
    "payload_header",
    "unpack_tensors",
]

CHUNK_BYTES = 1 << 20  # 1 MiB: a quarter of gRPC's default message limit
WORD_BYTES = 8
_LE_U64 = np.dtype("<u8")


@dataclass(frozen=True)
class TensorSlot:
    """One named tensor in a flat payload; ``offset`` and ``size`` count uint64 words.

    The plain-Python form of ``TensorLayout``, shared by node and coordinator.
    """

    name: str
    shape: tuple[int, ...]
    offset: int
    size: int

    def describe(self) -> str:
        """``'sxx' (10, 10) at word 4``, for messages."""
        return f"{self.name!r} {self.shape} at word {self.offset}"


class PayloadError(ValueError):
    """A payload, its header or its chunks are inconsistent; the message says how."""


def pack_tensors(
    tensors: Mapping[str, NDArray[np.uint64]],
) -> tuple[bytes, list[pb.TensorLayout]]:
    """Flatten tensors (in the mapping's order) into little-endian bytes and a layout."""
    layouts: list[pb.TensorLayout] = []
    parts: list[bytes] = []
    offset = 0
    for name, array in tensors.items():
        values = np.asarray(array)
        if values.dtype != np.uint64:
            raise PayloadError(f"tensor {name!r} has dtype {values.dtype}; expected uint64.")
        size = int(values.size)
        layouts.append(
            pb.TensorLayout(name=name, shape=list(values.shape), offset=offset, size=size)
        )
        parts.append(np.ascontiguousarray(values, dtype=_LE_U64).tobytes())
        offset += size
    return b"".join(parts), layouts


def check_layout(layouts: Sequence[pb.TensorLayout], total_elements: int) -> None:
    """Raise PayloadError unless the layout tiles ``total_elements`` words exactly."""
    expected_offset = 0
    names: set[str] = set()
    for layout in layouts:
        if not layout.name or layout.name in names:
            raise PayloadError(f"tensor name {layout.name!r} is empty or repeated in the layout.")
        names.add(layout.name)
        shape = tuple(layout.shape)
        if math.prod(shape) != layout.size:
            raise PayloadError(
                f"tensor {layout.name!r} has shape {shape} but size {layout.size}; "
                f"expected {math.prod(shape)}."
            )
        if layout.offset != expected_offset:
            raise PayloadError(
                f"tensor {layout.name!r} starts at element {layout.offset}; "
                f"expected {expected_offset} (no gaps or overlaps)."
            )
        expected_offset += layout.size
    if expected_offset != total_elements:
        raise PayloadError(
            f"layout covers {expected_offset} elements but the payload has {total_elements}."
        )


def unpack_tensors(
    data: bytes, layouts: Sequence[pb.TensorLayout]
) -> dict[str, NDArray[np.uint64]]:
    """Split a payload into named uint64 arrays (native byte order) following ``layouts``."""
    if len(data) % WORD_BYTES:
        raise PayloadError(f"payload of {len(data)} bytes is not a whole number of uint64 words.")
    words = np.frombuffer(data, dtype=_LE_U64)
    check_layout(layouts, int(words.size))
    return {
        layout.name: words[layout.offset : layout.offset + layout.size]
        .astype(np.uint64)
        .reshape(tuple(layout.shape))
        for layout in layouts
    }


def payload_header(
    data: bytes, layouts: Sequence[pb.TensorLayout], fixed_point_bits: int
) -> pb.PayloadHeader:
    """The header describing ``data``: sizes, SHA-256, scale and layout (checked)."""
    if len(data) % WORD_BYTES:
        raise PayloadError(f"payload of {len(data)} bytes is not a whole number of uint64 words.")
    check_layout(layouts, len(data) // WORD_BYTES)
    return pb.PayloadHeader(
        total_bytes=len(data),
        total_elements=len(data) // WORD_BYTES,
        sha256=hashlib.sha256(data).digest(),
        fixed_point_bits=fixed_point_bits,
        tensors=list(layouts),
    )


def payload_chunks(
    data: bytes | memoryview, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[pb.PayloadChunk]:
    """``data`` as consecutive chunks of at most ``chunk_bytes`` bytes (none when empty).

    ``data`` may be a byte view of an array: each chunk copies only its own slice.
    """
    if not 0 < chunk_bytes <= CHUNK_BYTES:
        raise ValueError(f"chunk_bytes = {chunk_bytes}: must be between 1 and {CHUNK_BYTES}.")
    view = memoryview(data)
    for start in range(0, len(data), chunk_bytes):
        yield pb.PayloadChunk(offset=start, data=bytes(view[start : start + chunk_bytes]))


class PayloadAssembler:
    """Collects the chunks announced by a header and returns the verified payload.

    The payload's words are written straight into one buffer allocated from
    the header's size (each chunk is copied once, through a memoryview) and
    hashed as they arrive, so :meth:`finish_words` needs no further copy and
    no second pass over the data.
    """

    def __init__(self, header: pb.PayloadHeader, *, max_bytes: int | None = None) -> None:
        if header.total_bytes != WORD_BYTES * header.total_elements:
            raise PayloadError(
                f"header announces {header.total_bytes} bytes for {header.total_elements} "
                f"elements; expected {WORD_BYTES * header.total_elements}."
            )
        if max_bytes is not None and header.total_bytes > max_bytes:
            raise PayloadError(
                f"payload of {header.total_bytes} bytes exceeds the limit of {max_bytes} bytes."
            )
        if len(header.sha256) != 32:
            raise PayloadError(f"header sha256 has {len(header.sha256)} bytes; expected 32.")
        check_layout(header.tensors, header.total_elements)
        self.header = header
        self._words: NDArray[np.uint64] = np.empty(int(header.total_elements), dtype=_LE_U64)
        self._target = self._words.view(np.uint8).data
        self._digest = hashlib.sha256()
        self._filled = 0
        self._verified = False

    @property
    def received_bytes(self) -> int:
        return self._filled

    def add(self, chunk: pb.PayloadChunk) -> None:
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
        self._digest.update(data)
        self._filled = end

    def _verify(self) -> None:
        if self._verified:
            return
        if self._filled != self.header.total_bytes:
            raise PayloadError(
                f"received {self._filled} of the {self.header.total_bytes} bytes announced."
            )
        if self._digest.digest() != self.header.sha256:
            raise PayloadError("payload SHA-256 does not match the header; it was altered.")
        self._verified = True

    def finish_words(self) -> NDArray[np.uint64]:
        """The complete payload as uint64 words, after checking size and SHA-256.

        On a little-endian machine this is the assembler's own buffer (no copy).
        """
        self._verify()
        if self._words.dtype == np.dtype(np.uint64):
            return self._words
        return self._words.astype(np.uint64)  # pragma: no cover - big-endian hosts only

    def finish(self) -> bytes:
        """The complete payload as bytes, after checking its size and SHA-256."""
        self._verify()
        return bytes(self._target)
