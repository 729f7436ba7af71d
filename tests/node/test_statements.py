"""Upload statements: a node accepts an aggregate only if every contributor saw its roster."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from node.protocol.statements import StatementError, check_statements, sign_upload_statement
from noise.keys import IdentityKey
from noise.transcript import upload_statement_message
from proto.messages import RoundResult, RoundState, UploadStatement

IDS = ("a", "b", "c")
CONFIG_HASH = hashlib.sha256(b"statements test federation").digest()
SESSION = "0123456789abcdef0123456789abcdef"
ROUND = 2
NAME = "scatter"
ROSTER = hashlib.sha256(b"the roster everyone verified").digest()
IDENTITY = {n: IdentityKey.from_private_bytes(bytes([i + 40]) * 32) for i, n in enumerate(IDS)}
PINNED = {n: k.public_bytes() for n, k in IDENTITY.items()}
SHA = {n: hashlib.sha256(f"payload of {n}".encode()).digest() for n in IDS}


def statement(
    node: str,
    *,
    signer: str | None = None,
    roster: bytes = ROSTER,
    name: str = NAME,
    digest: bytes | None = None,
) -> UploadStatement:
    digest = SHA[node] if digest is None else digest
    signature = sign_upload_statement(
        IDENTITY[signer or node],
        config_hash=CONFIG_HASH,
        session_id=SESSION,
        round_index=ROUND,
        round_name=name,
        roster_hash=roster,
        payload_digest=digest,
    )
    return UploadStatement(
        node_id=node,
        round_name=name,
        roster_hash=roster,
        payload_digest=digest,
        signature=signature,
    )


def header(statements: list[UploadStatement], survivors: tuple[str, ...] = IDS) -> RoundResult:
    return RoundResult(
        round_index=ROUND,
        round_name=NAME,
        state=RoundState.READY,
        reason="",
        survivors=tuple(survivors),
        dropped=(),
        statements=tuple(statements),
    )


def checked(
    result: RoundResult,
    *,
    me: str = "a",
    own_digest: bytes | None,
    identity_keys: dict[str, bytes] = PINNED,
    **more: Any,
) -> None:
    """``check_statements`` as node ``me`` of this round; ``more``: its further options."""
    check_statements(
        result,
        config_hash=CONFIG_HASH,
        session_id=SESSION,
        round_index=ROUND,
        roster_hash=ROSTER,
        identity_keys=identity_keys,
        own_node_id=me,
        own_digest=own_digest,
        participants=IDS,
        **more,
    )


def check(result: RoundResult, *, me: str = "a", own: bytes | None = None) -> None:
    checked(result, me=me, own_digest=SHA[me] if own is None else own)


def honest() -> list[UploadStatement]:
    return [statement(n) for n in IDS]


def refused(result: RoundResult, *, me: str = "a", own: bytes | None = None) -> str:
    with pytest.raises(StatementError) as caught:
        check(result, me=me, own=own)
    return str(caught.value)


def test_the_signature_is_over_the_transcript_message() -> None:
    signed = statement("b")
    message = upload_statement_message(
        CONFIG_HASH, SESSION, ROUND, NAME, roster_hash=ROSTER, payload_digest=SHA["b"]
    )
    Ed25519PublicKey.from_public_bytes(PINNED["b"]).verify(signed.signature, message)


def test_honest_statements_pass_for_every_node() -> None:
    for me in IDS:
        check(header(honest()), me=me)


def test_a_survivor_subset_with_its_statements_passes() -> None:
    check(header([statement("a"), statement("c")], survivors=("a", "c")), me="c")


def test_own_digest_unknown_still_needs_my_own_valid_statement() -> None:
    checked(header(honest()), own_digest=None, round_name=NAME)
    forged = [statement("a", signer="b"), statement("b"), statement("c")]
    with pytest.raises(StatementError, match=r"node 'a' .* does not verify"):
        checked(header(forged), own_digest=None)


@pytest.mark.parametrize(
    ("index", "replaced", "expected"),
    [
        (
            1,
            {"node": "b", "signer": "c"},
            "the upload statement of node 'b' in the aggregate of round 2 ('scatter') does not "
            "verify against its pinned identity key",
        ),
        (
            2,
            {"node": "c", "name": "moments"},
            "node 'c' signed its upload for round 'moments', but the aggregate is that of "
            "round 2 ('scatter')",
        ),
    ],
    ids=["signed by another key", "for another round name"],
)
def test_a_statement_replaced_by_a_wrong_one_is_refused(
    index: int, replaced: dict[str, str], expected: str
) -> None:
    statements = honest()
    statements[index] = statement(**replaced)
    assert refused(header(statements)) == expected


def test_a_statement_altered_after_signing_is_refused() -> None:
    statements = honest()
    statements[2] = dataclasses.replace(statements[2], payload_digest=SHA["a"])
    assert "node 'c'" in refused(header(statements))
    assert "does not verify" in refused(header(statements))


def test_a_node_shown_another_roster_is_named_with_both_digests() -> None:
    other = hashlib.sha256(b"a roster with a substituted key").digest()
    statements = honest()
    statements[1] = statement("b", roster=other)
    message = refused(header(statements))
    assert message.startswith(
        f"node 'b' was shown roster {other.hex()[:16]}… but I was shown {ROSTER.hex()[:16]}…"
    )
    assert "masks do not cancel" in message


def test_signers_must_be_exactly_the_survivors_counted() -> None:
    missing = refused(header([statement("a"), statement("b")]))
    assert missing == (
        "the aggregate of round 2 ('scatter') counts {a, b, c} but carries statements of {a, b}"
    )
    extra = refused(header(honest(), survivors=("a", "b")))
    assert "counts {a, b} but carries statements of {a, b, c}" in extra


def test_my_own_statement_must_be_there() -> None:
    message = refused(header([statement("b"), statement("c")]))
    assert message.startswith("the aggregate of round 2 ('scatter') carries no statement of my own")


def test_my_own_statement_must_name_the_payload_i_sent() -> None:
    sent = hashlib.sha256(b"what a really uploaded").digest()
    message = refused(header(honest()), own=sent)
    assert message == (
        f"the aggregate of round 2 ('scatter') counts a payload of mine with digest "
        f"{SHA['a'].hex()[:16]}…, but I uploaded {sent.hex()[:16]}…"
    )


def test_a_signer_outside_the_round_is_refused() -> None:
    stranger = IdentityKey.generate()
    pinned = {**PINNED, "z": stranger.public_bytes()}
    extra = UploadStatement(
        node_id="z",
        round_name=NAME,
        roster_hash=ROSTER,
        payload_digest=SHA["a"],
        signature=stranger.sign(
            upload_statement_message(
                CONFIG_HASH, SESSION, ROUND, NAME, roster_hash=ROSTER, payload_digest=SHA["a"]
            )
        ),
    )
    with pytest.raises(StatementError, match=r"node 'z' signed a statement .* not one of its"):
        checked(
            header([*honest(), extra], survivors=(*IDS, "z")),
            own_digest=SHA["a"],
            identity_keys=pinned,
        )


def test_a_node_with_two_statements_is_refused() -> None:
    message = refused(header([*honest(), statement("b")]))
    assert "carries two statements of node 'b'" in message


def test_a_malformed_statement_is_refused() -> None:
    statements = honest()
    statements[1] = dataclasses.replace(statements[1], roster_hash=ROSTER[:31])
    assert "node 'b'" in refused(header(statements))
    assert "malformed: roster hash must be 32 bytes" in refused(header(statements))
