"""The coordinator over a real gRPC server with mutual TLS on 127.0.0.1.

Certificates are made in the test with zerosum/pki.py. One test per bad input
of the protocol's error list: each checks the status code, that the details
are a sentence naming the problem, and that the state file is unchanged.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import grpc
import numpy as np
import pytest

from coordinator.server import (
    MAX_MESSAGE_BYTES,
)
from noise.keys import IdentityKey, sign_key_bundle
from noise.layout import Layout
from noise.transcript import roster_hash
from proto.chunks import tensor_layouts
from proto.zerosum.v1 import session_pb2 as pb
from tests.coordinator.server_harness import (
    Certificates,
    Harness,
    answer,
    answer_messages,
    as_bytes,
    attest,
    certificates,
    fetch_result,
    harness,
    joined,
    layout_messages,
    rejected,
    send,
    sent,
    start,
    unmask_request,
    upload_messages,
)
from tests.coordinator.support import (
    CONFIG_HASH,
    N_WORDS,
    node_seed,
    zero_sum,
)

__all__ = ["certificates", "harness"]

pytestmark = pytest.mark.integration


def test_a_round_over_the_network_sums_payloads_larger_than_one_message(
    tmp_path: Path, certificates: Certificates
) -> None:
    n_words = (5 << 20) // 8  # 5 MiB per node: more than two maximal messages
    layout = Layout.of({"count": (), "big": (n_words - 1,)})
    harness = start(tmp_path, certificates, layout=layout)
    try:
        _round_of_large_payloads(harness, n_words, tensor_layouts(layout))
    finally:
        harness.close()


def _round_of_large_payloads(harness: Harness, n_words: int, big: list[pb.TensorLayout]) -> None:
    joined(harness)
    data = zero_sum(("a", "b", "c"), n_words, seed=50)
    uploads = {n: sent(harness, n, 0, data.payloads[n]) for n in ("a", "b", "c")}
    receipts = [
        send(harness, n, upload_messages(harness, n, 0, uploads[n], layout=list(big)))
        for n in ("a", "b", "c")
    ]
    assert [r.submitted_count for r in receipts] == [1, 2, 3]
    # Nobody dropped: every survivor attests, then reveals its seed alone.
    requests = {n: unmask_request(harness, n, 0) for n in ("a", "b", "c")}
    assert all(list(r.dropped_node_ids) == [] for r in requests.values())
    assert [attest(harness, n, requests[n]).attested_count for n in ("a", "b", "c")] == [1, 2, 3]
    for node in ("a", "b", "c"):
        answer(harness, node, requests[node], None)
    header, payload = fetch_result(harness, "b", 0)
    assert header.status == pb.ROUND_STATUS_READY
    assert list(header.survivor_node_ids) == ["a", "b", "c"]
    assert header.payload.digest == blake3.blake3(payload).digest()
    final = roster_hash(CONFIG_HASH, harness.session_id, harness.session.store.members())
    assert [
        (s.node_id, s.round_name, s.roster_hash, s.payload_digest) for s in header.statements
    ] == [(n, "moments", final, blake3.blake3(uploads[n]).digest()) for n in ("a", "b", "c")]
    assert all(len(s.signature) == 64 for s in header.statements)
    np.testing.assert_array_equal(np.frombuffer(payload, dtype="<u8"), data.total(["a", "b", "c"]))
    status = harness.stub("c").GetStatus(pb.GetStatusRequest(session_id=harness.session_id))
    assert status.state == pb.SESSION_STATE_RUNNING and status.current_round_name == "scatter"


def test_status_names_the_session_and_the_roster_is_final_once_all_joined(
    harness: Harness,
) -> None:
    status = harness.stub("b").GetStatus(pb.GetStatusRequest(), timeout=10)
    assert status.session_id == harness.session_id
    assert status.state == pb.SESSION_STATE_JOINING and status.min_nodes == 2
    harness.join("a")
    request = pb.GetRosterRequest(session_id=harness.session_id, node_id="b")
    roster = harness.stub("b").GetRoster(request, timeout=10)
    assert not roster.final and roster.version == 1
    harness.join("b")
    harness.join("c")
    again = harness.join("c")
    assert again.rejoined and again.joined_count == 3 and again.federation_size == 3
    roster = harness.stub("b").GetRoster(request, timeout=10)
    assert roster.final and roster.version == 3 and not roster.excluded_node_ids
    assert [b.node_id for b in roster.bundles] == ["a", "b", "c"]
    assert roster.roster_hash == roster_hash(CONFIG_HASH, harness.session_id, roster.bundles)
    assert [(d.round_index, d.round_name) for d in roster.round_deadlines] == [(0, "moments")]


def test_the_same_upload_again_is_acknowledged_as_a_duplicate(harness: Harness) -> None:
    joined(harness)
    data = as_bytes(zero_sum(("a", "b", "c"), N_WORDS, seed=51).payloads["a"])
    first = send(harness, "a", upload_messages(harness, "a", 0, data))
    before = harness.session.store.dump()
    again = send(harness, "a", upload_messages(harness, "a", 0, data))
    assert again.duplicate and not first.duplicate and again.digest == first.digest
    assert harness.session.store.dump() == before


def test_dropout_is_unmasked_over_the_network(tmp_path: Path, certificates: Certificates) -> None:
    h = start(tmp_path, certificates, round_ms=1500)
    try:
        joined(h)
        data = zero_sum(("a", "b", "c"), N_WORDS, seed=52)
        for node in ("a", "b"):
            send(h, node, upload_messages(h, node, 0, sent(h, node, 0, data.payloads[node])))
        request = unmask_request(h, "a", 0)
        assert list(request.dropped_node_ids) == ["c"]
        assert list(request.survivor_node_ids) == ["a", "b"]
        for node in ("a", "b"):
            attest(h, node, request)
        for node in ("a", "b"):
            answer(h, node, request, as_bytes(data.correction(node, ["c"])))
        header, payload = fetch_result(h, "a", 0)
        assert header.status == pb.ROUND_STATUS_READY
        assert list(header.dropped_node_ids) == ["c"]
        np.testing.assert_array_equal(np.frombuffer(payload, dtype="<u8"), data.total(["a", "b"]))
    finally:
        for channel in h.channels:
            channel.close()
        h.server.stop(0)


# ---------------------------------------------------------------- bad input, one test each


def test_unknown_node_is_permission_denied(harness: Harness) -> None:
    stranger = IdentityKey.generate()
    bundle = sign_key_bundle(
        stranger,
        config_hash=CONFIG_HASH,
        session_id=harness.session_id,
        node_id="zed",
        public_key=bytes(range(32)),
    )
    request = pb.JoinRequest(
        bundle=pb.KeyBundle(
            config_hash=bundle.config_hash,
            session_id=bundle.session_id,
            node_id="zed",
            public_key=bundle.public_key,
            signature=bundle.signature,
        )
    )
    rejected(
        harness,
        grpc.StatusCode.PERMISSION_DENIED,
        lambda: harness.stub("zed").Join(request),
        words="'zed' is not a member of federation 'testfed'",
    )


def test_certificate_of_one_node_claiming_another_is_permission_denied(harness: Harness) -> None:
    joined(harness)
    data = as_bytes(zero_sum(("a", "b", "c"), N_WORDS, seed=53).payloads["b"])
    rejected(
        harness,
        grpc.StatusCode.PERMISSION_DENIED,
        lambda: send(harness, "a", upload_messages(harness, "b", 0, data)),
        words="belongs to node 'a' but the message claims node_id 'b'",
    )


def test_no_client_certificate_fails_the_tls_handshake(harness: Harness) -> None:
    before = harness.session.store.dump()
    with pytest.raises(grpc.RpcError) as caught:
        harness.stub(None).GetStatus(pb.GetStatusRequest(), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert harness.session.store.dump() == before


def test_wrong_session_is_invalid_argument(harness: Harness) -> None:
    joined(harness)
    data = as_bytes(zero_sum(("a", "b", "c"), N_WORDS, seed=54).payloads["a"])
    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send(harness, "a", upload_messages(harness, "a", 0, data, session_id="f" * 32)),
        words="is not this coordinator's session",
    )


def test_round_not_open_is_failed_precondition(harness: Harness) -> None:
    joined(harness)
    data = as_bytes(zero_sum(("a", "b", "c"), N_WORDS, seed=55).payloads["a"])
    rejected(
        harness,
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: send(harness, "a", upload_messages(harness, "a", 1, data)),
        words="round_index 1 has not opened; the current round is 0 ('moments')",
    )


def test_wrong_round_name_is_invalid_argument(harness: Harness) -> None:
    joined(harness)
    data = as_bytes(zero_sum(("a", "b", "c"), N_WORDS, seed=56).payloads["a"])
    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send(harness, "a", upload_messages(harness, "a", 0, data, round_name="scatter")),
        words="round_name 'scatter' does not match round 0, which is 'moments'",
    )


def test_bad_signature_is_unauthenticated(harness: Harness) -> None:
    bundle = harness.fed.bundle("a", harness.session_id)
    forged = bytearray(bundle.signature)
    forged[0] ^= 1
    request = pb.JoinRequest(
        bundle=pb.KeyBundle(
            config_hash=bundle.config_hash,
            session_id=bundle.session_id,
            node_id="a",
            public_key=bundle.public_key,
            signature=bytes(forged),
        )
    )
    rejected(
        harness,
        grpc.StatusCode.UNAUTHENTICATED,
        lambda: harness.stub("a").Join(request),
        words="does not verify against the pinned identity key",
    )


def test_join_replayed_from_another_session_is_unauthenticated(harness: Harness) -> None:
    old = harness.fed.bundle("a", "0123456789abcdef0123456789abcdef")
    request = pb.JoinRequest(
        bundle=pb.KeyBundle(
            config_hash=old.config_hash,
            session_id=old.session_id,
            node_id="a",
            public_key=old.public_key,
            signature=old.signature,
        )
    )
    rejected(
        harness,
        grpc.StatusCode.UNAUTHENTICATED,
        lambda: harness.stub("a").Join(request),
        words="replayed from another session",
    )


def test_malformed_key_bundle_is_invalid_argument(harness: Harness) -> None:
    bundle = harness.fed.bundle("a", harness.session_id)
    request = pb.JoinRequest(
        bundle=pb.KeyBundle(
            config_hash=bundle.config_hash,
            session_id=bundle.session_id,
            node_id="a",
            public_key=bundle.public_key[:31],
            signature=bundle.signature,
        )
    )
    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: harness.stub("a").Join(request),
        words="must be 32 bytes; got 31 bytes",
    )


def test_conflicting_upload_is_failed_precondition(harness: Harness) -> None:
    joined(harness)
    data = zero_sum(("a", "b", "c"), N_WORDS, seed=57).payloads["a"]
    send(harness, "a", upload_messages(harness, "a", 0, as_bytes(data)))
    changed = data.copy()
    changed[7] ^= np.uint64(1)
    rejected(
        harness,
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: send(harness, "a", upload_messages(harness, "a", 0, as_bytes(changed))),
        words="conflicting upload: node 'a' already submitted round 0",
    )


def test_second_key_for_a_joined_node_is_already_exists(harness: Harness) -> None:
    harness.join("a")
    harness.fed.ephemeral.clear()
    rejected(
        harness,
        grpc.StatusCode.ALREADY_EXISTS,
        lambda: harness.join("a"),
        words="node 'a' already joined session",
    )


def test_upload_statement_by_another_key_is_unauthenticated(harness: Harness) -> None:
    joined(harness)
    data = as_bytes(zero_sum(("a", "b", "c"), N_WORDS, seed=60).payloads["a"])
    forged = IdentityKey.generate().sign(b"anything")
    rejected(
        harness,
        grpc.StatusCode.UNAUTHENTICATED,
        lambda: send(
            harness, "a", upload_messages(harness, "a", 0, data, statement_signature=forged)
        ),
        words="the upload statement of node 'a' for round 0 ('moments') does not verify",
    )


def test_upload_statement_over_another_roster_is_failed_precondition(harness: Harness) -> None:
    joined(harness)
    data = as_bytes(zero_sum(("a", "b", "c"), N_WORDS, seed=61).payloads["a"])
    other = hashlib.sha256(b"the roster only 'a' was shown").digest()
    details = rejected(
        harness,
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: send(harness, "a", upload_messages(harness, "a", 0, data, roster_hash=other)),
        words=f"node 'a' signed its upload for round 0 ('moments') over roster hash "
        f"{other.hex()[:16]}…",
    )
    assert "the node was shown a different roster" in details


def test_self_mask_commitment_of_the_wrong_length_is_invalid_argument(harness: Harness) -> None:
    joined(harness)
    data = as_bytes(zero_sum(("a", "b", "c"), N_WORDS, seed=62).payloads["a"])
    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send(
            harness,
            "a",
            upload_messages(harness, "a", 0, data, self_mask_commitment=b"\x05" * 31),
        ),
        words="self_mask_commitment must be 32 raw bytes; got 31 bytes",
    )


def test_a_seed_that_does_not_match_the_commitment_is_invalid_argument(harness: Harness) -> None:
    joined(harness)
    data = zero_sum(("a", "b", "c"), N_WORDS, seed=63)
    for node in ("a", "b", "c"):
        send(
            harness,
            node,
            upload_messages(harness, node, 0, sent(harness, node, 0, data.payloads[node])),
        )
    request = unmask_request(harness, "a", 0)
    for node in ("a", "b", "c"):
        attest(harness, node, request)
    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: harness.stub("a").SubmitUnmask(
            answer_messages(harness, "a", request, None, seed=node_seed("b", 0)), timeout=10
        ),
        words="the self-mask seed does not match the commitment",
    )
    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: harness.stub("a").SubmitUnmask(
            answer_messages(harness, "a", request, as_bytes(data.correction("a", []))),
            timeout=10,
        ),
        words="nobody dropped, so the answer is the self-mask seed alone",
    )
    for node in ("a", "b", "c"):
        answer(harness, node, request, None)
    header, payload = fetch_result(harness, "c", 0)
    assert header.status == pb.ROUND_STATUS_READY
    np.testing.assert_array_equal(np.frombuffer(payload, dtype="<u8"), data.total(["a", "b", "c"]))


def test_wrong_size_is_invalid_argument(harness: Harness) -> None:
    joined(harness)
    data = as_bytes(zero_sum(("a", "b", "c"), N_WORDS, seed=58).payloads["a"])

    def short_stream() -> Iterator[pb.UploadChunk]:
        messages = upload_messages(harness, "a", 0, data, chunk=100)
        yield next(messages)
        yield next(messages)  # 100 of 288 bytes, then the stream ends

    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send(harness, "a", short_stream()),
        words="the stream ended after 100 of 288 bytes (wrong size)",
    )


def test_oversized_message_is_resource_exhausted(
    tmp_path: Path, certificates: Certificates
) -> None:
    data = bytes(MAX_MESSAGE_BYTES + 64)
    public = Layout.of({"big": (len(data) // 8,)})
    harness = start(tmp_path, certificates, layout=public)
    try:
        _one_huge_chunk_is_refused(harness, data, tensor_layouts(public))
    finally:
        harness.close()


def _one_huge_chunk_is_refused(
    harness: Harness, data: bytes, layout: list[pb.TensorLayout]
) -> None:
    joined(harness)

    def one_huge_chunk() -> Iterator[pb.UploadChunk]:
        messages = upload_messages(harness, "a", 0, data, layout=layout)
        yield next(messages)
        yield pb.UploadChunk(data=pb.PayloadChunk(offset=0, data=data))

    before = harness.session.store.dump()
    with pytest.raises(grpc.RpcError) as caught:
        send(harness, "a", one_huge_chunk())
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (caught.value.details() or "")
    # gRPC refuses the message itself, so the handler may still be cleaning up.
    give_up = time.monotonic() + 5
    while list(harness.session.store.payload_dir.glob(".part-*")) and time.monotonic() < give_up:
        time.sleep(0.01)
    assert harness.session.store.dump() == before


def test_layout_mismatch_between_nodes_is_invalid_argument(harness: Harness) -> None:
    joined(harness)
    data = zero_sum(("a", "b", "c"), N_WORDS, seed=59).payloads
    send(harness, "a", upload_messages(harness, "a", 0, as_bytes(data["a"])))
    renamed = layout_messages()
    renamed[2] = pb.TensorLayout(name="rest", shape=[20], offset=16, size=20)
    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send(
            harness, "b", upload_messages(harness, "b", 0, as_bytes(data["b"]), layout=renamed)
        ),
        words="tensor 'rest' stands where 'tail' (20,) belongs in this round's layout",
    )


def test_first_message_must_be_a_header(harness: Harness) -> None:
    joined(harness)

    def no_header() -> Iterator[pb.UploadChunk]:
        yield pb.UploadChunk(data=pb.PayloadChunk(offset=0, data=b"\x00" * 8))

    rejected(
        harness,
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send(harness, "a", no_header()),
        words="the first message of an upload must be its header",
    )


def test_result_of_an_unopened_round_is_not_found(harness: Harness) -> None:
    joined(harness)
    rejected(
        harness,
        grpc.StatusCode.NOT_FOUND,
        lambda: fetch_result(harness, "a", 1),
        words="round_index 1 has not opened",
    )


# ---------------------------------------------------------------- long polls


def _poll(h: Harness, node: str, round_index: int) -> tuple[float, pb.ResultHeader]:
    """One GetResult of ``node``: (seconds it took, its header)."""
    started = time.monotonic()
    header, _ = fetch_result(h, node, round_index)
    return time.monotonic() - started, header


def test_a_repeated_poll_is_held_until_what_its_node_acts_on_changes(
    tmp_path: Path, certificates: Certificates
) -> None:
    # A hold far longer than the test: only a change the node acts on can end it.
    h = start(tmp_path, certificates, hold=60.0)
    try:
        joined(h)
        data = zero_sum(("a", "b", "c"), N_WORDS, seed=91)
        send(h, "a", upload_messages(h, "a", 0, sent(h, "a", 0, data.payloads["a"])))
        first, header = _poll(h, "b", 0)
        assert header.status == pb.ROUND_STATUS_OPEN and first < 5.0
        held: list[tuple[float, pb.ResultHeader]] = []
        poller = threading.Thread(target=lambda: held.append(_poll(h, "b", 0)))
        poller.start()
        time.sleep(0.5)
        assert poller.is_alive(), "a poll that would show nothing new was answered at once"
        # Another node's upload commits, but the round is still open: nothing to act on.
        send(h, "c", upload_messages(h, "c", 0, sent(h, "c", 0, data.payloads["c"])))
        time.sleep(0.5)
        assert poller.is_alive(), "a held poll was answered for a commit its node ignores"
        # Another caller's first poll is not held.
        assert _poll(h, "c", 0)[0] < 5.0
        # The last upload moves the round to its unmask step: the held poll hears of it.
        send(h, "b", upload_messages(h, "b", 0, sent(h, "b", 0, data.payloads["b"])))
        poller.join(timeout=10)
        assert not poller.is_alive(), "the held poll did not hear of the unmask step"
        seconds, header = held[0]
        assert seconds >= 1.0 and header.status == pb.ROUND_STATUS_AWAITING_UNMASK
        assert header.unmask_request.pending
        # Attesting one by one: the others' polls are held until every survivor has signed.
        requests = {n: unmask_request(h, n, 0) for n in ("a", "b", "c")}
        _poll(h, "a", 0)
        attest(h, "b", requests["b"])
        waiting: list[tuple[float, pb.ResultHeader]] = []
        poller = threading.Thread(target=lambda: waiting.append(_poll(h, "a", 0)))
        poller.start()
        attest(h, "c", requests["c"])
        time.sleep(0.5)
        assert poller.is_alive(), "a held poll was answered before every survivor had signed"
        attest(h, "a", requests["a"])
        poller.join(timeout=10)
        assert not poller.is_alive(), "the held poll did not hear that every survivor signed"
        header = waiting[0][1]
        assert len(header.unmask_request.attestations) == 3
    finally:
        h.close()


def test_a_held_poll_answers_the_same_view_when_nothing_changes(
    tmp_path: Path, certificates: Certificates
) -> None:
    h = start(tmp_path, certificates, hold=0.4)
    try:
        joined(h)
        _, first = _poll(h, "a", 0)
        seconds, again = _poll(h, "a", 0)
        assert seconds >= 0.4
        assert again == first
    finally:
        h.close()


def test_a_ready_round_is_never_held(tmp_path: Path, certificates: Certificates) -> None:
    h = start(tmp_path, certificates, hold=60.0)
    try:
        joined(h)
        data = zero_sum(("a", "b", "c"), N_WORDS, seed=92)
        for node in ("a", "b", "c"):
            send(h, node, upload_messages(h, node, 0, sent(h, node, 0, data.payloads[node])))
        requests = {n: unmask_request(h, n, 0) for n in ("a", "b", "c")}
        for node in ("a", "b", "c"):
            attest(h, node, requests[node])
        for node in ("a", "b", "c"):
            answer(h, node, requests[node], None)
        for _ in range(2):
            seconds, header = _poll(h, "a", 0)
            assert header.status == pb.ROUND_STATUS_READY and seconds < 5.0
    finally:
        h.close()
