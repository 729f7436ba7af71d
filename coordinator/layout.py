"""Payload headers as the coordinator checks them: size, checksum, scale and layout.

The coordinator never interprets tensors. It checks that a payload header is
self-consistent (a well-formed :class:`noise.layout.Layout`, a byte count of
eight times the word count, a 32-byte digest, a sane fixed-point scale, a size
within its limit) and that every payload of a round has exactly the same
layout, so that the word-by-word sum adds like to like.
"""

from __future__ import annotations

from coordinator.errors import InvalidArgument
from noise.layout import DIGEST_BYTES, Layout, LayoutError, TensorSlot
from proto.messages import (
    PayloadSpec,
)

__all__ = [
    "MAX_FIXED_POINT_BITS",
    "PayloadSpec",
    "TensorSlot",
    "check_announced_size",
    "check_same_layout",
    "validate_payload",
]

MAX_FIXED_POINT_BITS = 62


def validate_payload(spec: PayloadSpec, *, what: str, max_bytes: int) -> Layout:
    """The layout of ``spec`` once it is self-consistent; InvalidArgument naming the fault.

    ``what`` names the payload in messages (e.g. "upload of node 'a' for round 0").
    """
    if len(spec.digest) != DIGEST_BYTES:
        raise InvalidArgument(
            f"{what}: digest must be {DIGEST_BYTES} raw bytes; got {len(spec.digest)} bytes."
        )
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
    try:
        layout = Layout(spec.tensors)
    except LayoutError as error:
        raise InvalidArgument(f"{what}: {error}.") from None
    if layout.size != spec.total_elements:
        raise InvalidArgument(
            f"{what}: the tensors cover {layout.size} words but total_elements is "
            f"{spec.total_elements}."
        )
    return layout


def check_same_layout(got: Layout, expected: Layout, *, what: str) -> None:
    """Raise InvalidArgument naming the first tensor where ``got`` differs from ``expected``."""
    difference = expected.difference(got)
    if difference is not None:
        raise InvalidArgument(f"{what}: {difference} in this round's layout.")


def check_announced_size(spec: PayloadSpec, expected: Layout, *, what: str) -> None:
    """Refuse a header whose size is not the round's public layout size, naming both.

    Checked before anything else about the payload, so that no byte of a
    payload of the wrong size is ever read, buffered or stored: the size of
    every payload of a round is public (the federation config's plan).
    """
    words = expected.size
    if spec.total_bytes != 8 * words or spec.total_elements != words:
        raise InvalidArgument(
            f"{what}: the header announces {spec.total_bytes} bytes ({spec.total_elements} "
            f"words), but a payload in this round's layout has {8 * words} bytes ({words} "
            "words); the payload is refused before any of it is read."
        )
