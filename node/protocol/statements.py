"""Signed upload statements: what each node saw and sent, checked by every node.

A node verifies every bundle of the roster it is shown, but on its own it
cannot tell whether the other nodes were shown the same roster. A coordinator
showing different nodes different keys would make the pairwise masks fail to
cancel, and the aggregate would be silently wrong. So every upload carries a
*statement*: the node's Ed25519 identity signature over

    noise.transcript.upload_statement_message(config hash, session id,
        round index, round name, roster hash, payload digest)

binding the roster it verified to the exact payload it sent. The coordinator
hands back the statements of every upload it summed with the aggregate, and
each node checks them (:func:`check_statements`): every signature against the
pinned identity key, every roster hash against its own, the signers against
the survivors the aggregate claims to count, its own statement against the
payload it uploaded, and the nodes left out against those whose pair terms
it revealed in the round's unmask answers. Any mismatch ends the session for
that node with the reason. This is the roster counterpart of the
survivor-set consistency check of Bonawitz et al. 2017 (ACM CCS, "Practical
Secure Aggregation for Privacy-Preserving Machine Learning", round
ConsistencyCheck): an equivocating coordinator is caught by the nodes it
lied to, and the published result names exactly which signed payloads it
covers.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from node.errors import StatementError
from noise.keys import IdentityKey
from noise.transcript import upload_statement_message
from proto.messages import RoundResult, UploadStatement

__all__ = ["StatementError", "check_statements", "sign_upload_statement"]


def _short(digest: bytes) -> str:
    return digest.hex()[:16] + "…"


def _names(nodes: Collection[str]) -> str:
    return "{" + ", ".join(sorted(nodes)) + "}"


def sign_upload_statement(
    identity: IdentityKey,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    round_name: str,
    roster_hash: bytes,
    payload_digest: bytes,
) -> bytes:
    """This node's 64-byte signature over the statement for one upload."""
    return identity.sign(
        upload_statement_message(
            config_hash,
            session_id,
            round_index,
            round_name,
            roster_hash=roster_hash,
            payload_digest=payload_digest,
        )
    )


def _verifies(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def check_statements(  # noqa: C901, PLR0912 - the docstring's checks, one after the other, in its order
    header: RoundResult,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    roster_hash: bytes,
    identity_keys: Mapping[str, bytes],
    own_node_id: str,
    own_digest: bytes | None,
    participants: Collection[str],
    round_name: str | None = None,
    revealed: Collection[str] | None = None,
) -> None:
    """Raise :class:`StatementError` unless the READY ``header``'s statements all check out.

    ``roster_hash`` is the hash of the roster this node verified;
    ``participants`` the nodes of the round; ``round_name`` the name this node
    uploaded under (default: the header's). ``own_digest`` is the digest of
    the payload this node uploaded, or None when it is not known here (a round
    sent before a restart): its own statement must then still be present and
    carry its own valid signature, which only this node can make.
    ``revealed`` is every node whose pair terms (or CAPE pads) this node
    sent in the round's unmask answers (``node.protocol.unmask.RevealedTerms``), or
    None when not known (then the left-out participants are not checked).

    The aggregate must leave out exactly the nodes in ``revealed``. Counting
    one of them means the coordinator holds that node's upload *and* every
    survivor's pair terms (or pads) with it, i.e. its masking noise stripped: it
    reported a dropout that did not happen (the attack unmasking must not
    allow; Bonawitz et al. 2017, §4). Leaving out a node whose terms were
    never revealed here means this node's mask terms with it are still in
    the sum, so the aggregate is not the survivors' sum.

    Checked, in order: for each statement, that it is the only one of its
    signer, the signer is a participant, the round name is this round's, the
    signature verifies against the signer's pinned identity key, and the
    roster hash is this node's; then that this node's own statement is
    present and names its payload; that the signers are exactly the
    survivors the aggregate counts; finally (``revealed`` given) that the
    participants it leaves out are exactly ``revealed``.
    """
    name = header.round_name if round_name is None else round_name
    where = f"round {round_index} ({name!r})"
    members = set(participants)
    signers: dict[str, UploadStatement] = {}
    for statement in header.statements:
        who = statement.node_id
        if who in signers:
            raise StatementError(f"the aggregate of {where} carries two statements of node {who!r}")
        signers[who] = statement
        if who not in members:
            raise StatementError(
                f"node {who!r} signed a statement in the aggregate of {where} but is not one of "
                f"its participants {_names(members)}"
            )
        if statement.round_name != name:
            raise StatementError(
                f"node {who!r} signed its upload for round {statement.round_name!r}, but the "
                f"aggregate is that of {where}"
            )
        pinned = identity_keys.get(who)
        try:
            message = upload_statement_message(
                config_hash,
                session_id,
                round_index,
                statement.round_name,
                roster_hash=statement.roster_hash,
                payload_digest=statement.payload_digest,
            )
        except ValueError as error:
            raise StatementError(
                f"the upload statement of node {who!r} in the aggregate of {where} is "
                f"malformed: {error}"
            ) from None
        if pinned is None or not _verifies(pinned, statement.signature, message):
            raise StatementError(
                f"the upload statement of node {who!r} in the aggregate of {where} does not "
                "verify against its pinned identity key"
            )
        if statement.roster_hash != roster_hash:
            raise StatementError(
                f"node {who!r} was shown roster {_short(statement.roster_hash)} but I was "
                f"shown {_short(roster_hash)} ({where}); the coordinator showed the nodes "
                "different rosters, so the masks do not cancel"
            )
    mine = signers.get(own_node_id)
    if mine is None:
        raise StatementError(
            f"the aggregate of {where} carries no statement of my own upload; it does not "
            "count what I sent"
        )
    if own_digest is not None and mine.payload_digest != own_digest:
        raise StatementError(
            f"the aggregate of {where} counts a payload of mine with digest "
            f"{_short(mine.payload_digest)}, but I uploaded {_short(own_digest)}"
        )
    survivors = set(header.survivors)
    if set(signers) != survivors:
        raise StatementError(
            f"the aggregate of {where} counts {_names(survivors)} but carries statements "
            f"of {_names(signers)}"
        )
    if revealed is None:
        return
    unmasked = set(revealed)
    stripped = survivors & unmasked
    if stripped:
        raise StatementError(
            f"the aggregate of {where} counts {_names(stripped)}, whose pair terms with me I "
            "revealed because the coordinator reported them dropped; it holds their uploads and "
            "those terms, so their masking noise is stripped: the dropout was not real"
        )
    unanswered = members - survivors - unmasked
    if unanswered:
        raise StatementError(
            f"the aggregate of {where} leaves out {_names(unanswered)}, but I revealed no pair "
            "terms with them, so my mask terms with them cannot have cancelled; it is not the "
            "sum over the nodes it names"
        )
