"""Payload packing, chunking and verified reassembly (proto/chunks.py)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from proto.chunks import (
    CHUNK_BYTES,
    PayloadAssembler,
    PayloadError,
    check_layout,
    pack_tensors,
    payload_chunks,
    payload_header,
    unpack_tensors,
)
from proto.zerosum.v1 import session_pb2 as pb


def sample() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "n": np.array(7, dtype=np.uint64),
        "sx": rng.integers(0, 2**64, size=5, dtype=np.uint64),
        "sxx": rng.integers(0, 2**64, size=(5, 5), dtype=np.uint64),
    }


def test_pack_and_unpack_round_trip_little_endian() -> None:
    tensors = sample()
    data, layouts = pack_tensors(tensors)
    assert len(data) == 8 * (1 + 5 + 25)
    assert data[:8] == (7).to_bytes(8, "little")
    assert [(t.name, list(t.shape), t.offset, t.size) for t in layouts] == [
        ("n", [], 0, 1),
        ("sx", [5], 1, 5),
        ("sxx", [5, 5], 6, 25),
    ]
    back = unpack_tensors(data, layouts)
    for name, array in tensors.items():
        assert back[name].dtype == np.uint64
        np.testing.assert_array_equal(back[name], array)


def test_pack_rejects_other_dtypes() -> None:
    with pytest.raises(PayloadError, match="tensor 'x' has dtype float64"):
        pack_tensors({"x": np.zeros(3)})  # type: ignore[dict-item]


def test_chunks_are_at_most_one_mebibyte_and_reassemble() -> None:
    data = bytes(range(256)) * (3 * CHUNK_BYTES // 256 + 5)
    data = data[: len(data) // 8 * 8]
    header = payload_header(
        data, [pb.TensorLayout(name="w", shape=[len(data) // 8], offset=0, size=len(data) // 8)], 20
    )
    chunks = list(payload_chunks(data))
    assert len(chunks) == 4
    assert all(len(c.data) <= CHUNK_BYTES for c in chunks)
    assert all(c.ByteSize() < 4 * 1024 * 1024 for c in chunks)
    assembler = PayloadAssembler(header)
    for chunk in chunks:
        assembler.add(chunk)
    assert assembler.received_bytes == len(data)
    assert assembler.finish() == data
    assert header.sha256 == hashlib.sha256(data).digest()
    assert header.fixed_point_bits == 20


def test_empty_payload_has_no_chunks() -> None:
    header = payload_header(b"", [], 32)
    assert list(payload_chunks(b"")) == []
    assert PayloadAssembler(header).finish() == b""


def test_chunk_size_bounds() -> None:
    with pytest.raises(ValueError, match="chunk_bytes = 0"):
        list(payload_chunks(b"x" * 8, 0))
    with pytest.raises(ValueError, match="chunk_bytes"):
        list(payload_chunks(b"x" * 8, CHUNK_BYTES + 1))


def _assembler() -> tuple[bytes, PayloadAssembler]:
    data, layouts = pack_tensors(sample())
    return data, PayloadAssembler(payload_header(data, layouts, 32))


def test_assembler_rejects_gaps_overflow_short_and_altered_payloads() -> None:
    data, assembler = _assembler()
    with pytest.raises(PayloadError, match="chunk at byte 8 arrived; expected byte 0"):
        assembler.add(pb.PayloadChunk(offset=8, data=data[8:]))
    with pytest.raises(PayloadError, match="exceed the 248 bytes"):
        assembler.add(pb.PayloadChunk(offset=0, data=data + b"\0" * 8))
    with pytest.raises(PayloadError, match="exceeds 1048576 bytes"):
        assembler.add(pb.PayloadChunk(offset=0, data=b"\0" * (CHUNK_BYTES + 8)))
    assembler.add(pb.PayloadChunk(offset=0, data=data[:16]))
    with pytest.raises(PayloadError, match="received 16 of the 248 bytes"):
        assembler.finish()
    altered = bytearray(data)
    altered[100] ^= 1
    _, fresh = _assembler()
    fresh.add(pb.PayloadChunk(offset=0, data=bytes(altered)))
    with pytest.raises(PayloadError, match="SHA-256 does not match"):
        fresh.finish()


def test_assembler_hands_out_verified_words_in_chunks_of_any_size() -> None:
    tensors = sample()
    data, assembler = _assembler()
    # Odd chunk sizes: words arrive split across chunks.
    for start in range(0, len(data), 13):
        assembler.add(pb.PayloadChunk(offset=start, data=data[start : start + 13]))
    words = assembler.finish_words()
    assert words.dtype == np.uint64 and words.shape == (31,)
    assert int(words[0]) == 7
    np.testing.assert_array_equal(words[6:], tensors["sxx"].ravel())
    assert assembler.finish() == data
    assert assembler.finish_words() is words


def test_an_altered_payload_gives_no_words() -> None:
    data, assembler = _assembler()
    assembler.add(pb.PayloadChunk(offset=0, data=data[:-1] + bytes([data[-1] ^ 0x80])))
    with pytest.raises(PayloadError, match="SHA-256 does not match"):
        assembler.finish_words()


def test_assembler_checks_the_header() -> None:
    data, layouts = pack_tensors(sample())
    header = payload_header(data, layouts, 32)
    bad_size = pb.PayloadHeader()
    bad_size.CopyFrom(header)
    bad_size.total_bytes += 1
    with pytest.raises(PayloadError, match="announces 249 bytes for 31 elements"):
        PayloadAssembler(bad_size)
    with pytest.raises(PayloadError, match="exceeds the limit of 100 bytes"):
        PayloadAssembler(header, max_bytes=100)
    bad_hash = pb.PayloadHeader()
    bad_hash.CopyFrom(header)
    bad_hash.sha256 = b"short"
    with pytest.raises(PayloadError, match="sha256 has 5 bytes"):
        PayloadAssembler(bad_hash)


@pytest.mark.parametrize(
    ("layouts", "total", "message"),
    [
        ([pb.TensorLayout(name="a", shape=[2], offset=0, size=3)], 3, "shape \\(2,\\) but size 3"),
        ([pb.TensorLayout(name="a", shape=[2], offset=1, size=2)], 3, "starts at element 1"),
        ([pb.TensorLayout(name="a", shape=[2], offset=0, size=2)], 3, "covers 2 elements"),
        (
            [
                pb.TensorLayout(name="a", shape=[1], offset=0, size=1),
                pb.TensorLayout(name="a", shape=[1], offset=1, size=1),
            ],
            2,
            "empty or repeated",
        ),
        ([pb.TensorLayout(name="", shape=[1], offset=0, size=1)], 1, "empty or repeated"),
    ],
)
def test_check_layout_errors(layouts: list[pb.TensorLayout], total: int, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        check_layout(layouts, total)


def test_payload_must_be_whole_words() -> None:
    with pytest.raises(PayloadError, match="not a whole number of uint64 words"):
        payload_header(b"abc", [], 32)
    with pytest.raises(PayloadError, match="not a whole number of uint64 words"):
        unpack_tensors(b"abc", [])
