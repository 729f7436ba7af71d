"""Data chunks written and read without protobuf objects match protobuf (proto/chunk_wire.py)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from proto.chunk_wire import (
    ChunkEncoder,
    DataChunk,
    as_data_chunk,
    data_chunk_decoder,
    decode_data_chunk,
    encode_data_chunk,
    encoded_chunks,
    encoded_file_chunks,
    message_part,
    passthrough_serializer,
)
from proto.chunks import file_chunks, payload_chunks
from proto.zerosum.v1 import session_pb2 as pb
from tests.support.strategies import key_bytes, node_ids

CHUNK_TYPES = (pb.UploadChunk, pb.ResultChunk, pb.UnmaskChunk)

offsets = st.one_of(
    st.integers(0, 2**64 - 1),
    st.sampled_from([0, 1, 127, 128, 16383, 16384, 2**63, 2**64 - 1]),
)
# Sizes around the varint boundaries of the length prefixes (127/128 bytes, 16383/16384).
payloads = st.one_of(
    st.binary(max_size=300),
    st.integers(16370, 16400).map(lambda n: bytes(range(256)) * (n // 256) + b"\x07" * (n % 256)),
)
chunk_types = st.sampled_from(CHUNK_TYPES)


def reference(kind: Any, offset: int, data: bytes) -> bytes:
    serialized: bytes = kind(data=pb.PayloadChunk(offset=offset, data=data)).SerializeToString()
    return serialized


def other_messages(kind: Any) -> st.SearchStrategy[Any]:
    """Chunk messages with another part, or none."""
    headers = {
        pb.UploadChunk: st.builds(
            lambda s, i, n: pb.UploadChunk(
                header=pb.UploadHeader(session_id=s, round_index=i, node_id=n)
            ),
            node_ids(),
            st.integers(0, 2**32 - 1),
            node_ids(),
        ),
        pb.ResultChunk: st.builds(
            lambda s, r: pb.ResultChunk(header=pb.ResultHeader(session_id=s, reason=r)),
            node_ids(),
            st.text(max_size=40),
        ),
        pb.UnmaskChunk: st.one_of(
            st.builds(
                lambda s, seed: pb.UnmaskChunk(
                    header=pb.UnmaskHeader(session_id=s, self_mask_seed=seed)
                ),
                node_ids(),
                key_bytes(),
            ),
            st.builds(
                lambda r, h: pb.UnmaskChunk(refusal=pb.UnmaskRefusal(reason=r, survivor_hash=h)),
                st.text(max_size=40),
                key_bytes(),
            ),
        ),
    }
    return st.one_of(headers[kind], st.just(kind()))


def outcome(decode: Any, buffer: bytes) -> tuple[Any, ...]:
    """What a caller sees of a decoded message: its part and contents, or the error."""
    try:
        message = decode(buffer)
    except Exception as error:
        return ("error", type(error), str(error))
    chunk = as_data_chunk(message)
    if chunk is not None:
        assert message_part(message) == "data"
        return ("data", chunk.offset, bytes(chunk.data))
    return (message_part(message), message)


def assert_decodes_like_protobuf(kind: Any, buffer: bytes) -> None:
    assert outcome(data_chunk_decoder(kind.FromString), buffer) == outcome(kind.FromString, buffer)


@settings(max_examples=300, deadline=None)
@given(kind=chunk_types, offset=offsets, data=payloads)
def test_an_encoded_chunk_is_the_bytes_protobuf_writes(kind: Any, offset: int, data: bytes) -> None:
    expected = reference(kind, offset, data)
    assert encode_data_chunk(offset, data) == expected
    assert encode_data_chunk(offset, memoryview(data)) == expected
    assert encode_data_chunk(offset, bytearray(data)) == expected
    # A slice of a larger buffer, as the chunkers pass them.
    framed = b"\xff" * 3 + data + b"\xee" * 5
    assert encode_data_chunk(offset, memoryview(framed)[3 : 3 + len(data)]) == expected


@settings(max_examples=300, deadline=None)
@given(kind=chunk_types, offset=offsets, data=payloads)
def test_a_canonical_chunk_decodes_as_a_view_of_the_received_bytes(
    kind: Any, offset: int, data: bytes
) -> None:
    buffer = reference(kind, offset, data)
    decoded = data_chunk_decoder(kind.FromString)(buffer)
    assert isinstance(decoded, DataChunk)
    assert (decoded.offset, bytes(decoded.data)) == (offset, data)
    parsed = kind.FromString(buffer)
    assert (parsed.data.offset, parsed.data.data) == (offset, data)
    if data:
        assert decoded.data.obj is buffer  # the received message's bytes, not a copy


@settings(max_examples=200, deadline=None)
@given(kind=chunk_types, data=st.data())
def test_other_parts_parse_as_protobuf_parses_them(kind: Any, data: st.DataObject) -> None:
    message = data.draw(other_messages(kind))
    buffer = message.SerializeToString()
    assert decode_data_chunk(buffer) is None or message.WhichOneof("part") == "data"
    decoded = data_chunk_decoder(kind.FromString)(buffer)
    assert not isinstance(decoded, DataChunk)
    assert decoded == message
    assert message_part(decoded) == message.WhichOneof("part")
    assert as_data_chunk(decoded) is None


@settings(max_examples=500, deadline=None)
@given(kind=chunk_types, buffer=st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_fail_as_protobuf(kind: Any, buffer: bytes) -> None:
    assert_decodes_like_protobuf(kind, buffer)


def _mutations(buffer: bytes, position: int, byte: int) -> list[bytes]:
    """Truncated, extended, overwritten and spliced forms of a canonical message."""
    cut = position % (len(buffer) + 1)
    return [
        buffer[:cut],
        buffer + bytes([byte]),
        buffer[:cut] + bytes([byte]) + buffer[cut:],
        buffer[:cut] + bytes([byte]) + buffer[cut + 1 :],
        buffer + b"\x08\x05",  # a second, top-level field
        buffer + buffer,  # the data part twice: protobuf merges them
        b"\x1a\x00" + buffer,  # an unknown (or other) field first
    ]


@settings(max_examples=400, deadline=None)
@given(
    kind=chunk_types,
    offset=offsets,
    data=st.binary(max_size=40),
    position=st.integers(0, 100),
    byte=st.integers(0, 255),
)
def test_damaged_chunks_decode_or_fail_as_protobuf(
    kind: Any, offset: int, data: bytes, position: int, byte: int
) -> None:
    for buffer in _mutations(reference(kind, offset, data), position, byte):
        assert_decodes_like_protobuf(kind, buffer)


@pytest.mark.parametrize(
    "buffer",
    [
        b"\x12\x05\x08\x00\x12\x01a",  # an explicit zero offset
        b"\x12\x06\x08\x85\x00\x12\x01a",  # a non-minimal offset varint
        b"\x12\x86\x00\x08\x05\x12\x01a",  # a non-minimal length prefix
        b"\x12\x05\x12\x01a\x08\x05",  # data before the offset
        b"\x12\x05\x08\x05\x12\x00\x08",  # an empty data field, then the offset again
        b"\x12\x02\x12\x00",  # an explicit empty data field
        b"\x12\x07\x08\x05\x12\x01a\x18\x01",  # an unknown field inside the chunk
        b"\x12\x0d\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x12\x01a",  # a 10-byte offset
        b"\x12\x0d\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x12\x01a",  # past uint64
    ],
)
def test_non_canonical_encodings_go_to_protobuf(buffer: bytes) -> None:
    assert decode_data_chunk(buffer) is None
    for kind in CHUNK_TYPES:
        assert_decodes_like_protobuf(kind, buffer)


def test_malformed_bytes_raise_protobufs_own_error() -> None:
    decode = data_chunk_decoder(pb.UploadChunk.FromString)
    for buffer in (b"\x12\x05\x08", b"\x12", b"\xff\xff"):
        with pytest.raises(DecodeError) as ours:
            decode(buffer)
        with pytest.raises(DecodeError) as theirs:
            pb.UploadChunk.FromString(buffer)
        assert str(ours.value) == str(theirs.value)


def test_an_empty_chunk_and_a_bare_offset_decode_as_protobuf_reads_them() -> None:
    for offset in (0, 9):
        buffer = reference(pb.UploadChunk, offset, b"")
        assert buffer == encode_data_chunk(offset, b"")
        assert decode_data_chunk(buffer) is not None
        assert_decodes_like_protobuf(pb.UploadChunk, buffer)


def test_an_offset_outside_uint64_is_refused_by_name() -> None:
    for offset in (-1, 2**64):
        with pytest.raises(ValueError, match=f"offset = {offset}: a chunk's offset must be"):
            encode_data_chunk(offset, b"x")


@pytest.mark.parametrize("size", [0, 1, 7, 8, 1001, 3 * 4096 + 5])
@pytest.mark.parametrize("chunk_bytes", [1, 8, 1000, 4096])
def test_encoded_chunks_are_the_chunkers_messages_serialized(
    size: int, chunk_bytes: int, tmp_path: Path
) -> None:
    raw = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8).tobytes()
    for kind in CHUNK_TYPES:
        expected = [kind(data=c).SerializeToString() for c in payload_chunks(raw, chunk_bytes)]
        assert list(encoded_chunks(raw, chunk_bytes)) == expected
        assert list(encoded_chunks(memoryview(raw), chunk_bytes)) == expected
    path = tmp_path / "payload.u64"
    path.write_bytes(raw)
    expected = [pb.ResultChunk(data=c).SerializeToString() for c in file_chunks(path, chunk_bytes)]
    assert list(encoded_file_chunks(path, chunk_bytes)) == expected


def test_encoded_chunks_of_words_are_little_endian_as_the_chunkers_send_them() -> None:
    words = np.random.default_rng(5).integers(0, 2**64, size=301, dtype=np.uint64)
    expected = [pb.UploadChunk(data=c).SerializeToString() for c in payload_chunks(words, 1000)]
    assert list(encoded_chunks(words, 1000)) == expected
    # A memoryview of words (item format "Q") is cut in bytes, not items.
    assert encode_data_chunk(8, memoryview(words[:3])) == reference(
        pb.UploadChunk, 8, words[:3].astype("<u8").tobytes()
    )


def test_the_chunkers_refuse_a_chunk_size_outside_their_limit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="chunk_bytes = 0"):
        list(encoded_chunks(b"abc", 0))
    with pytest.raises(ValueError, match=r"chunk_bytes = 1048577"):
        list(encoded_file_chunks(tmp_path / "none", (1 << 20) + 1))


def test_the_passthrough_serializer_sends_bytes_as_they_are() -> None:
    encoded = encode_data_chunk(3, b"abc")
    assert passthrough_serializer(encoded) is encoded
    header = pb.UploadChunk(header=pb.UploadHeader(session_id="s"))
    assert passthrough_serializer(header) == header.SerializeToString()


def test_a_parsed_data_chunk_is_read_through_the_same_helpers() -> None:
    # A data chunk protobuf had to parse (here: with an unknown field) reads like a fast one.
    buffer = reference(pb.UnmaskChunk, 16, b"words") + b"\x78\x01"
    decoded = data_chunk_decoder(pb.UnmaskChunk.FromString)(buffer)
    assert not isinstance(decoded, DataChunk)
    chunk = as_data_chunk(decoded)
    assert chunk is not None and (chunk.offset, bytes(chunk.data)) == (16, b"words")
    assert message_part(decoded) == "data"


@given(
    data=st.binary(max_size=3000),
    chunk_bytes=st.integers(1, 700),
    cuts=st.lists(st.integers(0, 3000), max_size=12),
)
def test_a_payload_handed_over_in_pieces_is_encoded_as_the_whole_would_be(
    data: bytes, chunk_bytes: int, cuts: list[int]
) -> None:
    encoder = ChunkEncoder(chunk_bytes)
    edges = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    for start, stop in itertools.pairwise(edges):
        encoder.add(memoryview(data)[start:stop])
    encoder.add(b"")  # an empty piece changes nothing
    assert encoder.finish() == tuple(encoded_chunks(data, chunk_bytes))


def test_pieces_of_words_are_taken_as_their_bytes() -> None:
    words = np.arange(1000, dtype="<u8")
    encoder = ChunkEncoder(1000)
    encoder.add(words[:300].data)  # a view of 8-byte items
    encoder.add(words[300:].data)
    assert encoder.finish() == tuple(encoded_chunks(words, 1000))
    with pytest.raises(ValueError, match="chunk_bytes = 0"):
        ChunkEncoder(0)
