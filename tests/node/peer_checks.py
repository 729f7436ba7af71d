"""What the other survivors of a node test send for the aggregate check, made as they make it.

Node tests drive one node against hand-built requests and results; the other
survivors exist only as keys (``tests.support.made_up_federation._identities`` and
``_seeds``). These helpers seal and sign, as each of them would, its challenge
contribution and its blinded tags for the node under test
(``noise.aggregate_check``, ``noise.transcript.sealed_set_message``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from noise.aggregate_check import (
    CHALLENGE_VECTORS,
    challenge_contribution,
    seal_contribution,
    seal_tags,
)
from noise.keys import EphemeralKey, IdentityKey
from proto.messages import Sealed
from tests.support.sealed_sets import signed_set

__all__ = [
    "peer_contributions",
    "peer_ephemeral_keys",
    "sealed_contributions",
    "sealed_tags",
    "signed_sealed",
]


def peer_ephemeral_keys(ids: Sequence[str]) -> dict[str, EphemeralKey]:
    """The session keys of ``tests.support.made_up_federation._seeds``."""
    return {n: EphemeralKey.from_private_bytes(bytes([40 + i]) * 32) for i, n in enumerate(ids)}


def peer_contributions(
    ids: Sequence[str], *, config_hash: bytes, session_id: str, round_index: int
) -> dict[str, bytes]:
    """Every node's challenge contribution c_k for ``round_index``."""
    return {
        node: challenge_contribution(
            key,
            config_hash=config_hash,
            session_id=session_id,
            node_id=node,
            round_index=round_index,
        )
        for node, key in peer_ephemeral_keys(ids).items()
    }


def signed_sealed(
    identity: IdentityKey,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    kind: str,
    binding: bytes,
    sender: str,
    recipient: str,
    sealed: bytes,
) -> Sealed:
    """``sealed`` under ``identity``'s signature, as relayed when its sender sealed for
    ``recipient`` alone (a tree of one leaf)."""
    (item,) = signed_set(
        identity,
        config_hash=config_hash,
        session_id=session_id,
        round_index=round_index,
        kind=kind,
        binding=binding,
        sender=sender,
        bodies={recipient: sealed},
        relayed=True,
    )
    return item


def sealed_contributions(
    me: str,
    ids: Sequence[str],
    senders: Sequence[str],
    *,
    identities: Mapping[str, IdentityKey],
    seeds: Mapping[str, Mapping[str, bytes]],
    config_hash: bytes,
    session_id: str,
    round_index: int,
) -> tuple[Sealed, ...]:
    """The contribution each of ``senders`` (but ``me``) sealed and signed for ``me``."""
    contributions = peer_contributions(
        ids, config_hash=config_hash, session_id=session_id, round_index=round_index
    )
    return tuple(
        signed_sealed(
            identities[peer],
            config_hash=config_hash,
            session_id=session_id,
            round_index=round_index,
            kind="contribution",
            binding=bytes(32),
            sender=peer,
            recipient=me,
            sealed=seal_contribution(
                contributions[peer],
                seeds[peer][me],
                config_hash=config_hash,
                session_id=session_id,
                round_index=round_index,
                sender=peer,
                recipient=me,
            ),
        )
        for peer in sorted(senders)
        if peer != me
    )


def sealed_tags(
    me: str,
    values: Mapping[str, Sequence[int]],
    *,
    identities: Mapping[str, IdentityKey],
    seeds: Mapping[str, Mapping[str, bytes]],
    config_hash: bytes,
    session_id: str,
    round_index: int,
    survivor_hash: bytes,
) -> tuple[Sealed, ...]:
    """Each sender's blinded tags ``values[sender]`` sealed and signed for ``me``."""
    return tuple(
        signed_sealed(
            identities[peer],
            config_hash=config_hash,
            session_id=session_id,
            round_index=round_index,
            kind="tags",
            binding=survivor_hash,
            sender=peer,
            recipient=me,
            sealed=seal_tags(
                tuple(values[peer]) or (0,) * CHALLENGE_VECTORS,
                seeds[peer][me],
                config_hash=config_hash,
                session_id=session_id,
                round_index=round_index,
                survivor_hash=survivor_hash,
                sender=peer,
                recipient=me,
            ),
        )
        for peer in sorted(values)
        if peer != me
    )
