"""Payload layouts: where each named tensor sits in a flat uint64 payload.

The coordinator never interprets tensors; it only checks that a payload
header describes a well-formed layout (contiguous, in order, sizes equal to
the product of the shapes, byte count equal to eight times the word count)
and that every node of a round sends exactly the same layout, so that the
word-by-word sum is a sum of like with like.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.errors import InvalidArgument
from proto.chunks import TensorSlot

__all__ = [
    "MAX_FIXED_POINT_BITS",
    "PayloadSpec",
    "TensorSlot",
    "compare_layouts",
    "layout_from_json",
    "layout_to_json",
    "validate_payload",
]

MAX_FIXED_POINT_BITS = 62


@dataclass(frozen=True)
class PayloadSpec:
    """What a payload header promises: size, checksum, fixed-point scale and layout."""

    total_bytes: int
    total_elements: int
    sha256: bytes
    fixed_point_bits: int
    tensors: tuple[TensorSlot, ...]


def validate_payload(spec: PayloadSpec, *, what: str, max_bytes: int) -> None:
    """Check that ``spec`` is self-consistent; raise InvalidArgument naming the fault.

    ``what`` names the payload in messages (e.g. "upload of node 'a' for round 0").
    """
    if len(spec.sha256) != 32:
        raise InvalidArgument(f"{what}: sha256 must be 32 raw bytes; got {len(spec.sha256)} bytes.")
    if spec.total_elements <= 0:
        raise InvalidArgument(
            f"{what}: total_elements is {spec.total_elements}; a payload holds at least one word."
        )
    if spec.total_bytes != 8 * spec.total_elements:
        raise InvalidArgument(
            f"{what}: total_bytes is {spec.total_bytes} but {spec.total_elements} uint64 "
            f"words take {8 * spec.total_elements} bytes."
        )
    if spec.total_bytes > max_bytes:
        raise InvalidArgument(
            f"{what}: total_bytes is {spec.total_bytes}; this coordinator accepts payloads "
            f"of at most {max_bytes} bytes."
        )
    if not 0 <= spec.fixed_point_bits <= MAX_FIXED_POINT_BITS:
        raise InvalidArgument(
            f"{what}: fixed_point_bits is {spec.fixed_point_bits}; it must be between 0 "
            f"and {MAX_FIXED_POINT_BITS}."
        )
    if not spec.tensors:
        raise InvalidArgument(f"{what}: the header lists no tensors.")
    seen: set[str] = set()
    expected_offset = 0
    for slot in spec.tensors:
        if not slot.name:
            raise InvalidArgument(f"{what}: a tensor at word {slot.offset} has an empty name.")
        if slot.name in seen:
            raise InvalidArgument(f"{what}: tensor {slot.name!r} is listed twice.")
        seen.add(slot.name)
        product = math.prod(slot.shape)
        if slot.size != product:
            raise InvalidArgument(
                f"{what}: tensor {slot.name!r} has shape {slot.shape} ({product} words) "
                f"but size {slot.size}."
            )
        if slot.offset != expected_offset:
            raise InvalidArgument(
                f"{what}: tensor {slot.name!r} starts at word {slot.offset}; the previous "
                f"tensors end at word {expected_offset} (tensors must be contiguous, in order)."
            )
        expected_offset += slot.size
    if expected_offset != spec.total_elements:
        raise InvalidArgument(
            f"{what}: the tensors cover {expected_offset} words but total_elements is "
            f"{spec.total_elements}."
        )


def compare_layouts(
    got: Sequence[TensorSlot], expected: Sequence[TensorSlot], *, what: str
) -> None:
    """Raise InvalidArgument naming the first tensor where ``got`` differs from ``expected``."""
    expected_by_name = {slot.name: slot for slot in expected}
    for slot in got:
        reference = expected_by_name.get(slot.name)
        if reference is None:
            names = ", ".join(repr(s.name) for s in expected)
            raise InvalidArgument(
                f"{what}: tensor {slot.name!r} is not in this round's layout ({names})."
            )
        if slot.shape != reference.shape:
            raise InvalidArgument(
                f"{what}: tensor {slot.name!r} has shape {slot.shape}; expected {reference.shape}."
            )
        if slot.offset != reference.offset:
            raise InvalidArgument(
                f"{what}: tensor {slot.name!r} starts at word {slot.offset}; "
                f"expected word {reference.offset}."
            )
    missing = [s.name for s in expected if s.name not in {g.name for g in got}]
    if missing:
        raise InvalidArgument(f"{what}: tensor {missing[0]!r} of this round's layout is missing.")


def layout_to_json(tensors: Sequence[TensorSlot]) -> str:
    """Canonical JSON text of a layout (stored in the state file)."""
    return json.dumps(
        [
            {"name": s.name, "shape": list(s.shape), "offset": s.offset, "size": s.size}
            for s in tensors
        ],
        separators=(",", ":"),
    )


def layout_from_json(text: str) -> tuple[TensorSlot, ...]:
    """Inverse of :func:`layout_to_json`."""
    return tuple(
        TensorSlot(
            name=str(item["name"]),
            shape=tuple(int(n) for n in item["shape"]),
            offset=int(item["offset"]),
            size=int(item["size"]),
        )
        for item in json.loads(text)
    )
