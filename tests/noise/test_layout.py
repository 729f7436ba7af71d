"""Payload layouts: validated once, then fill, split, encode, decode and digest."""

from __future__ import annotations

import hashlib

import blake3
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from noise.fixed_point import FixedPointCodec
from noise.layout import (
    Layout,
    LayoutError,
    TensorSlot,
    as_words,
    payload_digest,
    payload_hasher,
    payload_sha256,
)

CODEC = FixedPointCodec(32)


def test_layout_is_made_end_to_end_in_order() -> None:
    layout = Layout.of({"n": (), "sum_x": (4,), "sum_xx": (2, 3)})
    assert [(s.name, s.shape, s.offset, s.size) for s in layout] == [
        ("n", (), 0, 1),
        ("sum_x", (4,), 1, 4),
        ("sum_xx", (2, 3), 5, 6),
    ]
    assert layout.size == 11 and layout.nbytes == 88 and len(layout) == 3
    assert layout.names == ("n", "sum_x", "sum_xx")
    assert layout.slot("sum_x").offset == 1 and "sum_xx" in layout
    assert Layout.of_tensors({"n": 1.0, "sum_x": np.zeros(4), "sum_xx": np.zeros((2, 3))}) == layout
    assert hash(layout) == hash(Layout.of([("n", ()), ("sum_x", [4]), ("sum_xx", (2, 3))]))


@pytest.mark.parametrize(
    ("slots", "message"),
    [
        ((), "at least one tensor"),
        ((TensorSlot("a", (2,), 0, 3),), r"shape \(2,\) \(2 words\) but size 3"),
        ((TensorSlot("a", (2,), 1, 2),), "starts at word 1; the tensors before it end at word 0"),
        ((TensorSlot("a", (1,), 0, 1), TensorSlot("a", (1,), 1, 1)), "listed twice"),
        ((TensorSlot("", (1,), 0, 1),), "tensor name '' must be"),
        ((TensorSlot("a b", (1,), 0, 1),), "tensor name 'a b' must be"),
        ((TensorSlot("a", (-1,), 0, 1),), "every dimension must be a whole number >= 0"),
    ],
)
def test_malformed_layouts_are_refused_with_the_fault_named(
    slots: tuple[TensorSlot, ...], message: str
) -> None:
    with pytest.raises(LayoutError, match=message):
        Layout(slots)


def test_a_layout_cannot_be_changed() -> None:
    layout = Layout.of({"a": (1,)})
    with pytest.raises(AttributeError):
        layout.slots = ()  # type: ignore[misc]


def test_unknown_tensor_is_named() -> None:
    with pytest.raises(KeyError, match=r"tensor 'c' is not in the layout \(a, b\)"):
        Layout.of({"a": (), "b": ()}).slot("c")


def test_json_round_trip_and_checked_offsets() -> None:
    layout = Layout.of({"n": (), "m": (2, 2)})
    assert Layout.from_json(layout.to_json()) == layout
    assert layout.to_json() == [{"name": "n", "shape": []}, {"name": "m", "shape": [2, 2]}]
    stored = [{"name": "n", "shape": [], "offset": 0, "size": 1}, {"name": "m", "shape": [2, 2]}]
    assert Layout.from_json(stored) == layout
    stored[1]["offset"] = 2
    with pytest.raises(LayoutError, match="tensor 'm' has offset 2; its place"):
        Layout.from_json(stored)
    for bad in ("x", [{"shape": [1]}], [{"name": "a", "shape": "12"}], [{"name": "a", "bad": 1}]):
        with pytest.raises(LayoutError):
            Layout.from_json(bad)


def test_difference_names_the_first_mismatch() -> None:
    expected = Layout.of({"n": (), "sum_x": (3,)})
    assert expected.difference(Layout.of({"n": (), "sum_x": (3,)})) is None
    assert expected.difference(Layout.of({"n": (), "sum_x": (4,)})) == (
        "tensor 'sum_x' has shape (4,); expected (3,)"
    )
    assert "stands where 'n'" in str(expected.difference(Layout.of({"m": (), "sum_x": (3,)})))
    assert expected.difference(Layout.of({"n": ()})) == "tensor 'sum_x' is missing"
    extra = Layout.of({"n": (), "sum_x": (3,), "z": ()})
    assert expected.difference(extra) == "tensor 'z' is not part of the layout"


def test_build_split_and_check() -> None:
    layout = Layout.of({"n": (), "m": (2, 2)})
    vector = layout.build(lambda slot: np.arange(slot.size) + slot.offset)
    assert vector.tolist() == [0, 1, 2, 3, 4]
    parts = layout.split(vector)
    assert parts["m"].shape == (2, 2) and parts["m"][1, 1] == 4
    with pytest.raises(LayoutError, match="3 values for a slot of 4"):
        layout.build(lambda slot: np.zeros(slot.size if slot.name == "n" else 3))
    with pytest.raises(LayoutError, match="needs 5 words"):
        layout.split(np.zeros(4, dtype=np.uint64))


def test_encode_checks_names_and_shapes() -> None:
    layout = Layout.of({"n": (), "sum_x": (2,)})
    with pytest.raises(LayoutError, match=r"missing \['sum_x'\], unexpected \['z'\]"):
        layout.encode({"n": 1.0, "z": np.zeros(2)}, CODEC)
    with pytest.raises(LayoutError, match=r"tensor 'sum_x' has shape \(3,\)"):
        layout.encode({"n": 1.0, "sum_x": np.zeros(3)}, CODEC)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=7, max_size=7),
)
def test_encode_then_decode_gives_the_values_to_resolution(values: list[float]) -> None:
    layout = Layout.of({"n": (), "a": (2, 3)})
    tensors = {"n": values[0], "a": np.reshape(values[1:], (2, 3))}
    words = layout.encode(tensors, CODEC)
    back = layout.decode(words, CODEC)
    assert abs(back["n"] - values[0]) <= CODEC.resolution
    np.testing.assert_allclose(back["a"], tensors["a"], rtol=0, atol=CODEC.resolution)


def test_payload_digest_is_blake3_of_little_endian_words() -> None:
    # BLAKE3's published test vector for the empty input (the reference
    # implementation's test_vectors.json, input_len 0, first 32 bytes).
    assert payload_digest(np.zeros(0, dtype=np.uint64)).hex() == (
        "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    )
    words = np.array([1, 2**64 - 1], dtype=np.uint64)
    data = (1).to_bytes(8, "little") + b"\xff" * 8
    assert payload_digest(words) == blake3.blake3(data).digest()
    assert payload_digest(words.astype(">u8")) == payload_digest(words)
    hasher = payload_hasher()
    hasher.update(data[:5])
    hasher.update(data[5:])
    assert hasher.digest() == payload_digest(words)
    # What a person checks keeps SHA-256.
    assert payload_sha256(words) == hashlib.sha256(data).digest()
    assert payload_sha256(words.astype(">u8")) == payload_sha256(words)
    with pytest.raises(LayoutError, match="uint64 words; got dtype int64"):
        as_words(np.zeros(2, dtype=np.int64))
