"""Payload headers, chunking and verified reassembly (proto/chunks.py)."""

from __future__ import annotations

from pathlib import Path

import blake3
import numpy as np
import pytest

from noise.layout import Layout
from proto.chunks import (
    CHUNK_BYTES,
    PayloadAssembler,
    PayloadError,
    file_chunks,
    layout_of,
    payload_chunks,
    payload_header,
    tensor_layouts,
)
from proto.zerosum.v1 import session_pb2 as pb

LAYOUT = Layout.of({"n": (), "sx": (5,), "sxx": (5, 5)})


def words(seed: int = 3, size: int = LAYOUT.size) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**64, size=size, dtype=np.uint64)


def test_header_describes_size_digest_scale_and_layout() -> None:
    payload = words()
    header = payload_header(payload, LAYOUT, 20)
    assert header.total_elements == 31 and header.total_bytes == 248
    assert header.digest == blake3.blake3(payload.astype("<u8").tobytes()).digest()
    assert header.fixed_point_bits == 20
    assert layout_of(header.tensors) == LAYOUT
    assert [(t.name, list(t.shape), t.offset, t.size) for t in tensor_layouts(LAYOUT)] == [
        ("n", [], 0, 1),
        ("sx", [5], 1, 5),
        ("sxx", [5, 5], 6, 25),
    ]
    known = payload_header(None, LAYOUT, 20, digest=header.digest)
    assert known == header
    with pytest.raises(PayloadError, match="30 words does not fit a layout of 31"):
        payload_header(payload[:30], LAYOUT, 20)
    with pytest.raises(ValueError, match="either the words or their digest"):
        payload_header(payload, LAYOUT, 20, digest=header.digest)


def test_a_malformed_wire_layout_is_named() -> None:
    bad = [pb.TensorLayout(name="a", shape=[2], offset=0, size=3)]
    with pytest.raises(PayloadError, match="layout is malformed: tensor 'a' has shape"):
        layout_of(bad)


def test_chunks_are_at_most_one_mebibyte_and_reassemble() -> None:
    payload = words(size=3 * CHUNK_BYTES // 8 + 5)
    layout = Layout.of({"w": (payload.size,)})
    header = payload_header(payload, layout, 20)
    chunks = list(payload_chunks(payload))
    assert [len(c.data) for c in chunks] == [CHUNK_BYTES] * 3 + [40]
    assert [c.offset for c in chunks] == [0, CHUNK_BYTES, 2 * CHUNK_BYTES, 3 * CHUNK_BYTES]
    assembler = PayloadAssembler(header, layout=layout)
    for chunk in chunks:
        assembler.add(chunk)
    assert assembler.received_bytes == payload.nbytes
    assert np.array_equal(assembler.finish(), payload)
    assert list(payload_chunks(b"")) == []
    with pytest.raises(ValueError, match="chunk_bytes = 0"):
        list(payload_chunks(payload, 0))


def test_file_chunks_stream_a_stored_payload(tmp_path: Path) -> None:
    payload = words(size=1000)
    path = tmp_path / "p.u64"
    path.write_bytes(payload.astype("<u8").tobytes())
    chunks = list(file_chunks(path, 3000))
    assert [len(c.data) for c in chunks] == [3000, 3000, 2000]
    assembler = PayloadAssembler(payload_header(payload, Layout.of({"w": (1000,)}), 32))
    for chunk in chunks:
        assembler.add(chunk)
    assert np.array_equal(assembler.finish(), payload)


def _assembler(payload: np.ndarray) -> PayloadAssembler:
    return PayloadAssembler(payload_header(payload, LAYOUT, 20))


def test_assembler_refuses_gaps_overruns_and_oversized_chunks() -> None:
    payload = words()
    data = payload.astype("<u8").tobytes()
    assembler = _assembler(payload)
    with pytest.raises(PayloadError, match="chunk at byte 8 arrived; expected byte 0"):
        assembler.add(pb.PayloadChunk(offset=8, data=data[8:]))
    assembler.add(pb.PayloadChunk(offset=0, data=data))
    with pytest.raises(PayloadError, match="chunks exceed the 248 bytes"):
        assembler.add(pb.PayloadChunk(offset=248, data=b"x"))
    big = PayloadAssembler(
        payload_header(words(size=CHUNK_BYTES), Layout.of({"w": (CHUNK_BYTES,)}), 1)
    )
    with pytest.raises(PayloadError, match="exceeds"):
        big.add(pb.PayloadChunk(offset=0, data=bytes(CHUNK_BYTES + 1)))


def test_assembler_refuses_a_short_or_altered_payload() -> None:
    payload = words()
    data = payload.astype("<u8").tobytes()
    short = _assembler(payload)
    short.add(pb.PayloadChunk(offset=0, data=data[:100]))
    with pytest.raises(PayloadError, match="received 100 of the 248 bytes"):
        short.finish()
    altered = _assembler(payload)
    altered.add(pb.PayloadChunk(offset=0, data=data[:-1] + bytes([data[-1] ^ 1])))
    with pytest.raises(PayloadError, match="digest does not match"):
        altered.finish()


def test_an_assembler_told_not_to_hash_checks_everything_but_the_digest() -> None:
    """For a node's aggregate, which its tags check (the coordinator chose its digest)."""
    payload = words()
    data = payload.astype("<u8").tobytes()
    header = payload_header(payload, LAYOUT, 20)
    altered = data[:-1] + bytes([data[-1] ^ 1])
    unhashed = PayloadAssembler(header, check_digest=False)
    unhashed.add(pb.PayloadChunk(offset=0, data=altered))
    assert unhashed.finish().tobytes() == altered  # its words, whatever the header says
    short = PayloadAssembler(header, check_digest=False)
    short.add(pb.PayloadChunk(offset=0, data=data[:100]))
    with pytest.raises(PayloadError, match="received 100 of the 248 bytes"):
        short.finish()
    late = PayloadAssembler(header, check_digest=False)
    with pytest.raises(PayloadError, match="expected byte 0"):
        late.add(pb.PayloadChunk(offset=8, data=data[8:]))


def test_assembler_checks_the_header_against_itself_and_the_expected_layout() -> None:
    header = payload_header(words(), LAYOUT, 20)
    other = Layout.of({"n": (), "sx": (5,), "sxx": (25,)})
    with pytest.raises(PayloadError, match=r"tensor 'sxx' has shape \(5, 5\); expected \(25,\)"):
        PayloadAssembler(header, layout=other)
    lying = pb.PayloadHeader()
    lying.CopyFrom(header)
    lying.total_bytes = 240
    with pytest.raises(PayloadError, match="announces 240 bytes and 31 elements"):
        PayloadAssembler(lying)
    with pytest.raises(PayloadError, match="exceeds the limit of 100 bytes"):
        PayloadAssembler(header, max_bytes=100)
    short_digest = pb.PayloadHeader()
    short_digest.CopyFrom(header)
    short_digest.digest = b"\x00" * 5
    with pytest.raises(PayloadError, match="digest has 5 bytes"):
        PayloadAssembler(short_digest)
