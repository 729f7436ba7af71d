"""Mutations of protobuf messages for the fuzzer: field, wire and stream level, and random ones.

Every function draws from the ``numpy.random.Generator`` it is given and
returns, with the mutated value, a few words saying what it did, so that a
failing case can be read and replayed (tests/campaign/fuzz.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from google.protobuf.message import Message

__all__ = ["mutate_field", "mutate_stream", "mutate_wire", "rand_bytes", "random_message"]


# ---------------------------------------------------------------- value pools

_INT_EXTREMES = {
    "int32": (0, 1, -1, 2**31 - 1, -(2**31)),
    "int64": (0, 1, -1, 2**63 - 1, -(2**63), 2**31, 10**15),
    "uint32": (0, 1, 2, 2**31, 2**32 - 1),
    "uint64": (0, 1, 2**31, 2**32, 2**53 + 1, 2**63, 2**64 - 1),
}
_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}
_DOUBLES = (0.0, -0.0, -1.0, 1e-9, 1e308, -1e308, math.inf, -math.inf, math.nan)
_STRINGS = (
    "",
    "a",
    "b",
    "c",
    "d",
    "zed",
    "moments",
    "scatter",
    "cape-sum/moments",
    "\x1b[31mred\x1b[0m",
    "a\x00b",
    "../../etc/passwd",
    '=HYPERLINK("x")',
    "é" * 40,
    "\U0001f600",
)


def _int_kind(fd: Any) -> str | None:
    return {
        fd.TYPE_INT32: "int32",
        fd.TYPE_SINT32: "int32",
        fd.TYPE_INT64: "int64",
        fd.TYPE_SINT64: "int64",
        fd.TYPE_UINT32: "uint32",
        fd.TYPE_UINT64: "uint64",
        fd.TYPE_ENUM: "int32",
    }.get(fd.type)


def rand_bytes(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def _flip_bits(data: bytes, rng: np.random.Generator, flips: int) -> bytes:
    if not data:
        return bytes([1 << int(rng.integers(8))])
    out = bytearray(data)
    for _ in range(flips):
        position = int(rng.integers(len(out) * 8))
        out[position // 8] ^= 1 << (position % 8)
    return bytes(out)


# The ways a bytes field is replaced, drawn uniformly; each draws what else it needs.
_BYTES_MUTATIONS: tuple[tuple[str, Callable[[bytes, np.random.Generator], bytes]], ...] = (
    ("bit flips", lambda old, rng: _flip_bits(old, rng, int(rng.integers(1, 4)))),
    ("truncated", lambda old, rng: old[: int(rng.integers(len(old) + 1))]),
    ("extended", lambda old, rng: old + rand_bytes(rng, int(rng.integers(1, 40)))),
    ("emptied", lambda old, rng: b""),
    ("random, same length", lambda old, rng: rand_bytes(rng, len(old))),
    ("random length", lambda old, rng: rand_bytes(rng, int(rng.integers(0, 100)))),
    ("zeroed", lambda old, rng: bytes(len(old))),
)


def _new_bytes(old: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    label, mutate = _BYTES_MUTATIONS[int(rng.integers(len(_BYTES_MUTATIONS)))]
    return mutate(old, rng), label


def _new_string(old: str, rng: np.random.Generator) -> tuple[str, str]:
    choice = int(rng.integers(6))
    if choice <= 1:
        value = _STRINGS[int(rng.integers(len(_STRINGS)))]
        return value, f"set to {value[:20]!r}"
    if choice == 2:
        return old[: int(rng.integers(len(old) + 1))], "truncated"
    if choice == 3:
        cut = int(rng.integers(len(old) + 1))
        return old[:cut] + chr(int(rng.integers(32, 0x2FF))) + old[cut:], "a character inserted"
    if choice == 4:
        size = int(rng.choice([1001, 70_000, 70_000, 3 << 20]))
        return "x" * size, f"{size} characters"
    return old.upper() + " ", "changed case, trailing space"


def _new_int(old: int, kind: str, rng: np.random.Generator) -> tuple[int, str]:
    low, high = _INT_RANGES[kind]
    choice = int(rng.integers(3))
    if choice == 0:
        pool = _INT_EXTREMES[kind]
        value = int(pool[int(rng.integers(len(pool)))])
    elif choice == 1:
        value = min(high, max(low, old + int(rng.choice([-1, 1]))))
    else:
        # Uniform over the type's range, drawn as a float and clipped: coverage, not precision.
        value = min(high, max(low, int(rng.uniform(float(low), float(high)))))
    return value, f"set to {value}"


# ---------------------------------------------------------------- field-level mutation


def _locations(message: Message, path: str = "") -> list[tuple[Message, Any, str]]:
    """Every field of ``message`` and of its set sub-messages: (parent, descriptor, path)."""
    found: list[tuple[Message, Any, str]] = []
    for fd in message.DESCRIPTOR.fields:
        where = f"{path}.{fd.name}" if path else fd.name
        found.append((message, fd, where))
        if fd.type != fd.TYPE_MESSAGE:
            continue
        if fd.is_repeated:
            for i, item in enumerate(getattr(message, fd.name)):
                found.extend(_locations(item, f"{where}[{i}]"))
        elif message.HasField(fd.name):
            found.extend(_locations(getattr(message, fd.name), where))
    return found


def _mutate_repeated(parent: Message, fd: Any, rng: np.random.Generator) -> str:
    values = getattr(parent, fd.name)
    items = list(values)
    choice = int(rng.integers(5))
    if choice == 0 or not items:
        if fd.type == fd.TYPE_MESSAGE:
            values.add()
            return "an empty element appended"
        filler: Any = b"" if fd.type == fd.TYPE_BYTES else "" if fd.type == fd.TYPE_STRING else 0
        values.append(items[0] if items else filler)
        return "an element appended"
    if choice == 1:
        del values[int(rng.integers(len(items)))]
        return "an element removed"
    if choice == 2:
        parent.ClearField(fd.name)
        return "cleared"
    if choice == 3:
        if fd.type == fd.TYPE_MESSAGE:
            values.add().CopyFrom(items[int(rng.integers(len(items)))])
        else:
            values.append(items[int(rng.integers(len(items)))])
        return "an element duplicated"
    order = rng.permutation(len(items))
    parent.ClearField(fd.name)
    for i in order:
        if fd.type == fd.TYPE_MESSAGE:
            values.add().CopyFrom(items[int(i)])
        else:
            values.append(items[int(i)])
    return "elements reordered"


def mutate_field(message: Message, rng: np.random.Generator) -> str:
    """Change one field somewhere in ``message`` (in place); what was done."""
    locations = _locations(message)
    parent, fd, where = locations[int(rng.integers(len(locations)))]
    if fd.is_repeated and (fd.type == fd.TYPE_MESSAGE or rng.random() < 0.5):
        return f"{where}: {_mutate_repeated(parent, fd, rng)}"
    if fd.is_repeated:
        values = getattr(parent, fd.name)
        if not values:
            return f"{where}: {_mutate_repeated(parent, fd, rng)}"
        i = int(rng.integers(len(values)))
        old = values[i]
        new, what = _new_scalar(fd, old, rng)
        values[i] = new
        return f"{where}[{i}]: {what}"
    if fd.type == fd.TYPE_MESSAGE:
        if parent.HasField(fd.name) and rng.random() < 0.5:
            parent.ClearField(fd.name)
            return f"{where}: cleared"
        getattr(parent, fd.name).SetInParent()
        return f"{where}: set (empty)"
    new, what = _new_scalar(fd, getattr(parent, fd.name), rng)
    setattr(parent, fd.name, new)
    return f"{where}: {what}"


def _new_scalar(fd: Any, old: Any, rng: np.random.Generator) -> tuple[Any, str]:
    if fd.type == fd.TYPE_BYTES:
        return _new_bytes(bytes(old), rng)
    if fd.type == fd.TYPE_STRING:
        return _new_string(str(old), rng)
    if fd.type == fd.TYPE_BOOL:
        return (not old), "flipped"
    if fd.type in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        value = _DOUBLES[int(rng.integers(len(_DOUBLES)))]
        return value, f"set to {value}"
    kind = _int_kind(fd)
    assert kind is not None, f"no mutation for field type {fd.type}"
    return _new_int(int(old), kind, rng)


def random_message(cls: type[Message], rng: np.random.Generator, depth: int = 0) -> Message:
    """A message of type ``cls`` with random values in a random half of its fields."""
    message = cls()
    for fd in cls.DESCRIPTOR.fields:
        if rng.random() < 0.5:
            continue
        if fd.type == fd.TYPE_MESSAGE:
            if depth >= 3:
                continue
            child_cls = type(getattr(message, fd.name)) if not fd.is_repeated else None
            if fd.is_repeated:
                for _ in range(int(rng.integers(1, 4))):
                    item = getattr(message, fd.name).add()
                    item.CopyFrom(random_message(type(item), rng, depth + 1))
            else:
                assert child_cls is not None
                getattr(message, fd.name).CopyFrom(random_message(child_cls, rng, depth + 1))
            continue
        count = int(rng.integers(1, 4)) if fd.is_repeated else 1
        for _ in range(count):
            value, _ = _new_scalar(fd, fd.default_value if not fd.is_repeated else _zero(fd), rng)
            if fd.is_repeated:
                getattr(message, fd.name).append(value)
            else:
                setattr(message, fd.name, value)
    return message


def _zero(fd: Any) -> Any:
    if fd.type == fd.TYPE_BYTES:
        return b""
    if fd.type == fd.TYPE_STRING:
        return ""
    if fd.type == fd.TYPE_BOOL:
        return False
    if fd.type in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        return 0.0
    return 0


# ---------------------------------------------------------------- wire-level mutation


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("bad varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def _fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """Top-level (field number, wire type, raw value) of a well-formed message."""
    fields, position = [], 0
    while position < len(data):
        tag, position = _read_varint(data, position)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            start = position
            _, position = _read_varint(data, position)
            value = data[start:position]
        elif wire == 2:
            length, position = _read_varint(data, position)
            value = data[position : position + length]
            position += length
        elif wire == 1:
            value, position = data[position : position + 8], position + 8
        elif wire == 5:
            value, position = data[position : position + 4], position + 4
        else:
            raise ValueError("unsupported wire type")
        fields.append((number, wire, value))
    return fields


def _encode(fields: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        out += _varint(len(value)) + value if wire == 2 else value
    return bytes(out)


def mutate_wire(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:  # noqa: PLR0911 - one return per kind of wire damage, drawn here so that a seed replays it
    choice = int(rng.integers(6))
    if choice == 0:
        flips = int(rng.integers(1, 9))
        return _flip_bits(data, rng, flips), f"wire: {flips} bit flips"
    if choice == 1:
        cut = int(rng.integers(len(data) + 1))
        return data[:cut], f"wire: truncated to {cut} of {len(data)} bytes"
    if choice == 2:
        at = int(rng.integers(len(data) + 1))
        return data[:at] + rand_bytes(rng, int(rng.integers(1, 9))) + data[
            at:
        ], "wire: bytes inserted"
    if choice == 3:
        number = int(rng.choice([15, 999, 536_870_911]))
        return data + _encode([(number, 0, _varint(7))]), f"wire: unknown field {number}"
    try:
        fields = _fields(data)
    except ValueError:
        return data, "wire: unchanged (not parsable)"
    if not fields:
        return data + _encode([(1, 0, _varint(1))]), "wire: field 1 added as a varint"
    i = int(rng.integers(len(fields)))
    number, wire, value = fields[i]
    if choice == 4:
        # Another wire type for the same field number: a wrong type on the wire.
        if wire == 2:
            fields[i] = (number, 0, _varint(len(value)))
        else:
            fields[i] = (number, 2, value)
        return _encode(fields), f"wire: field {number} re-encoded with another wire type"
    fields.insert(i, (number, wire, value))
    return _encode(fields), f"wire: field {number} repeated"


# ---------------------------------------------------------------- stream-level mutation


def mutate_stream(messages: list[bytes], rng: np.random.Generator, cls: type[Message]) -> str:
    choice = int(rng.integers(6))
    if choice == 0 and messages:
        del messages[int(rng.integers(len(messages)))]
        return "stream: a message dropped"
    if choice == 1 and messages:
        i = int(rng.integers(len(messages)))
        messages.insert(i, messages[i])
        return "stream: a message repeated"
    if choice == 2 and len(messages) > 1:
        messages.reverse()
        return "stream: order reversed"
    if choice == 3:
        messages.clear()
        return "stream: empty"
    if choice == 4 and messages:
        messages.append(messages[0])
        return "stream: the header again at the end"
    chunk = cls()
    offset = int(rng.choice([0, 8, 288, 2**63, int(rng.integers(0, 4096))]))
    chunk.data.offset = offset  # type: ignore[attr-defined]
    chunk.data.data = rand_bytes(rng, int(rng.choice([0, 1, 8, 288, 3000])))  # type: ignore[attr-defined]
    messages.append(chunk.SerializeToString())
    return f"stream: a data chunk at offset {offset} appended"
