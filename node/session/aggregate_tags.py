"""This node's part in checking a round's aggregate: its challenge, its tags, the check.

The coordinator could publish a forged sum together with the genuine upload
statements (which prove what was counted, not that the sum is theirs). Each
round therefore carries a secret linear check (``noise.aggregate_check``):

1. with its upload, the node seals its challenge contribution c_k (derived
   from the session key, so a restart gives the same one) for every other
   participant under their pairwise key, and signs the Merkle tree of all
   the sealed copies once;
2. with its attestation of the survivor set it opens the contributions of
   every other survivor, forms κ and the challenge vectors ρ, computes its
   tags ⟨ρ, v_k⟩ of its contribution to the aggregate (its egress less the
   pair terms it will reveal; in a CAPE-sum round its draw q(ê_k)), blinds
   them by pads that cancel over the survivors, and seals them for every
   other survivor under one signature; κ and its own blinded tags are kept in
   ``STATE/survivor-sets.json`` first;
3. before revealing its self-mask seed it opens the tags every other survivor
   sealed for it (:func:`open_relayed_tags`), and once the aggregate A is
   published checks Σ blinded ≡ ⟨ρ, A⟩ (mod 2^128) for each of the four
   vectors (:func:`check_aggregate`): a forged A passes with probability at
   most 2^-64 (docs/design.md §4.5).

The coordinator sees neither κ, ρ, a tag nor their sum. Every sealed message
is covered by its sender's one signature over the Merkle tree of all it
sealed in the call, which the coordinator checks on receipt; it relays each
copy with its audit path in that tree. A copy that opens under the pairwise key is
its sender's whatever the signature says; one that does not open but
verifies is its sender's doing: a :class:`Culprit` names that survivor, and
the node refuses the unmask step with the accusation (the coordinator reruns
the round without it). A signature that does not verify is the relay's
doing. A node that colludes with
the coordinator learns ρ, so the check protects against a coordinator acting
alone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from numpy.typing import NDArray

from node.errors import SessionFailed
from node.session.context import SessionContext
from noise.aggregate_check import (
    CHALLENGE_VECTORS,
    blinded_tags,
    challenge_contribution,
    challenge_key,
    challenge_vectors,
    check_tags,
    open_contribution,
    open_tags,
    seal_contribution,
    seal_tags,
    tags,
)
from noise.layout import Layout
from noise.transcript import sealed_set_message, sealed_tree
from proto.messages import RoundResult, Sealed, UnmaskRequest

T = TypeVar("T")

__all__ = [
    "Culprit",
    "Tagged",
    "attest_tags",
    "check_aggregate",
    "open_relayed_tags",
    "sealed_challenge",
]

U64 = NDArray[np.uint64]

_NO_BINDING = bytes(32)
# Verdicts a node keeps (a round needs two per other survivor).
_VERDICTS_KEPT = 4096


@dataclass(frozen=True)
class Culprit:
    """A survivor whose signed sealed message for this node does not open: its sentence."""

    node_id: str
    reason: str


@dataclass(frozen=True)
class Tagged:
    """κ, ρ and this node's blinded tags for one survivor set, with their sealed copies."""

    key: bytes
    rho: U64
    own: tuple[int, ...]
    sealed: list[Sealed]


def _own(ctx: SessionContext, index: int) -> bytes:
    return challenge_contribution(
        ctx.ephemeral,
        config_hash=ctx.config_hash,
        session_id=ctx.session_id,
        node_id=ctx.node_id,
        round_index=index,
    )


def _message(
    ctx: SessionContext,
    index: int,
    *,
    kind: str,
    binding: bytes,
    sender: str,
    count: int,
    root: bytes,
) -> bytes:
    return sealed_set_message(
        ctx.config_hash,
        ctx.session_id,
        index,
        kind=kind,
        binding=binding,
        sender=sender,
        count=count,
        root=root,
    )


def _signed_by_sender(
    ctx: SessionContext, index: int, kind: str, binding: bytes, item: Sealed
) -> bool:
    """Whether ``item`` (by its place and audit path) carries its sender's signature."""
    key = ctx.config.identity_keys.get(item.sender)
    if key is None or item.recipient != ctx.node_id:
        return False
    try:
        message = _message(
            ctx,
            index,
            kind=kind,
            binding=binding,
            sender=item.sender,
            count=item.count,
            root=item.signed_root(),
        )
    except ValueError:  # an empty copy, or a place or path that is no proof
        return False
    known = ctx.signed_by_sender.get((item.sender, item.signature, message))
    if known is not None:
        return known
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(item.signature, message)
    except (InvalidSignature, ValueError):
        verdict = False
    else:
        verdict = True
    if len(ctx.signed_by_sender) >= _VERDICTS_KEPT:
        ctx.signed_by_sender.clear()
    ctx.signed_by_sender[(item.sender, item.signature, message)] = verdict
    return verdict


def _signed_set(
    ctx: SessionContext, index: int, *, kind: str, binding: bytes, bodies: dict[str, bytes]
) -> list[Sealed]:
    """``bodies`` (recipient -> sealed copy) under this node's one signature over their tree."""
    tree = sealed_tree(bodies)
    signature = ctx.identity.sign(
        _message(
            ctx,
            index,
            kind=kind,
            binding=binding,
            sender=ctx.node_id,
            count=tree.count,
            root=tree.root,
        )
    )
    return [Sealed(ctx.node_id, peer, body, signature) for peer, body in bodies.items()]


def sealed_challenge(
    ctx: SessionContext, index: int, participants: Collection[str]
) -> list[Sealed]:
    """This node's contribution sealed for every other participant, signed once."""
    mine = _own(ctx, index)
    bodies = {
        peer: seal_contribution(
            mine,
            ctx.seeds[peer],
            config_hash=ctx.config_hash,
            session_id=ctx.session_id,
            round_index=index,
            sender=ctx.node_id,
            recipient=peer,
        )
        for peer in sorted(set(participants) - {ctx.node_id})
    }
    return _signed_set(ctx, index, kind="contribution", binding=_NO_BINDING, bodies=bodies)


def _relayed(items: Sequence[Sealed], recipient: str) -> dict[str, Sealed]:
    return {item.sender: item for item in items if item.recipient == recipient}


def attest_tags(
    ctx: SessionContext, request: UnmaskRequest, index: int, contribution: U64, layout: Layout
) -> Tagged | Culprit | str:
    """This node's tags for ``request``'s survivor set, sealed for the other survivors.

    A :class:`Culprit` when a survivor's signed contribution does not open, a
    reason to refuse when the relay is at fault (a contribution missing or
    its signature broken).
    """
    survivors = set(request.survivors)
    opened = _open_relayed(
        ctx,
        request.challenge,
        index=index,
        peers=survivors,
        kind="contribution",
        binding=_NO_BINDING,
        opener=lambda sealed, peer: open_contribution(
            sealed,
            ctx.seeds[peer],
            config_hash=ctx.config_hash,
            session_id=ctx.session_id,
            round_index=index,
            sender=peer,
            recipient=ctx.node_id,
        ),
        missing=lambda peer: (
            f"the request does not relay the challenge contribution of survivor {peer!r}, "
            "so this node cannot check the round's aggregate"
        ),
        unsigned=lambda peer: (
            f"the challenge contribution of {peer!r} relayed to this node does not carry "
            f"{peer!r}'s valid signature: the coordinator, which checks it on receipt, "
            "relayed something else"
        ),
    )
    if isinstance(opened, Culprit | str):
        return opened
    contributions = {ctx.node_id: _own(ctx, index), **opened}
    key = challenge_key(contributions, round_index=index)
    rho = challenge_vectors(key, layout.size, round_index=index)
    own = blinded_tags(
        tags(contribution, rho), ctx.node_id, survivors, ctx.seeds, round_index=index
    )
    bodies = {
        peer: seal_tags(
            own,
            ctx.seeds[peer],
            config_hash=ctx.config_hash,
            session_id=ctx.session_id,
            round_index=index,
            survivor_hash=request.survivor_hash,
            sender=ctx.node_id,
            recipient=peer,
        )
        for peer in sorted(survivors - {ctx.node_id})
    }
    sealed = _signed_set(ctx, index, kind="tags", binding=request.survivor_hash, bodies=bodies)
    return Tagged(key, rho, own, sealed)


def open_relayed_tags(
    ctx: SessionContext,
    items: Sequence[Sealed],
    *,
    index: int,
    survivors: Collection[str],
    survivor_hash: bytes,
) -> dict[str, tuple[int, ...]] | Culprit | str:
    """The blinded tags every other survivor sealed for this node, opened.

    A :class:`Culprit` when a survivor's signed tags do not open, a reason
    (the relay's fault) when some are missing or carry no valid signature.
    """
    return _open_relayed(
        ctx,
        items,
        index=index,
        peers=survivors,
        kind="tags",
        binding=survivor_hash,
        opener=lambda sealed, peer: open_tags(
            sealed,
            ctx.seeds[peer],
            config_hash=ctx.config_hash,
            session_id=ctx.session_id,
            round_index=index,
            survivor_hash=survivor_hash,
            sender=peer,
            recipient=ctx.node_id,
        ),
        missing=lambda peer: (
            f"the aggregate-check tags of survivor {peer!r} are not relayed to this node, "
            "so it cannot check the round's aggregate"
        ),
        unsigned=lambda peer: (
            f"the aggregate-check tags of {peer!r} relayed to this node do not carry "
            f"{peer!r}'s valid signature over this survivor set: the coordinator, which "
            "checks it on receipt, relayed something else"
        ),
    )


def _open_relayed(
    ctx: SessionContext,
    items: Sequence[Sealed],
    *,
    index: int,
    peers: Collection[str],
    kind: str,
    binding: bytes,
    opener: Callable[[bytes, str], T],
    missing: Callable[[str], str],
    unsigned: Callable[[str], str],
) -> dict[str, T] | Culprit | str:
    """What every other peer sealed for this node and signed, opened with ``opener``.

    An item that opens is its sender's whatever its signature says: its
    AES-GCM tag is under the key only the sender and this node hold, and
    binds the sender, this node, the round and (for tags) the survivor set,
    so nothing the relay made or moved opens. Its signature is verified only
    when it does not open, to say whose fault that is: a reason to refuse
    (the relay's) when it does not hold, a :class:`Culprit` when it does (its
    author signed those bytes, so they are its own). A missing item is the
    relay's fault too.
    """
    relayed = _relayed(items, ctx.node_id)
    opened: dict[str, T] = {}
    for peer in sorted(set(peers) - {ctx.node_id}):
        item = relayed.get(peer)
        if item is None:
            return missing(peer)
        try:
            opened[peer] = opener(item.sealed, peer)
        except ValueError as error:
            # Only now does the signature matter: it says whose fault it is.
            if not _signed_by_sender(ctx, index, kind, binding, item):
                return unsigned(peer)
            return Culprit(
                peer,
                f"{error}; {peer!r} signed these bytes (signature "
                f"{item.signature.hex()[:16]}…), so they are its own",
            )
    return opened


def check_aggregate(
    ctx: SessionContext,
    result: RoundResult,
    index: int,
    layout: Layout,
    *,
    key: bytes | None,
    own: tuple[int, ...] | None,
    survivor_hash: bytes,
    rho: U64 | None = None,
) -> None:
    """Refuse (SessionFailed) an aggregate the survivors' tags do not vouch for.

    ``own``: this node's blinded tags for the survivor set it signed;
    ``rho``: the challenge vectors of ``key`` when already expanded. The
    sentence says who is at fault as far as this node can tell.
    """
    what = f"the aggregate of round {index} ({result.round_name!r})"
    if key is None or own is None:
        raise SessionFailed(
            f"{what} is published, but this node holds no challenge key for it, so it cannot "
            "check it; refusing to use an unchecked aggregate"
        )
    assert result.aggregate is not None
    opened = open_relayed_tags(
        ctx, result.tags, index=index, survivors=result.survivors, survivor_hash=survivor_hash
    )
    if isinstance(opened, Culprit):
        raise SessionFailed(
            f"{what} cannot be checked: member {opened.node_id!r} is at fault: {opened.reason}"
        )
    if isinstance(opened, str):
        raise SessionFailed(f"{what} cannot be checked (the coordinator is at fault): {opened}")
    opened[ctx.node_id] = own
    if rho is None:
        rho = challenge_vectors(key, layout.size, round_index=index)
    failed = check_tags(opened, result.aggregate, rho)
    if failed:
        raise SessionFailed(
            f"{what} fails {len(failed)} of {CHALLENGE_VECTORS} secret checks: it is not the sum "
            "of the survivors' contributions. Every survivor's tags reached this node sealed "
            "and signed by their author, and the coordinator never saw ρ or any tag, so the "
            "coordinator is at fault (forged or corrupted sum) unless a survivor signed tags "
            "that do not describe its own upload, which no other node can tell apart"
        )
