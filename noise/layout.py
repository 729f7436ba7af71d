"""Payload layouts: named tensors laid end to end in one flat vector of uint64 words.

Every payload of a session (an upload, an aggregate, unmask corrections, a
CAPE share) is the concatenation, in a fixed order, of named tensors flattened
in C order, one uint64 fixed-point word per entry (``noise.fixed_point``). A
:class:`Layout` says where each tensor sits. It is validated once, when it is
made: names are non-empty and distinct, every dimension is a non-negative
whole number, each tensor's size is the product of its shape and the tensors
follow each other from word 0 without gaps or overlaps. Everything downstream
(filling, splitting, encoding, decoding, the payload digest) can then rely on
it, on the node and on the coordinator alike.

The payload digest is BLAKE3-256 over the little-endian bytes of the words
(:func:`payload_digest`, :func:`payload_hasher`); it is what upload statements
sign and what the payload header carries. Both ends of every transfer hash
every byte of it, so it is the one hash on the round's path: BLAKE3 (O'Connor,
Aumasson, Neves & Wilcox-O'Hearn 2020; 128-bit collision resistance, like
SHA-256) runs several times faster than SHA-256 with the CPU's SHA extensions
(docs/design.md §4.4). What a person or another tool checks — an egress
bundle's files, a node's stored vectors — keeps SHA-256
(:func:`payload_sha256`), the checksum the contract names for them.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import blake3
import numpy as np
from numpy.typing import ArrayLike, NDArray

from noise.errors import NoiseError
from noise.fixed_point import FixedPointCodec

__all__ = [
    "DIGEST_BYTES",
    "WORD",
    "WORD_BYTES",
    "Layout",
    "LayoutError",
    "PayloadHasher",
    "TensorSlot",
    "as_words",
    "payload_digest",
    "payload_hasher",
    "payload_sha256",
]

WORD: Final = np.dtype("<u8")
WORD_BYTES: Final = 8
DIGEST_BYTES: Final = 32
# The running payload digest: update(bytes-like), then digest() -> 32 bytes.
PayloadHasher = blake3.blake3
U64 = NDArray[np.uint64]

# Tensor names appear in file names, CSV headers and key derivations: printable,
# without separators that would make a name ambiguous there.
_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/+-]{0,127}")
_NAME_RULE: Final = (
    "must be 1 to 128 characters from A-Z, a-z, 0-9 and _ . : / + -, starting with a letter "
    "or digit"
)


class LayoutError(NoiseError, ValueError):
    """A layout, or a vector or tensor set that should match one, is malformed."""


@dataclass(frozen=True)
class TensorSlot:
    """One named tensor in a flat payload; ``offset`` and ``size`` count uint64 words."""

    name: str
    shape: tuple[int, ...]
    offset: int
    size: int

    def describe(self) -> str:
        """``'sum_xx' (55,) at word 4``, for messages."""
        return f"{self.name!r} {self.shape} at word {self.offset}"


def _shape(name: str, shape: object) -> tuple[int, ...]:
    if isinstance(shape, str | bytes) or not isinstance(shape, Iterable):
        raise LayoutError(f"tensor {name!r} has shape {shape!r}; a shape is a list of sizes")
    dims = tuple(shape)
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 0:
            raise LayoutError(
                f"tensor {name!r} has shape {dims!r}; every dimension must be a whole number >= 0"
            )
    return tuple(int(d) for d in dims)


class Layout:
    """The named tensors of a payload, in order, validated once (see the module docstring).

    Layouts compare equal when their slots do (names, shapes, offsets, sizes,
    in order).
    """

    __slots__ = ("_index", "slots")

    slots: tuple[TensorSlot, ...]
    _index: dict[str, TensorSlot]

    def __init__(self, slots: Iterable[TensorSlot]) -> None:
        checked = tuple(slots)
        if not checked:
            raise LayoutError("a layout needs at least one tensor")
        index: dict[str, TensorSlot] = {}
        position = 0
        for slot in checked:
            if not isinstance(slot, TensorSlot):
                raise LayoutError(f"a layout is made of TensorSlots; got {slot!r}")
            if not isinstance(slot.name, str) or _NAME_RE.fullmatch(slot.name) is None:
                raise LayoutError(f"tensor name {slot.name!r} {_NAME_RULE}")
            if slot.name in index:
                raise LayoutError(f"tensor {slot.name!r} is listed twice")
            shape = _shape(slot.name, slot.shape)
            if shape != slot.shape:
                raise LayoutError(f"tensor {slot.name!r} has shape {slot.shape!r}; use a tuple")
            if slot.size != math.prod(shape):
                raise LayoutError(
                    f"tensor {slot.name!r} has shape {shape} ({math.prod(shape)} words) but "
                    f"size {slot.size}"
                )
            if slot.offset != position:
                raise LayoutError(
                    f"tensor {slot.name!r} starts at word {slot.offset}; the tensors before it "
                    f"end at word {position} (tensors follow each other without gaps)"
                )
            index[slot.name] = slot
            position += slot.size
        object.__setattr__(self, "slots", checked)
        object.__setattr__(self, "_index", index)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Layout is immutable")

    # ---------------------------------------------------------------- making

    @classmethod
    def of(
        cls, shapes: Mapping[str, Sequence[int]] | Iterable[tuple[str, Sequence[int]]]
    ) -> Layout:
        """The layout of tensors with these names and shapes, end to end in this order."""
        items = shapes.items() if isinstance(shapes, Mapping) else shapes
        slots = []
        offset = 0
        for name, shape in items:
            dims = _shape(str(name), shape)
            size = math.prod(dims)
            slots.append(TensorSlot(name, dims, offset, size))
            offset += size
        return cls(slots)

    @classmethod
    def of_tensors(cls, tensors: Mapping[str, ArrayLike]) -> Layout:
        """The layout of ``tensors`` (their shapes, in mapping order)."""
        return cls.of((name, np.shape(value)) for name, value in tensors.items())

    @classmethod
    def from_json(cls, data: object) -> Layout:
        """Inverse of :meth:`to_json`: a list of ``{"name": ..., "shape": [...]}``."""
        if not isinstance(data, list):
            raise LayoutError(f"a layout is a list of tensors; got {type(data).__name__}")
        items = []
        for position, item in enumerate(data):
            if not isinstance(item, Mapping) or set(item) - {"name", "shape", "offset", "size"}:
                raise LayoutError(
                    f"tensor {position} of the layout must be a table with name and shape"
                )
            name, shape = item.get("name"), item.get("shape")
            if not isinstance(name, str):
                raise LayoutError(f"tensor {position} of the layout has no name")
            items.append((name, _shape(name, shape)))
        layout = cls.of(items)
        for item, slot in zip(data, layout, strict=True):
            for key in ("offset", "size"):
                if key in item and item[key] != getattr(slot, key):
                    raise LayoutError(
                        f"tensor {slot.name!r} has {key} {item[key]!r}; its place in the layout "
                        f"gives {getattr(slot, key)}"
                    )
        return layout

    def to_json(self) -> list[dict[str, Any]]:
        """Names and shapes in order (offsets follow from them)."""
        return [{"name": s.name, "shape": list(s.shape)} for s in self.slots]

    # ---------------------------------------------------------------- reading

    @property
    def size(self) -> int:
        """Number of uint64 words of a payload of this layout."""
        last = self.slots[-1]
        return last.offset + last.size

    @property
    def nbytes(self) -> int:
        return WORD_BYTES * self.size

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {s.name: s.shape for s in self.slots}

    def slot(self, name: str) -> TensorSlot:
        """The slot of tensor ``name``; KeyError naming the layout's tensors when absent."""
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(
                f"tensor {name!r} is not in the layout ({', '.join(self.names)})"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterator[TensorSlot]:
        return iter(self.slots)

    def __len__(self) -> int:
        return len(self.slots)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self.slots == other.slots

    def __hash__(self) -> int:
        return hash(self.slots)

    def __repr__(self) -> str:
        inner = ", ".join(f"{s.name}{list(s.shape)}" for s in self.slots)
        return f"Layout({inner})"

    def difference(self, other: Layout) -> str | None:
        """The first way ``other`` differs from this layout, as a sentence; None when equal."""
        for mine, theirs in zip(self.slots, other.slots, strict=False):
            if mine.name != theirs.name:
                return f"tensor {theirs.name!r} stands where {mine.name!r} {mine.shape} belongs"
            if mine.shape != theirs.shape:
                return f"tensor {theirs.name!r} has shape {theirs.shape}; expected {mine.shape}"
        if len(other) < len(self):
            return f"tensor {self.slots[len(other)].name!r} is missing"
        if len(other) > len(self):
            return f"tensor {other.slots[len(self)].name!r} is not part of the layout"
        return None

    # ---------------------------------------------------------------- vectors

    def build(
        self, part: Callable[[TensorSlot], ArrayLike], dtype: type[np.generic] = np.uint64
    ) -> NDArray[Any]:
        """A vector of this layout whose slot ``s`` holds ``part(s)`` (flattened, checked)."""
        out = np.empty(self.size, dtype=dtype)
        for slot in self.slots:
            value = np.asarray(part(slot))
            if value.size != slot.size:
                raise LayoutError(
                    f"tensor {slot.name!r}: {value.size} values for a slot of {slot.size}"
                )
            out[slot.offset : slot.offset + slot.size] = value.reshape(-1)
        return out

    def check_vector(self, vector: NDArray[Any], *, what: str = "payload") -> None:
        """Raise LayoutError unless ``vector`` is one-dimensional with :attr:`size` entries."""
        if vector.ndim != 1 or vector.shape[0] != self.size:
            raise LayoutError(
                f"{what} has shape {vector.shape}; this layout needs {self.size} words"
            )

    def check_tensors(self, tensors: Mapping[str, ArrayLike], *, what: str = "tensors") -> None:
        """Raise LayoutError unless ``tensors`` has exactly this layout's names and shapes."""
        missing = [n for n in self.names if n not in tensors]
        extra = [n for n in tensors if n not in self._index]
        if missing or extra:
            raise LayoutError(
                f"{what} do not match the layout: missing {missing or 'none'}, unexpected "
                f"{extra or 'none'}"
            )
        for slot in self.slots:
            shape = tuple(np.shape(tensors[slot.name]))
            if shape != slot.shape:
                raise LayoutError(
                    f"{what}: tensor {slot.name!r} has shape {shape}; the layout expects "
                    f"{slot.shape}"
                )

    def encode(self, tensors: Mapping[str, ArrayLike], codec: FixedPointCodec) -> U64:
        """q(x): every tensor in fixed point in its slot (FixedPointError names a bad entry)."""
        self.check_tensors(tensors)
        encoded: U64 = self.build(
            lambda slot: codec.encode(np.asarray(tensors[slot.name]), tensor=slot.name)
        )
        return encoded

    def split(self, vector: NDArray[Any]) -> dict[str, NDArray[Any]]:
        """The tensors of ``vector`` by name, each a view reshaped to its shape."""
        self.check_vector(vector)
        return {s.name: vector[s.offset : s.offset + s.size].reshape(s.shape) for s in self.slots}

    def decode(self, words: U64, codec: FixedPointCodec) -> dict[str, NDArray[np.float64]]:
        """The tensors of a fixed-point payload in real numbers (``codec.decode``)."""
        self.check_vector(words)
        return self.split(codec.decode(np.asarray(words)))


def as_words(vector: ArrayLike) -> U64:
    """``vector`` as a contiguous little-endian uint64 array (a view when it already is one)."""
    array = np.asarray(vector)
    if array.dtype.kind != "u" or array.dtype.itemsize != WORD_BYTES:
        raise LayoutError(f"a payload is made of uint64 words; got dtype {array.dtype}")
    words: U64 = np.ascontiguousarray(array, dtype=WORD)
    return words


def payload_hasher() -> PayloadHasher:
    """A running payload digest, for bytes that arrive or leave piece by piece."""
    return blake3.blake3()


def payload_digest(words: ArrayLike) -> bytes:
    """The payload digest: BLAKE3-256 (32 raw bytes) of its little-endian uint64 words."""
    return blake3.blake3(as_words(words).view(np.uint8).data).digest()


def payload_sha256(words: ArrayLike) -> bytes:
    """SHA-256 (32 raw bytes) of the little-endian words: the checksum of a stored vector."""
    return hashlib.sha256(as_words(words).view(np.uint8).data).digest()
