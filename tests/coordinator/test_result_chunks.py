"""Data chunks on the coordinator's wire: results encoded once, uploads read without copies.

Against a real mutual-TLS server on 127.0.0.1 (tests/coordinator/server_harness.py):

* rounds' results served in turn, and an earlier one asked for again, are
  each the right bytes, parsed by protobuf as a node would;
* the held result (:class:`coordinator.server.ResultChunks`) is one aggregate,
  shared by every caller, replaced by a later round's and read again when
  its file changes;
* a data chunk in any encoding protobuf accepts is taken as protobuf reads
  it, and malformed ones are refused with the status and sentence they
  always had.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import blake3
import grpc
import numpy as np
import pytest

from coordinator.server import ResultChunks
from coordinator.session import Session
from coordinator.steps.streams import EncodedResult
from coordinator.store import Store
from proto.chunk_wire import encoded_file_chunks, passthrough_serializer
from proto.chunks import file_chunks
from proto.zerosum.v1 import session_pb2 as pb
from tests.coordinator.server_harness import (
    Certificates,
    Harness,
    answer,
    attest,
    certificates,
    code_of,
    fetch_result,
    joined,
    send,
    sent,
    start,
    unmask_request,
    upload_messages,
)
from tests.coordinator.support import N_WORDS, join_all, make_federation, run_round, zero_sum

__all__ = ["certificates"]

NODES = ("a", "b", "c")


def _complete_round(h: Harness, round_index: int, seed: int) -> np.ndarray:
    """Every node uploads and reveals its seed; returns the exact sum."""
    data = zero_sum(NODES, N_WORDS, seed=seed)
    for node in NODES:
        send(
            h,
            node,
            upload_messages(h, node, round_index, sent(h, node, round_index, data.payloads[node])),
        )
    requests = {n: unmask_request(h, n, round_index) for n in NODES}
    for node in NODES:
        attest(h, node, requests[node])
    for node in NODES:
        answer(h, node, requests[node], None)
    return data.total(list(NODES))


@pytest.mark.integration
def test_rounds_results_served_in_turn_are_each_the_right_bytes(
    tmp_path: Path, certificates: Certificates
) -> None:
    h = start(tmp_path, certificates)
    try:
        joined(h)
        totals = {0: _complete_round(h, 0, seed=71)}
        for node in NODES:
            header, payload = fetch_result(h, node, 0)
            assert header.payload.digest == blake3.blake3(payload).digest()
            np.testing.assert_array_equal(np.frombuffer(payload, dtype="<u8"), totals[0])
        totals[1] = _complete_round(h, 1, seed=72)
        assert not np.array_equal(totals[0], totals[1])
        # The later round, the earlier one again (not held any more), the later once more.
        for node, round_index in (("a", 1), ("b", 0), ("c", 1), ("a", 0), ("b", 1)):
            header, payload = fetch_result(h, node, round_index)
            assert header.status == pb.ROUND_STATUS_READY and header.round_index == round_index
            assert header.payload.digest == blake3.blake3(payload).digest()
            np.testing.assert_array_equal(np.frombuffer(payload, dtype="<u8"), totals[round_index])
    finally:
        h.close()


def test_one_aggregate_is_held_and_shared_until_a_later_round_replaces_it(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "r0.u64", tmp_path / "r1.u64"
    first.write_bytes(bytes(range(256)) * 41 + b"\x01" * 8)  # not a whole number of chunks
    second.write_bytes(b"\x02" * 4000)
    results = ResultChunks(chunk_bytes=1000)

    def expected(path: Path) -> list[bytes]:
        return [pb.ResultChunk(data=c).SerializeToString() for c in file_chunks(path, 1000)]

    held = results.chunks(0, first, b"h0")
    assert list(held) == expected(first) and results.held == (0, first, b"h0")
    assert results.chunks(0, first, b"h0") is held  # every caller gets the same bytes objects
    later = results.chunks(1, second, b"h1")
    assert list(later) == expected(second) and results.held == (1, second, b"h1")
    # An earlier round is still served, from its file, and does not replace the later one.
    assert list(results.chunks(0, first, b"h0")) == expected(first)
    assert results.held == (1, second, b"h1")
    assert results.chunks(1, second, b"h1") is later
    # A file replaced under the same name is read again; a file gone fails as reading it would.
    second.write_bytes(b"\x03" * 1500)
    assert list(results.chunks(1, second, b"h1")) == expected(second)
    second.unlink()
    with pytest.raises(FileNotFoundError):
        results.chunks(1, second, b"h1")


def test_an_aggregate_encoded_as_it_was_written_is_served_without_reading_its_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r0.u64"
    path.write_bytes(b"\x05" * 2500)
    results = ResultChunks(chunk_bytes=1000)
    # Chunks that are not the file's: served as they are, so the file was not read.
    marked = EncodedResult(0, path.name, b"h0", 1000, (b"one", b"two"))
    assert results.chunks(0, path, b"h0", marked) == (b"one", b"two")
    assert results.chunks(0, path, b"h0") == (b"one", b"two")  # and held for every caller
    # Encoded in chunks of another size: the file is read.
    other = ResultChunks(chunk_bytes=500)
    expected = [pb.ResultChunk(data=c).SerializeToString() for c in file_chunks(path, 500)]
    assert list(other.chunks(0, path, b"h0", marked)) == expected


def test_the_aggregate_a_round_wrote_is_encoded_as_its_file_would_be(tmp_path: Path) -> None:
    fed = make_federation(("a", "b", "c"), min_nodes=2)
    store = Store(tmp_path / "state.sqlite")
    try:
        session = Session(store, fed.config)
        join_all(fed, session)
        data = zero_sum(fed.node_ids, N_WORDS, seed=5)
        run_round(fed, session, 0, data.payloads)
        view = session.result(session.session_id, 0, caller="a")
        assert view.path is not None and view.payload is not None
        encoded = session.encoded_result(0, view.path, view.payload.digest)
        assert encoded is not None
        assert encoded.chunks == tuple(encoded_file_chunks(view.path, encoded.chunk_bytes))
        # Asked for another round, file or digest, nothing is handed out.
        assert session.encoded_result(1, view.path, view.payload.digest) is None
        assert session.encoded_result(0, view.path.with_name("x.u64"), view.payload.digest) is None
        assert session.encoded_result(0, view.path, bytes(32)) is None
    finally:
        store.close()


def _raw_upload(h: Harness, node: str) -> grpc.StreamUnaryMultiCallable:
    h.stub(node)
    return h.channels[-1].stream_unary(
        "/zerosum.v1.Coordinator/UploadEgress",
        request_serializer=passthrough_serializer,
        response_deserializer=pb.UploadReceipt.FromString,
    )


def _reencoded(messages: Iterator[pb.UploadChunk]) -> Iterator[pb.UploadChunk | bytes]:
    """The same upload, each data chunk written as protobuf would not (but accepts)."""
    for message in messages:
        if message.WhichOneof("part") != "data":
            yield message
            continue
        chunk = message.data
        inner = b"\x12" + _varint(len(chunk.data)) + chunk.data + b"\x08" + _varint(chunk.offset)
        yield b"\x12" + _varint(len(inner)) + inner + b"\x78\x01"  # data first, an unknown field


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@pytest.mark.integration
def test_chunks_in_other_encodings_are_read_as_protobuf_reads_them(
    tmp_path: Path, certificates: Certificates
) -> None:
    h = start(tmp_path, certificates)
    try:
        joined(h)
        data = zero_sum(NODES, N_WORDS, seed=73)
        upload = _raw_upload(h, "a")
        messages = upload_messages(h, "a", 0, sent(h, "a", 0, data.payloads["a"]), chunk=40)
        receipt = upload(_reencoded(messages), timeout=30)
        assert receipt.node_id == "a" and not receipt.duplicate
        # The same payload the canonical way is the same upload.
        again = send(h, "a", upload_messages(h, "a", 0, sent(h, "a", 0, data.payloads["a"])))
        assert again.duplicate
    finally:
        h.close()


@pytest.mark.integration
def test_a_malformed_data_chunk_is_refused_as_before(
    tmp_path: Path, certificates: Certificates
) -> None:
    h = start(tmp_path, certificates)
    try:
        joined(h)
        data = zero_sum(NODES, N_WORDS, seed=74)
        payload = sent(h, "a", 0, data.payloads["a"])
        upload = _raw_upload(h, "a")
        header = next(upload_messages(h, "a", 0, payload))
        bad = b"\x12\x09\x08\x00\x12\x10abc"  # the chunk's bytes run past the message
        with pytest.raises(Exception) as parsed:
            pb.UploadChunk.FromString(bad)
        code, details = code_of(lambda: upload(iter([header, bad]), timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert details == (
            f"UploadEgress of node 'a': the request's {len(bad)} bytes do not decode as the "
            "method's message "
            f"({type(parsed.value).__name__}: {str(parsed.value)[:200]})."
        ), details
        # A well-formed chunk at the wrong offset is the session's refusal, as before.
        misplaced = pb.UploadChunk(data=pb.PayloadChunk(offset=8, data=payload[8:16]))
        code, details = code_of(lambda: upload(iter([header, misplaced]), timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "chunk offset 8; expected 0 (chunks must be contiguous and in order)." in details
        # A second header where data must follow.
        code, details = code_of(lambda: upload(iter([header, header]), timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.endswith("only data chunks may follow the header; got a header message.")
        # Nothing was stored: the proper upload is the first.
        receipt = send(h, "a", upload_messages(h, "a", 0, payload))
        assert receipt.node_id == "a" and not receipt.duplicate
    finally:
        h.close()
