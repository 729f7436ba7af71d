"""The coordinator's state machine without a network: joins, rounds, dropouts, unmasking.

Every refused message is checked to leave the state file (every row and every
payload file) exactly as it was, and the aggregate computed afterwards to be
exact, so a refused partial stream left no trace in the running sum either.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import blake3
import numpy as np
import pytest

from coordinator.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RetryLater,
    StateFileError,
    Unauthenticated,
)
from coordinator.layout import PayloadSpec, TensorSlot
from coordinator.session import Session, Ticket
from coordinator.store import Store
from noise.keys import IdentityKey, sign_key_bundle
from noise.transcript import sealed_set_message, sealed_tree, survivor_set_hash
from proto.messages import (
    RoundState,
    Sealed,
    SessionState,
    UnmaskHeader,
    UnmaskReceipt,
    UnmaskRefusal,
    UploadHeader,
    UploadStatement,
)
from tests.coordinator.support import (
    CONFIG_HASH,
    LAYOUT,
    N_WORDS,
    FakeClock,
    Federation,
    ZeroSum,
    attest_all,
    final_roster_hash,
    join_all,
    make_federation,
    masked,
    node_seed,
    read_result,
    refused,
    reveal_all,
    run_round,
    sealed_challenge,
    sent_digest,
    signed_header,
    spec_for,
    stream,
    submit_correction,
    unmask_round,
    upload,
    wrapping_total,
    zero_sum,
)

# ---------------------------------------------------------------- joins and roster


def test_first_start_creates_a_random_session_in_the_join_phase(session: Session) -> None:
    assert len(session.session_id) == 32
    int(session.session_id, 16)
    assert session.state() == SessionState.JOINING
    assert not session.resumed


def test_roster_becomes_final_and_round_0_opens_when_every_node_joined(
    fed: Federation, session: Session
) -> None:
    receipt = session.join(fed.bundle("a", session.session_id), caller="a")
    assert (receipt.joined_count, receipt.federation_size, receipt.rejoined) == (1, 3, False)
    roster = session.roster(session.session_id, caller="b")
    assert not roster.final and roster.version == 1
    join_all(fed, session, ["b", "c"])
    roster = session.roster(session.session_id, caller="b")
    assert roster.final and roster.version == 3 and roster.excluded == ()
    assert [b.node_id for b in roster.bundles] == ["a", "b", "c"]
    assert session.state() == SessionState.RUNNING
    status = session.status(session.session_id)
    assert (status.current_round_index, status.current_round_name) == (0, "moments")
    assert status.rounds[0].state == RoundState.OPEN


def test_the_same_join_again_is_accepted_as_a_rejoin(fed: Federation, session: Session) -> None:
    bundle = fed.bundle("a", session.session_id)
    session.join(bundle, caller="a")
    before = session.store.dump()
    receipt = session.join(bundle, caller="a")
    assert receipt.rejoined
    assert session.store.dump() == before


def test_a_second_key_for_a_joined_node_is_refused(fed: Federation, session: Session) -> None:
    session.join(fed.bundle("a", session.session_id), caller="a")
    fed.ephemeral.clear()
    message = refused(
        session,
        AlreadyExists,
        lambda: session.join(fed.bundle("a", session.session_id), caller="a"),
    )
    assert "already joined" in message


def test_join_replayed_from_another_session_is_refused(fed: Federation, session: Session) -> None:
    old = fed.bundle("a", "0" * 32)
    message = refused(session, Unauthenticated, lambda: session.join(old, caller="a"))
    assert "replayed from another session" in message


def test_join_signed_for_another_federation_is_refused(fed: Federation, session: Session) -> None:
    other = fed.bundle("a", session.session_id, config_hash=hashlib.sha256(b"other").digest())
    message = refused(session, Unauthenticated, lambda: session.join(other, caller="a"))
    assert "another federation" in message


def test_join_with_a_bad_signature_is_refused(fed: Federation, session: Session) -> None:
    forged = sign_key_bundle(
        IdentityKey.generate(),
        config_hash=CONFIG_HASH,
        session_id=session.session_id,
        node_id="a",
        public_key=bytes(range(32)),
    )
    message = refused(session, Unauthenticated, lambda: session.join(forged, caller="a"))
    assert "does not verify against the pinned identity key" in message


def test_join_for_another_node_than_the_certificate_is_refused(
    fed: Federation, session: Session
) -> None:
    bundle = fed.bundle("b", session.session_id)
    message = refused(session, PermissionDenied, lambda: session.join(bundle, caller="a"))
    assert "belongs to node 'a'" in message and "'b'" in message


def test_join_by_a_node_outside_the_federation_is_refused(session: Session) -> None:
    stranger = IdentityKey.generate()
    bundle = sign_key_bundle(
        stranger,
        config_hash=CONFIG_HASH,
        session_id=session.session_id,
        node_id="zed",
        public_key=bytes(range(32)),
    )
    message = refused(session, PermissionDenied, lambda: session.join(bundle, caller="zed"))
    assert "not a member of federation 'testfed'" in message


def test_join_deadline_with_enough_nodes_runs_without_the_late_one(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session, ["a", "b"])
    session.tick(clock.advance(59_999))
    assert session.state() == SessionState.JOINING
    session.tick(clock.advance(1))
    assert session.state() == SessionState.RUNNING
    roster = session.roster(session.session_id, caller="a")
    assert roster.final and roster.excluded == ("c",)
    late = fed.bundle("c", session.session_id)
    message = refused(session, PermissionDenied, lambda: session.join(late, caller="c"))
    assert "join phase" in message and "excluded" in message


def test_join_deadline_with_too_few_nodes_fails_the_session(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session, ["b"])
    session.tick(clock.advance(60_000))
    assert session.state() == SessionState.ABORTED
    assert session.reason() == (
        "only 1 of 3 nodes joined before the join deadline (a, c missing); "
        "the federation requires at least 2"
    )


def test_roster_request_with_a_wrong_session_id_is_refused(session: Session) -> None:
    message = refused(session, InvalidArgument, lambda: session.roster("f" * 32, caller="a"))
    assert "is not this coordinator's session" in message


# ---------------------------------------------------------------- rounds


def test_two_rounds_without_dropouts_give_the_exact_sums(fed: Federation, session: Session) -> None:
    join_all(fed, session)
    for round_index in (0, 1):
        data = zero_sum(fed.node_ids, N_WORDS, seed=round_index)
        for node in fed.node_ids:
            upload(session, node, round_index, data.payloads[node])
        # Every upload is in, yet nothing is published before the seeds are revealed.
        view = session.result(session.session_id, round_index, caller="a")
        assert view.status == RoundState.AWAITING_UNMASK and view.path is None
        assert (view.survivors, view.dropped) == (fed.node_ids, ())
        reveal_all(fed, session, round_index)
        np.testing.assert_array_equal(read_result(session, round_index), data.total(fed.node_ids))
        view = session.result(session.session_id, round_index, caller="b")
        assert view.status == RoundState.READY and view.survivors == ("a", "b", "c")
        assert view.payload is not None and view.payload.tensors == LAYOUT
        assert view.payload.digest == blake3.blake3(view.path.read_bytes()).digest()  # type: ignore[union-attr]
    assert session.state() == SessionState.COMPLETED
    status = session.status(session.session_id)
    assert [r.name for r in status.rounds] == ["moments", "scatter"]


def test_chunks_not_aligned_to_words_are_summed_exactly(fed: Federation, session: Session) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=5)
    for node, chunk in zip(fed.node_ids, (1, 13, 287), strict=True):
        upload(session, node, 0, data.payloads[node], chunk=chunk)
    reveal_all(fed, session, 0)
    np.testing.assert_array_equal(read_result(session, 0), data.total(fed.node_ids))


def test_the_same_upload_again_is_a_duplicate_and_changes_nothing(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=1)
    first = upload(session, "a", 0, data.payloads["a"])
    before = session.store.dump()
    again = upload(session, "a", 0, data.payloads["a"])
    assert session.store.dump() == before
    assert again.duplicate and not first.duplicate and again.digest == first.digest
    upload(session, "b", 0, data.payloads["b"])
    upload(session, "c", 0, data.payloads["c"])
    # Still a duplicate while the round unmasks and after it completed (a retry
    # whose answer was lost).
    assert upload(session, "a", 0, data.payloads["a"]).duplicate
    reveal_all(fed, session, 0)
    assert upload(session, "a", 0, data.payloads["a"]).duplicate
    np.testing.assert_array_equal(read_result(session, 0), data.total(fed.node_ids))


def test_a_conflicting_upload_is_refused(fed: Federation, session: Session) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=1)
    upload(session, "a", 0, data.payloads["a"])
    other = data.payloads["a"].copy()
    other[0] ^= np.uint64(1)
    message = refused(session, FailedPrecondition, lambda: upload(session, "a", 0, other))
    assert message.startswith("conflicting upload: node 'a' already submitted round 0")


def bad_headers(session: Session, payload: np.ndarray) -> dict[str, tuple[type, UploadHeader]]:
    good = spec_for(payload)
    sid = session.session_id

    def header(**changes: object) -> UploadHeader:
        fields: dict[str, object] = {
            "session_id": sid,
            "round_index": 0,
            "round_name": "moments",
            "node": "a",
            "spec": good,
        }
        fields.update(changes)
        return signed_header(session, **fields)  # type: ignore[arg-type]

    def spec(**changes: object) -> PayloadSpec:
        fields = {
            "total_bytes": good.total_bytes,
            "total_elements": good.total_elements,
            "digest": good.digest,
            "fixed_point_bits": good.fixed_point_bits,
            "tensors": good.tensors,
        }
        fields.update(changes)
        return PayloadSpec(**fields)  # type: ignore[arg-type]

    shifted = (TensorSlot("count", (), 0, 1), TensorSlot("sums", (3, 5), 2, 15))
    return {
        "wrong session": (InvalidArgument, header(session_id="0" * 32)),
        "round not open": (FailedPrecondition, header(round_index=1, round_name="scatter")),
        "wrong round name": (InvalidArgument, header(round_name="scatter")),
        "other node's id": (PermissionDenied, header(node="b")),
        "unknown node": (PermissionDenied, header(node="zed")),
        "size mismatch": (InvalidArgument, header(spec=spec(total_bytes=good.total_bytes - 8))),
        "layout gap": (
            InvalidArgument,
            header(spec=spec(tensors=shifted, total_elements=17, total_bytes=136)),
        ),
        "short digest": (InvalidArgument, header(spec=spec(digest=b"\x00" * 31))),
        "wrong scale": (InvalidArgument, header(spec=spec(fixed_point_bits=16))),
        "empty": (InvalidArgument, header(spec=spec(total_bytes=0, total_elements=0))),
        "statement by a stranger": (Unauthenticated, header(identity=IdentityKey.generate())),
        "no statement": (
            Unauthenticated,
            replace(header(), statement_signature=b""),
        ),
        "statement for another payload": (
            Unauthenticated,
            replace(header(), payload=spec(digest=hashlib.sha256(b"other").digest())),
        ),
        "statement over another roster": (
            FailedPrecondition,
            header(roster=hashlib.sha256(b"another roster").digest()),
        ),
        "short roster hash": (InvalidArgument, header(roster=b"\x01" * 31)),
        "short commitment": (
            InvalidArgument,
            replace(header(), self_mask_commitment=b"\x02" * 31),
        ),
        "long commitment": (
            InvalidArgument,
            replace(header(), self_mask_commitment=b"\x02" * 33),
        ),
        "no commitment": (InvalidArgument, replace(header(), self_mask_commitment=b"")),
        "no challenge": (InvalidArgument, replace(header(), challenge=())),
        "challenge missing a peer": (
            InvalidArgument,
            replace(header(), challenge=header().challenge[:-1]),
        ),
        "challenge for itself": (
            InvalidArgument,
            replace(
                header(),
                challenge=(*header().challenge[:-1], Sealed("a", "a", bytes(48))),
            ),
        ),
        "challenge in another's name": (
            InvalidArgument,
            replace(
                header(),
                challenge=tuple(Sealed("b", c.recipient, c.sealed) for c in header().challenge),
            ),
        ),
        "short challenge": (
            InvalidArgument,
            replace(
                header(),
                challenge=tuple(
                    Sealed(c.sender, c.recipient, c.sealed[:47]) for c in header().challenge
                ),
            ),
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "wrong session",
        "round not open",
        "wrong round name",
        "other node's id",
        "unknown node",
        "size mismatch",
        "layout gap",
        "short digest",
        "wrong scale",
        "empty",
        "statement by a stranger",
        "no statement",
        "statement for another payload",
        "statement over another roster",
        "short roster hash",
        "short commitment",
        "long commitment",
        "no commitment",
        "no challenge",
        "challenge missing a peer",
        "challenge for itself",
        "challenge in another's name",
        "short challenge",
    ],
)
def test_bad_upload_headers_are_refused_and_change_nothing(
    fed: Federation, session: Session, case: str
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=2)
    error, header = bad_headers(session, data.payloads["a"])[case]
    refused(session, error, lambda: session.begin_upload(header, caller="a"))
    run_round(fed, session, 0, data.payloads)
    np.testing.assert_array_equal(read_result(session, 0), data.total(fed.node_ids))


def test_upload_statements_are_checked_then_returned_with_the_aggregate(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=16)
    spec = spec_for(data.payloads["a"])
    forged = signed_header(session, "a", 0, "moments", spec, identity=fed.identities["b"])
    message = refused(session, Unauthenticated, lambda: session.begin_upload(forged, caller="a"))
    assert message == (
        "the upload statement of node 'a' for round 0 ('moments') does not verify against the "
        "identity key pinned for 'a'; the upload is refused."
    )
    final = final_roster_hash(session)
    other = hashlib.sha256(b"a roster only a was shown").digest()
    elsewhere = signed_header(session, "a", 0, "moments", spec, roster=other)
    message = refused(
        session, FailedPrecondition, lambda: session.begin_upload(elsewhere, caller="a")
    )
    assert f"over roster hash {other.hex()[:16]}…" in message
    assert f"final roster hashes to {final.hex()[:16]}…" in message
    run_round(fed, session, 0, data.payloads)
    # A retry of a stored upload is checked too before it is called a duplicate.
    refused(session, FailedPrecondition, lambda: session.begin_upload(elsewhere, caller="a"))
    view = session.result(session.session_id, 0, caller="c")
    sent = {
        node: spec_for(np.frombuffer(masked(session, node, 0, data.payloads[node]), "<u8"))
        for node in fed.node_ids
    }
    assert view.statements == tuple(
        UploadStatement(
            node_id=node,
            round_name="moments",
            roster_hash=final,
            payload_digest=sent_digest(session, node, 0, data.payloads[node]),
            signature=signed_header(session, node, 0, "moments", sent[node]).statement_signature,
        )
        for node in fed.node_ids
    )


def test_a_layout_different_from_the_rounds_is_refused_naming_the_tensor(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=3)
    upload(session, "a", 0, data.payloads["a"])
    reshaped = (
        TensorSlot("count", (), 0, 1),
        TensorSlot("sums", (5, 3), 1, 15),
        TensorSlot("tail", (20,), 16, 20),
    )
    header = signed_header(session, "b", 0, "moments", spec_for(data.payloads["b"], reshaped))
    message = refused(session, InvalidArgument, lambda: session.begin_upload(header, caller="b"))
    assert "tensor 'sums' has shape (5, 3); expected (3, 5)" in message


StreamFault = Callable[[Session, Ticket, bytes], None]


def _gap(session: Session, ticket: Ticket, data: bytes) -> None:
    session.receive(ticket, 0, data[:40])
    session.receive(ticket, 48, data[48:])


def _too_long(session: Session, ticket: Ticket, data: bytes) -> None:
    session.receive(ticket, 0, data + b"\x00" * 8)


def _short(session: Session, ticket: Ticket, data: bytes) -> None:
    session.receive(ticket, 0, data[:-3])
    session.finish(ticket)


def _corrupt(session: Session, ticket: Ticket, data: bytes) -> None:
    stream(session, ticket, data[:-1] + bytes([data[-1] ^ 1]), 50)
    session.finish(ticket)


def _huge_chunk(session: Session, ticket: Ticket, data: bytes) -> None:
    session.receive(ticket, 0, data[:16])
    session.receive(ticket, 16, bytes((1 << 20) + 1))


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        (_gap, "expected 40"),
        (_too_long, "runs past"),
        (_short, "ended after 285 of 288 bytes"),
        (_corrupt, "digest"),
        (_huge_chunk, "exceeds the limit"),
    ],
)
def test_bad_streams_are_refused_and_leave_no_trace_in_the_sum(
    fed: Federation, session: Session, fault: StreamFault, words: str
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=4)
    upload(session, "b", 0, data.payloads["b"])
    before = session.store.dump()
    payload = data.payloads["a"].astype("<u8").tobytes()
    header = signed_header(session, "a", 0, "moments", spec_for(data.payloads["a"]))
    ticket = session.begin_upload(header, caller="a")
    assert isinstance(ticket, Ticket)
    with pytest.raises(InvalidArgument, match=words):
        try:
            fault(session, ticket, payload)
        finally:
            session.abandon(ticket)
    assert session.store.dump() == before
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "c", 0, data.payloads["c"])
    reveal_all(fed, session, 0)
    np.testing.assert_array_equal(read_result(session, 0), data.total(fed.node_ids))


def test_a_second_concurrent_stream_of_the_same_upload_is_told_to_retry(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=6)
    header = signed_header(session, "a", 0, "moments", spec_for(data.payloads["a"]))
    ticket = session.begin_upload(header, caller="a")
    assert isinstance(ticket, Ticket)
    refused(session, RetryLater, lambda: session.begin_upload(header, caller="a"))
    session.abandon(ticket)
    run_round(fed, session, 0, data.payloads)
    np.testing.assert_array_equal(read_result(session, 0), data.total(fed.node_ids))


def test_result_of_a_round_not_yet_open_is_not_found(fed: Federation, session: Session) -> None:
    join_all(fed, session)
    message = refused(session, NotFound, lambda: session.result(session.session_id, 1, caller="a"))
    assert "round_index 1 has not opened" in message


# ---------------------------------------------------------------- dropouts and unmasking


def test_dropout_after_the_roster_is_unmasked_to_the_exact_survivor_sum(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=7)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    session.tick(clock.advance(60_000))
    view = session.result(session.session_id, 0, caller="a")
    assert view.status == RoundState.AWAITING_UNMASK
    assert (view.survivors, view.dropped) == (("a", "b"), ("c",))
    assert view.survivor_hash == survivor_set_hash(
        CONFIG_HASH, session.session_id, 0, ["a", "b"], ["c"]
    )
    assert view.unmask_request is not None and view.unmask_request.tensors == LAYOUT
    dropped = unmask_round(fed, session, 0, ["a", "b"])
    assert dropped == ("c",)
    request = session.unmask_request(session.session_id, 0, caller="a")
    assert {a.node_id for a in request.attestations} == {"a", "b"}
    receipt = submit_correction(session, "a", 0, data.correction("a", dropped))
    assert isinstance(receipt, UnmaskReceipt) and receipt.received_count == 1
    submit_correction(session, "b", 0, data.correction("b", dropped))
    np.testing.assert_array_equal(read_result(session, 0), data.total(["a", "b"]))
    # Round 1 is between the survivors only; c stays dropped.
    status = session.status(session.session_id)
    assert status.rounds[0].dropped == ("c",)
    assert session.store.round(1).participants == ("a", "b")  # type: ignore[union-attr]
    late = zero_sum(fed.node_ids, N_WORDS, seed=8).payloads["c"]
    message = refused(session, FailedPrecondition, lambda: upload(session, "c", 1, late))
    assert "was dropped from this session in round 0" in message
    second = zero_sum(["a", "b"], N_WORDS, seed=9)
    run_round(fed, session, 1, second.payloads)
    np.testing.assert_array_equal(read_result(session, 1), second.total(["a", "b"]))
    assert session.state() == SessionState.COMPLETED


def test_too_few_answers_at_the_unmask_deadline_fail_the_session(
    clock: FakeClock, state_path: Path
) -> None:
    fed = make_federation(("a", "b", "c", "d"), min_nodes=2)
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=10)
    for node in ("a", "b", "c"):
        upload(session, node, 0, data.payloads[node])
    session.tick(clock.advance(60_000))
    unmask_round(fed, session, 0, ["a", "b", "c"])
    submit_correction(session, "a", 0, data.correction("a", ["d"]))
    session.tick(clock.advance(60_000))  # b and c never answer
    assert session.state() == SessionState.ABORTED
    assert session.reason() == (
        "only 1 of 3 survivors answered the unmask request for round 'moments' (b, c silent); "
        "the federation requires at least 2"
    )
    assert session.result(session.session_id, 0, caller="a").status == RoundState.FAILED


def test_survivor_silent_at_the_unmask_deadline_supersedes_the_round_and_reruns_it(
    clock: FakeClock, state_path: Path
) -> None:
    fed = make_federation(("a", "b", "c", "d"), min_nodes=2)
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=11)
    for node in ("a", "b", "c"):
        upload(session, node, 0, data.payloads[node])
    session.tick(clock.advance(60_000))
    unmask_round(fed, session, 0, ["a", "b", "c"])
    submit_correction(session, "a", 0, data.correction("a", ["d"]))
    submit_correction(session, "b", 0, data.correction("b", ["d"]))
    session.tick(clock.advance(60_000))  # c never answers
    status = session.status(session.session_id)
    assert [(r.name, r.state) for r in status.rounds] == [
        ("moments", RoundState.SUPERSEDED),
        ("moments", RoundState.OPEN),
    ]
    assert status.rounds[0].reason == (
        "c did not answer the unmask request of round 0 ('moments'); the round is rerun as "
        "'moments' among a, b from round 1, with fresh keys; attempt 2 of plan round 'moments' "
        "(at most 3)"
    )
    assert [(d.node_id, d.round_index) for d in status.dropped] == [("c", 0), ("d", 0)]
    assert status.dropped[0].reason == (
        "did not answer the unmask request for round 0 ('moments') before its deadline"
    )
    # Nothing of round 0 is published: the uploads not unmasked stay one-time padded.
    view = session.result(session.session_id, 0, caller="a")
    assert view.status == RoundState.SUPERSEDED
    assert (view.path, view.payload, view.statements) == (None, None, ())
    assert (view.survivors, view.dropped) == (("a", "b"), ("c", "d"))
    assert session.store.result(0) is None
    assert not list(session.store.payload_dir.glob("r0000-result-*"))
    # Its request is never asked again, nor answered.
    assert not session.unmask_request(session.session_id, 0, caller="a").pending
    message = refused(session, FailedPrecondition, lambda: submit_correction(session, "a", 0, None))
    assert "conflicting unmask answer: node 'a' already answered round 0" in message
    # The rerun is a new round index among the speakers; c stays dropped.
    assert session.store.round(1).participants == ("a", "b")  # type: ignore[union-attr]
    late = zero_sum(fed.node_ids, N_WORDS, seed=12).payloads["c"]
    message = refused(session, FailedPrecondition, lambda: upload(session, "c", 1, late))
    assert "was dropped from this session in round 0" in message
    rerun = zero_sum(["a", "b"], N_WORDS, seed=13)
    run_round(fed, session, 1, rerun.payloads)
    np.testing.assert_array_equal(read_result(session, 1), rerun.total(["a", "b"]))
    assert len(list(session.store.payload_dir.glob("r0001-result-*"))) == 1
    assert [s.node_id for s in session.result(session.session_id, 1, caller="a").statements] == [
        "a",
        "b",
    ]
    assert session.store.round(2).name == "scatter"  # type: ignore[union-attr]
    run_round(fed, session, 2, zero_sum(["a", "b"], N_WORDS, seed=14).payloads)
    assert session.state() == SessionState.COMPLETED


def test_the_rerun_cap_fails_the_session_instead_of_another_attempt(
    clock: FakeClock, state_path: Path
) -> None:
    """max_reruns = 1: the first stall reruns the round, the second fails the session."""
    fed = make_federation(("a", "b", "c", "d", "e"), min_nodes=2, max_reruns=1)
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    for index, (silent, speakers) in enumerate(
        [("e", ["a", "b", "c", "d"]), ("d", ["a", "b", "c"])]
    ):
        data = zero_sum([*speakers, silent], N_WORDS, seed=30 + index)
        for node in (*speakers, silent):
            upload(session, node, index, data.payloads[node])
        request = session.unmask_request(session.session_id, index, caller="a")
        for node in speakers:  # the silent node never attests
            session.attest(
                fed.attestation(
                    node,
                    session.session_id,
                    index,
                    request.survivor_hash,
                    survivors=request.survivors,
                ),
                caller=node,
            )
        session.tick(clock.advance(60_000))
    status = session.status(session.session_id)
    assert [(r.name, r.state) for r in status.rounds] == [
        ("moments", RoundState.SUPERSEDED),
        ("moments", RoundState.FAILED),
    ]
    assert status.rounds[0].reason.endswith("attempt 2 of plan round 'moments' (at most 2)")
    assert session.state() == SessionState.ABORTED
    assert session.reason() == (
        "round 1 ('moments') would need another rerun (d silent), but plan round 'moments' was "
        "superseded 1 time already (rounds 0), the most session.max_reruns = 1 allows: each "
        "attempt is another release of the same data by every node"
    )


def test_a_survivor_that_never_attested_is_dropped_and_the_attesters_rerun_the_round(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=19)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    request = session.unmask_request(session.session_id, 0, caller="a")
    assert request.pending and request.dropped == () and request.survivors == fed.node_ids
    for node in ("a", "b"):  # c never attests, so nobody may answer yet
        session.attest(
            fed.attestation(
                node, session.session_id, 0, request.survivor_hash, survivors=request.survivors
            ),
            caller=node,
        )
    session.tick(clock.advance(60_000))
    status = session.status(session.session_id)
    assert [(r.name, r.state) for r in status.rounds] == [
        ("moments", RoundState.SUPERSEDED),
        ("moments", RoundState.OPEN),
    ]
    assert status.rounds[0].reason == (
        "c did not answer the unmask request of round 0 ('moments'); the round is rerun as "
        "'moments' among a, b from round 1, with fresh keys; attempt 2 of plan round 'moments' "
        "(at most 3)"
    )
    assert session.store.result(0) is None
    assert session.store.round(1).participants == ("a", "b")  # type: ignore[union-attr]
    rerun = zero_sum(["a", "b"], N_WORDS, seed=20)
    run_round(fed, session, 1, rerun.payloads)
    np.testing.assert_array_equal(read_result(session, 1), rerun.total(["a", "b"]))


def test_too_few_attestations_at_the_unmask_deadline_fail_the_session(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=21)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    request = session.unmask_request(session.session_id, 0, caller="a")
    session.attest(
        fed.attestation(
            "a", session.session_id, 0, request.survivor_hash, survivors=request.survivors
        ),
        caller="a",
    )
    session.tick(clock.advance(60_000))
    assert session.state() == SessionState.ABORTED
    assert session.reason() == (
        "only 1 of 3 survivors answered the unmask request for round 'moments' (b, c silent); "
        "the federation requires at least 2"
    )
    assert session.store.result(0) is None


@pytest.mark.parametrize(
    ("stalled", "rounds"),
    [
        (
            0,
            [
                ("cape-sum/moments", RoundState.SUPERSEDED),
                ("cape-sum/moments", RoundState.OPEN),
            ],
        ),
        (
            1,
            [
                ("cape-sum/moments", RoundState.READY),
                ("moments", RoundState.SUPERSEDED),
                ("cape-sum/moments", RoundState.OPEN),
            ],
        ),
    ],
    ids=["cape-sum-reruns-itself", "cape-model-reruns-its-cape-sum"],
)
def test_a_stalled_cape_unmask_reruns_from_the_cape_sum(
    clock: FakeClock, state_path: Path, stalled: int, rounds: list[tuple[str, str]]
) -> None:
    fed = make_federation(("a", "b", "c"), construction="cape")
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    for round_index in range(stalled):
        run_round(fed, session, round_index, zero_sum(fed.node_ids, N_WORDS, seed=22).payloads)
    data = zero_sum(fed.node_ids, N_WORDS, seed=23)
    for node in fed.node_ids:
        upload(session, node, stalled, data.payloads[node])
    attest_all(fed, session, stalled)
    submit_correction(session, "a", stalled, None)
    submit_correction(session, "b", stalled, None)
    session.tick(clock.advance(60_000))  # c attested but never answers
    status = session.status(session.session_id)
    assert [(r.name, r.state) for r in status.rounds] == rounds
    assert session.store.result(stalled) is None
    rerun = stalled + 1
    assert session.store.round(rerun).participants == ("a", "b")  # type: ignore[union-attr]
    blind = zero_sum(["a", "b"], N_WORDS, seed=24)
    run_round(fed, session, rerun, blind.payloads)
    np.testing.assert_array_equal(read_result(session, rerun), blind.total(["a", "b"]))
    assert session.store.round(rerun + 1).name == "moments"  # type: ignore[union-attr]


def test_too_few_uploads_at_the_deadline_fail_the_session_with_a_reason(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    upload(session, "c", 0, zero_sum(fed.node_ids, N_WORDS, seed=12).payloads["c"])
    session.tick(clock.advance(60_000))
    assert session.state() == SessionState.ABORTED
    assert session.reason() == (
        "only 1 of 3 nodes submitted round 'moments' (a, b dropped); "
        "the federation requires at least 2"
    )
    view = session.result(session.session_id, 0, caller="c")
    assert view.status == RoundState.FAILED and view.reason == session.reason()
    assert view.dropped == ("a", "b")


def test_upload_in_progress_at_the_deadline_is_withdrawn_from_the_sum(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=13)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    header = signed_header(session, "c", 0, "moments", spec_for(data.payloads["c"]))
    ticket = session.begin_upload(header, caller="c")
    assert isinstance(ticket, Ticket)
    raw = data.payloads["c"].astype("<u8").tobytes()
    session.receive(ticket, 0, raw[:101])
    session.tick(clock.advance(60_000))
    with pytest.raises(FailedPrecondition, match="dropped while the stream was in progress"):
        session.receive(ticket, 101, raw[101:])
    session.abandon(ticket)
    dropped = unmask_round(fed, session, 0, ["a", "b"])
    submit_correction(session, "a", 0, data.correction("a", dropped))
    submit_correction(session, "b", 0, data.correction("b", dropped))
    np.testing.assert_array_equal(read_result(session, 0), data.total(["a", "b"]))
    assert not list(session.store.payload_dir.glob(".part-*"))


def test_bad_attestations_and_early_corrections_are_refused(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=14)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    session.tick(clock.advance(60_000))
    request = session.unmask_request(session.session_id, 0, caller="a")
    sid = session.session_id
    stale = fed.attestation("a", sid, 0, hashlib.sha256(b"other set").digest())
    assert "fetch the request again" in refused(
        session, FailedPrecondition, lambda: session.attest(stale, caller="a")
    )
    forged = fed.attestation("b", sid, 0, request.survivor_hash, survivors=request.survivors)
    forged = type(forged)(
        "a", request.survivor_hash, forged.signature, session_id=sid, round_index=0
    )
    assert "does not verify" in refused(
        session, Unauthenticated, lambda: session.attest(forged, caller="a")
    )
    dropped_one = fed.attestation("c", sid, 0, request.survivor_hash, survivors=request.survivors)
    assert "not a survivor" in refused(
        session, FailedPrecondition, lambda: session.attest(dropped_one, caller="c")
    )
    session.attest(
        fed.attestation("a", sid, 0, request.survivor_hash, survivors=request.survivors), caller="a"
    )
    early = data.correction("a", ["c"])
    seed = node_seed("a", 0)
    header = UnmaskHeader(
        sid, 0, "moments", "a", ("c",), request.survivor_hash, spec_for(early), seed
    )
    assert "not every survivor has attested" in refused(
        session, FailedPrecondition, lambda: session.begin_unmask(header, caller="a")
    )
    wrong_set = UnmaskHeader(sid, 0, "moments", "a", (), request.survivor_hash, None, seed)
    assert "fetch the request again" in refused(
        session, FailedPrecondition, lambda: session.begin_unmask(wrong_set, caller="a")
    )


@pytest.mark.parametrize("length", [0, 31, 33, 64], ids=["none", "short", "long", "twice"])
def test_an_upload_commitment_of_the_wrong_length_names_the_field(
    fed: Federation, session: Session, length: int
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=26)
    good = signed_header(session, "a", 0, "moments", spec_for(data.payloads["a"]))
    header = replace(good, self_mask_commitment=b"\x03" * length)
    message = refused(session, InvalidArgument, lambda: session.begin_upload(header, caller="a"))
    assert message == (
        "upload of node 'a' for round 0: self_mask_commitment must be 32 raw bytes; "
        f"got {length} bytes."
    )


# ---------------------------------------------------------------- unmask answers


def test_the_aggregate_is_the_plain_sum_of_the_payloads_under_the_self_masks(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    # No pair masks at all: only the self-masks hide these payloads.
    rng = np.random.default_rng(27)
    plain = {
        n: rng.integers(0, 2**64 - 1, N_WORDS, dtype=np.uint64, endpoint=True) for n in fed.node_ids
    }
    for node in fed.node_ids:
        upload(session, node, 0, plain[node])
    held = {
        u.node_id: np.frombuffer(session.store.payload_path(u.path).read_bytes(), "<u8")
        for u in session.store.uploads(0)
    }
    # What the coordinator holds is padded word by word, and so is its sum.
    for node in fed.node_ids:
        assert not np.any(held[node] == plain[node])
    assert not np.array_equal(
        wrapping_total(list(held.values())), wrapping_total(list(plain.values()))
    )
    reveal_all(fed, session, 0)
    np.testing.assert_array_equal(read_result(session, 0), wrapping_total(list(plain.values())))
    answers = session.store.corrections(0, 1)
    assert [(c.node_id, c.self_mask_seed) for c in answers] == [
        (n, node_seed(n, 0)) for n in fed.node_ids
    ]
    assert all((c.path, c.digest, c.size) == (None, b"", 0) for c in answers)


def all_uploaded_and_attested(fed: Federation, session: Session, seed: int) -> ZeroSum:
    """Round 0 with every upload in and every survivor's attestation: answers may follow."""
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=seed)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    attest_all(fed, session, 0)
    return data


def dropout_attested(fed: Federation, session: Session, clock: FakeClock, seed: int) -> ZeroSum:
    """Round 0 after c missed the deadline, with a and b's attestations."""
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=seed)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    session.tick(clock.advance(60_000))
    attest_all(fed, session, 0)
    return data


@pytest.mark.parametrize(
    "wrong",
    [node_seed("a", 1), node_seed("b", 0), bytes(32)],
    ids=["another-rounds-seed", "another-nodes-seed", "zeros"],
)
@pytest.mark.parametrize("dropout", [False, True], ids=["nobody-dropped", "c-dropped"])
def test_a_seed_that_does_not_match_the_commitment_is_refused_and_nothing_is_stored(
    fed: Federation, session: Session, clock: FakeClock, wrong: bytes, dropout: bool
) -> None:
    if dropout:
        data = dropout_attested(fed, session, clock, seed=28)
        survivors = ["a", "b"]
    else:
        data = all_uploaded_and_attested(fed, session, seed=28)
        survivors = list(fed.node_ids)
    correction = data.correction("a", ["c"]) if dropout else None
    message = refused(
        session,
        InvalidArgument,
        lambda: submit_correction(session, "a", 0, correction, seed=wrong),
    )
    commitment = session.store.upload(0, "a").self_mask_commitment  # type: ignore[union-attr]
    assert message == (
        "unmask answer of node 'a' for round 0: the self-mask seed does not match the "
        f"commitment {commitment.hex()[:16]}… sent with its upload; the node's upload could "
        "not be unmasked with it."
    )
    assert session.store.corrections(0, 1) == []
    assert not list(session.store.payload_dir.glob(".part-*"))
    # The right seed is still welcome, and the aggregate is exact.
    for node in survivors:
        submit_correction(session, node, 0, data.correction(node, ["c"]) if dropout else None)
    np.testing.assert_array_equal(read_result(session, 0), data.total(survivors))


@pytest.mark.parametrize("length", [0, 16, 31, 33], ids=["none", "half", "short", "long"])
def test_a_seed_of_the_wrong_length_is_refused_naming_the_field(
    fed: Federation, session: Session, length: int
) -> None:
    all_uploaded_and_attested(fed, session, seed=29)
    message = refused(
        session,
        InvalidArgument,
        lambda: submit_correction(session, "a", 0, None, seed=b"\x04" * length),
    )
    assert message == (
        "unmask answer of node 'a' for round 0: self_mask_seed must be 32 raw bytes; "
        f"got {length} bytes."
    )


def test_an_answer_with_corrections_when_nobody_dropped_is_refused(
    fed: Federation, session: Session
) -> None:
    data = all_uploaded_and_attested(fed, session, seed=30)
    stray = np.zeros(N_WORDS, dtype=np.uint64)
    message = refused(session, InvalidArgument, lambda: submit_correction(session, "a", 0, stray))
    assert message == (
        "unmask answer of node 'a' for round 0: nobody dropped, so the answer is the "
        "self-mask seed alone; it carries a correction payload."
    )
    reveal_all(fed, session, 0)
    np.testing.assert_array_equal(read_result(session, 0), data.total(fed.node_ids))


def test_an_answer_without_corrections_after_a_dropout_is_refused(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    data = dropout_attested(fed, session, clock, seed=31)
    message = refused(session, InvalidArgument, lambda: submit_correction(session, "a", 0, None))
    assert message == (
        "unmask answer of node 'a' for round 0: nodes c dropped, so the answer must carry "
        "the pair terms with them; it has no payload."
    )
    for node in ("a", "b"):
        submit_correction(session, node, 0, data.correction(node, ["c"]))
    np.testing.assert_array_equal(read_result(session, 0), data.total(["a", "b"]))


def test_seeds_before_every_survivor_attested_are_refused(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=32)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    request = session.unmask_request(session.session_id, 0, caller="a")
    for node in ("a", "b"):
        session.attest(
            fed.attestation(
                node, session.session_id, 0, request.survivor_hash, survivors=request.survivors
            ),
            caller=node,
        )
    message = refused(session, FailedPrecondition, lambda: submit_correction(session, "a", 0, None))
    assert "not every survivor has attested the survivor set yet (c missing)" in message
    reveal_all(fed, session, 0)
    np.testing.assert_array_equal(read_result(session, 0), data.total(fed.node_ids))


def test_the_same_seed_again_is_a_duplicate_and_another_seed_a_conflict(
    fed: Federation, session: Session
) -> None:
    all_uploaded_and_attested(fed, session, seed=33)
    first = submit_correction(session, "a", 0, None)
    assert isinstance(first, UnmaskReceipt) and not first.duplicate
    assert first.received_count == 1 and first.digest == b""
    before = session.store.dump()
    again = submit_correction(session, "a", 0, None)
    assert isinstance(again, UnmaskReceipt) and again.duplicate
    assert session.store.dump() == before
    message = refused(
        session,
        FailedPrecondition,
        lambda: submit_correction(session, "a", 0, None, seed=node_seed("a", 9)),
    )
    assert message.startswith("conflicting unmask answer: node 'a' already answered round 0")


def test_a_conflicting_correction_is_refused(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=15)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    session.tick(clock.advance(60_000))
    unmask_round(fed, session, 0, ["a", "b"])
    right = data.correction("a", ["c"])
    submit_correction(session, "a", 0, right)
    again = submit_correction(session, "a", 0, right)
    assert isinstance(again, UnmaskReceipt) and again.duplicate
    wrong = right.copy()
    wrong[3] ^= np.uint64(8)
    assert "conflicting unmask answer" in refused(
        session, FailedPrecondition, lambda: submit_correction(session, "a", 0, wrong)
    )


def test_a_refusal_to_unmask_ends_the_session_with_the_nodes_reason(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=16)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    session.tick(clock.advance(60_000))
    request = session.unmask_request(session.session_id, 0, caller="b")
    refusal = UnmaskRefusal(
        session.session_id,
        0,
        "b",
        request.dropped,
        request.survivor_hash,
        "noise left on my round-0 egress would fall to σ = 0.12, below my floor of 0.35",
    )
    receipt = session.refuse_unmask(refusal, caller="b")
    assert not receipt.accepted
    assert session.state() == SessionState.ABORTED
    assert session.reason() == (
        "node 'b' refused to unmask round 0 ('moments'): noise left on my round-0 egress "
        "would fall to σ = 0.12, below my floor of 0.35"
    )
    assert session.store.refusals(0, 1)[0].node_id == "b"


def test_a_refusal_naming_a_survivor_reruns_the_round_without_it(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=19)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    attest_all(fed, session, 0)
    request = session.unmask_request(session.session_id, 0, caller="a")
    because = "survivor 'c' is at fault: the tags of 'c' for 'a' in round 0 do not open"

    def naming(accused: str, by: str = "a") -> UnmaskRefusal:
        return UnmaskRefusal(
            session.session_id,
            0,
            by,
            request.dropped,
            request.survivor_hash,
            because,
            accused=accused,
        )

    before = session.store.dump()
    for accused in ("a", "x"):
        message = refused(
            session, InvalidArgument, lambda a=accused: session.refuse_unmask(naming(a), caller="a")
        )
        assert "which is not another survivor of the request" in message
    assert session.store.dump() == before
    receipt = session.refuse_unmask(naming("c"), caller="a")
    assert not receipt.accepted
    assert session.state() == SessionState.RUNNING
    status = session.status()
    assert status.rounds[0].state == RoundState.SUPERSEDED
    assert status.rounds[0].dropped == ("c",)
    assert "survivor 'c' was named by 'a' in round 0 ('moments')" in status.rounds[0].reason
    assert because in status.rounds[0].reason
    assert status.current_round_index == 1
    # The rerun among the others: their masks cancel without c, and the sum is exact.
    rerun = zero_sum(("a", "b"), N_WORDS, seed=20)
    run_round(fed, session, 1, rerun.payloads)
    np.testing.assert_array_equal(read_result(session, 1), rerun.total(("a", "b")))


def test_a_refusal_naming_a_survivor_fails_the_round_below_min_nodes(state_path: Path) -> None:
    fed = make_federation(("a", "b", "c"), min_nodes=3)
    session = Session(Store(state_path), fed.config)
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=21)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    attest_all(fed, session, 0)
    request = session.unmask_request(session.session_id, 0, caller="b")
    refusal = UnmaskRefusal(
        session.session_id, 0, "b", (), request.survivor_hash, "c sealed garbage", accused="c"
    )
    session.refuse_unmask(refusal, caller="b")
    assert session.state() == SessionState.ABORTED
    assert "survivor 'c' was named by 'b'" in session.reason()
    assert "the federation requires at least 3" in session.reason()


def test_cape_dropout_in_a_model_round_reruns_the_cape_sum_among_survivors(
    clock: FakeClock, state_path: Path
) -> None:
    fed = make_federation(("a", "b", "c"), construction="cape")
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    assert session.status().current_round_name == "cape-sum/moments"
    blind = zero_sum(fed.node_ids, N_WORDS, seed=17)
    run_round(fed, session, 0, blind.payloads)
    np.testing.assert_array_equal(read_result(session, 0), blind.total(fed.node_ids))
    model = zero_sum(fed.node_ids, N_WORDS, seed=18)
    upload(session, "a", 1, model.payloads["a"])
    upload(session, "b", 1, model.payloads["b"])
    session.tick(clock.advance(60_000))
    status = session.status()
    assert [(r.name, r.state) for r in status.rounds] == [
        ("cape-sum/moments", RoundState.READY),
        ("moments", RoundState.SUPERSEDED),
        ("cape-sum/moments", RoundState.OPEN),
    ]
    assert "rerun among the 2 survivors from round 2" in status.rounds[1].reason
    assert session.store.round(2).participants == ("a", "b")  # type: ignore[union-attr]
    for round_index in (2, 3, 4, 5):
        data = zero_sum(["a", "b"], N_WORDS, seed=20 + round_index)
        run_round(fed, session, round_index, data.payloads)
        np.testing.assert_array_equal(read_result(session, round_index), data.total(["a", "b"]))
    assert [r.name for r in session.status().rounds][3:] == [
        "moments",
        "cape-sum/scatter",
        "scatter",
    ]
    assert session.state() == SessionState.COMPLETED


# ---------------------------------------------------------------- restart


def test_restart_keeps_the_session_uploads_and_results_and_drops_streams_in_flight(
    fed: Federation, state_path: Path, clock: FakeClock
) -> None:
    store = Store(state_path)
    session = Session(store, fed.config, clock=clock)
    session_id = session.session_id
    join_all(fed, session)
    first = zero_sum(fed.node_ids, N_WORDS, seed=30)
    run_round(fed, session, 0, first.payloads)
    result_bytes = session.result(session_id, 0, caller="a").path.read_bytes()  # type: ignore[union-attr]
    statements = session.result(session_id, 0, caller="a").statements
    second = zero_sum(fed.node_ids, N_WORDS, seed=31)
    upload(session, "a", 1, second.payloads["a"])
    header = signed_header(session, "b", 1, "scatter", spec_for(second.payloads["b"]))
    ticket = session.begin_upload(header, caller="b")
    assert isinstance(ticket, Ticket)
    session.receive(ticket, 0, second.payloads["b"].astype("<u8").tobytes()[:77])
    # The process dies here: nothing is cleaned up; the OS releases the state file.
    store.close()
    restarted = Session(Store(state_path), fed.config, clock=clock)
    assert restarted.resumed and restarted.session_id == session_id
    assert not list(restarted.store.payload_dir.glob(".part-*"))
    view = restarted.result(session_id, 0, caller="c")
    assert view.path is not None and view.path.read_bytes() == result_bytes
    assert view.statements == statements and len(statements) == 3
    assert upload(restarted, "a", 1, second.payloads["a"]).duplicate
    upload(restarted, "b", 1, second.payloads["b"])
    upload(restarted, "c", 1, second.payloads["c"])
    reveal_all(fed, restarted, 1)
    np.testing.assert_array_equal(read_result(restarted, 1), second.total(fed.node_ids))


def test_restart_during_unmask_rebuilds_the_sum_from_the_stored_uploads(
    fed: Federation, state_path: Path, clock: FakeClock
) -> None:
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=32)
    upload(session, "a", 0, data.payloads["a"])
    upload(session, "b", 0, data.payloads["b"])
    session.tick(clock.advance(60_000))
    dropped = unmask_round(fed, session, 0, ["a", "b"])
    submit_correction(session, "a", 0, data.correction("a", dropped))
    session.store.close()  # the process dies
    restarted = Session(Store(state_path), fed.config, clock=clock)
    submit_correction(restarted, "b", 0, data.correction("b", dropped))
    np.testing.assert_array_equal(read_result(restarted, 0), data.total(["a", "b"]))


def test_restart_between_revealed_seeds_still_removes_every_self_mask(
    fed: Federation, state_path: Path, clock: FakeClock
) -> None:
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=34)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    attest_all(fed, session, 0)
    submit_correction(session, "a", 0, None)
    session.store.close()  # the process dies
    restarted = Session(Store(state_path), fed.config, clock=clock)
    assert restarted.store.round(0).status == RoundState.AWAITING_UNMASK  # type: ignore[union-attr]
    assert submit_correction(restarted, "a", 0, None).duplicate  # type: ignore[attr-defined]
    submit_correction(restarted, "b", 0, None)
    submit_correction(restarted, "c", 0, None)
    np.testing.assert_array_equal(read_result(restarted, 0), data.total(fed.node_ids))


def test_restart_gives_the_nodes_a_full_period_again(
    fed: Federation, state_path: Path, clock: FakeClock
) -> None:
    session = Session(Store(state_path), fed.config, clock=clock)
    join_all(fed, session)
    clock.advance(50_000)
    session.store.close()  # the process dies
    restarted = Session(Store(state_path), fed.config, clock=clock)
    assert restarted.store.round(0).deadline_ms == clock.now + 60_000  # type: ignore[union-attr]
    restarted.tick(clock.advance(59_000))
    assert restarted.state() == SessionState.RUNNING
    assert restarted.store.round(0).status == RoundState.OPEN  # type: ignore[union-attr]


def test_a_state_file_of_another_federation_config_is_refused(
    fed: Federation, state_path: Path, clock: FakeClock
) -> None:
    Session(Store(state_path), fed.config, clock=clock).store.close()
    other = make_federation(("a", "b", "c"))
    changed = type(other.config)(
        federation_id="testfed",
        config_hash=hashlib.sha256(b"changed").digest(),
        identity_keys=other.config.identity_keys,
        min_nodes=2,
        join_timeout_ms=1000,
        round_timeout_ms=1000,
        rounds=other.config.rounds,
        fixed_point_bits=32,
    )
    with pytest.raises(StateFileError, match="start with a new --state path"):
        Session(Store(state_path), changed, clock=clock)


def test_everyone_informed_after_the_final_result_is_delivered(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    for round_index in (0, 1):
        data = zero_sum(fed.node_ids, N_WORDS, seed=40 + round_index)
        run_round(fed, session, round_index, data.payloads)
    assert session.ended() and not session.everyone_informed()
    for node in fed.node_ids:
        session.record_delivery(1, node)
    assert session.everyone_informed()


def test_a_join_after_the_deadline_is_refused_even_before_the_deadline_is_applied(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session, ["a", "b"])
    clock.advance(60_000)
    late = fed.bundle("c", session.session_id)
    message = refused(session, PermissionDenied, lambda: session.join(late, caller="c"))
    assert "join deadline" in message and "passed" in message


def test_an_upload_after_the_deadline_is_refused_even_before_the_deadline_is_applied(
    fed: Federation, session: Session, clock: FakeClock
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=50)
    clock.advance(60_000)
    message = refused(
        session, FailedPrecondition, lambda: upload(session, "a", 0, data.payloads["a"])
    )
    assert "stopped accepting uploads at its deadline" in message


def test_a_second_coordinator_on_the_same_state_file_is_refused(
    session: Session, state_path: Path
) -> None:
    with pytest.raises(StateFileError, match="in use by another coordinator process"):
        Store(state_path)


def test_the_last_answer_sent_again_after_the_round_is_ready_is_a_duplicate(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(("a", "b", "c"), N_WORDS, seed=77)
    for node in ("a", "b", "c"):
        upload(session, node, 0, data.payloads[node])
    reveal_all(fed, session, 0, data)
    assert session.store.round(0).status == RoundState.READY  # type: ignore[union-attr]
    before = session.store.dump()
    receipt = submit_correction(session, "c", 0, None)
    assert isinstance(receipt, UnmaskReceipt) and receipt.duplicate
    assert session.store.dump() == before


def test_the_same_upload_with_another_commitment_is_a_conflict(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(("a", "b", "c"), N_WORDS, seed=78)
    upload(session, "a", 0, data.payloads["a"])
    stored = session.store.upload(0, "a")
    assert stored is not None
    sent = np.frombuffer(session.store.payload_path(stored.path).read_bytes(), dtype="<u8")
    header = signed_header(session, "a", 0, "moments", spec_for(sent.astype(np.uint64)))
    header = replace(header, self_mask_commitment=bytes(32))
    before = session.store.dump()
    message = refused(session, FailedPrecondition, lambda: session.begin_upload(header, caller="a"))
    assert "self-mask commitment" in message
    assert session.store.dump() == before


@pytest.mark.parametrize(
    "change",
    [
        "none",
        "missing one",
        "one too many",
        "short",
        "one copy resigned",
        "with a path",
        "resigned by another",
        "bit flipped",
    ],
)
def test_an_attestation_without_signed_sealed_tags_for_every_other_survivor_is_refused(
    fed: Federation, session: Session, change: str
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=81)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    request = session.store.unmask_request(0, 1)
    assert request is not None
    honest = fed.attestation(
        "a", session.session_id, 0, request.survivor_hash, survivors=request.survivors
    )
    first, *rest = honest.tags
    tree = sealed_tree({t.recipient: t.sealed for t in honest.tags})
    signed_by_a = sealed_set_message(
        CONFIG_HASH,
        session.session_id,
        0,
        kind="tags",
        binding=request.survivor_hash,
        sender="a",
        count=tree.count,
        root=tree.root,
    )
    tags = {
        "none": (),
        "missing one": tuple(rest),
        "one too many": (*honest.tags, dataclasses.replace(first, recipient="a")),
        "short": (dataclasses.replace(first, sealed=first.sealed[:-1]), *rest),
        "one copy resigned": (dataclasses.replace(first, signature=bytes(64)), *rest),
        "with a path": (dataclasses.replace(first, count=9, path=(bytes(32),)), *rest),
        "resigned by another": tuple(
            dataclasses.replace(t, signature=fed.identities["b"].sign(signed_by_a))
            for t in honest.tags
        ),
        "bit flipped": (
            dataclasses.replace(first, sealed=bytes([first.sealed[0] ^ 1]) + first.sealed[1:]),
            *rest,
        ),
    }[change]
    before = session.store.dump()
    error = (
        InvalidArgument
        if change
        in {"none", "missing one", "one too many", "short", "one copy resigned", "with a path"}
        else (Unauthenticated)
    )
    message = refused(
        session,
        error,
        lambda: session.attest(dataclasses.replace(honest, tags=tags), caller="a"),
    )
    assert "attestation of node 'a' for round 0" in message
    assert session.store.dump() == before


def test_each_survivor_is_relayed_the_others_sealed_contributions_and_the_tags_come_back(
    fed: Federation, session: Session
) -> None:
    join_all(fed, session)
    data = zero_sum(fed.node_ids, N_WORDS, seed=82)
    for node in fed.node_ids:
        upload(session, node, 0, data.payloads[node])
    for node in fed.node_ids:
        ask = session.unmask_request(session.session_id, 0, caller=node)
        expected = {
            (c.sender, c.recipient, c.sealed)
            for other in fed.node_ids
            if other != node
            for c in sealed_challenge(session, other, 0)
            if c.recipient == node
        }
        assert {(c.sender, c.recipient, c.sealed) for c in ask.challenge} == expected
        assert len(ask.challenge) == len(fed.node_ids) - 1
    reveal_all(fed, session, 0, data)
    view = session.result(session.session_id, 0, caller="a")
    request = session.store.unmask_request(0, 1)
    assert request is not None
    # Each survivor gets the tags every other survivor sealed for it, and only those,
    # each with its place and audit path in its sender's tree: from them the root
    # the sender signed.
    sent = {
        n: fed.sealed_tags(
            n, sorted(set(fed.node_ids) - {n}), session.session_id, 0, request.survivor_hash
        )
        for n in sorted(fed.node_ids)
        if n != "a"
    }
    assert [(t.sender, t.recipient, t.sealed, t.signature) for t in view.tags] == [
        (n, "a", c.sealed, c.signature)
        for n, copies in sent.items()
        for c in copies
        if c.recipient == "a"
    ]
    for t in view.tags:
        tree = sealed_tree({c.recipient: c.sealed for c in sent[t.sender]})
        assert (t.count, t.signed_root()) == (len(fed.node_ids) - 1, tree.root)
