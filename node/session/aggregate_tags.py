"""This node's part in checking a round's aggregate: its challenge, its tags, the check.

The coordinator could publish a forged sum together with the genuine upload
statements (which prove what was counted, not that the sum is theirs). Each
round therefore carries a secret linear check (``noise.aggregate_check``):

1. with its upload, the node seals its challenge contribution c_k (derived
   from the session key, so a restart gives the same one) for every other
   participant under their pairwise key;
2. in its unmask answer it opens the contributions of every other survivor,
   forms κ and the challenge vectors ρ, and sends its tags ⟨ρ, v_k⟩ of its
   contribution to the aggregate (its egress less the pair terms it reveals;
   in a CAPE-sum round its draw q(ê_k)), blinded by pads that cancel over the
   survivors; κ is kept in ``STATE/survivor-sets.json`` first;
3. when the aggregate A is published with every survivor's blinded tags, it
   checks Σ blinded ≡ ⟨ρ, A⟩ (mod 2^128) for each of the four vectors: a
   forged A passes with probability at most 2^-64 (docs/design.md §4.5).

The coordinator never sees κ or ρ; a node that colludes with it does, so the
check protects against a coordinator acting alone.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from numpy.typing import NDArray

from node.errors import SessionFailed
from node.gateway import RoundResult, UnmaskRequest
from node.session.context import SessionContext
from noise.aggregate_check import (
    CHALLENGE_VECTORS,
    blinded_tags,
    challenge_contribution,
    challenge_key,
    challenge_vectors,
    check_tags,
    open_contribution,
    seal_contribution,
    tags,
    tags_from_bytes,
    tags_to_bytes,
)
from noise.layout import Layout

__all__ = ["answer_tags", "check_aggregate", "sealed_challenge"]

U64 = NDArray[np.uint64]


def _own(ctx: SessionContext, index: int) -> bytes:
    return challenge_contribution(
        ctx.ephemeral,
        config_hash=ctx.config_hash,
        session_id=ctx.session_id,
        node_id=ctx.node_id,
        round_index=index,
    )


def sealed_challenge(
    ctx: SessionContext, index: int, participants: Collection[str]
) -> list[tuple[str, bytes]]:
    """(recipient, sealed) of this node's contribution for every other participant."""
    mine = _own(ctx, index)
    return [
        (
            peer,
            seal_contribution(
                mine,
                ctx.seeds[peer],
                config_hash=ctx.config_hash,
                session_id=ctx.session_id,
                round_index=index,
                sender=ctx.node_id,
                recipient=peer,
            ),
        )
        for peer in sorted(set(participants) - {ctx.node_id})
    ]


def answer_tags(
    ctx: SessionContext, request: UnmaskRequest, index: int, contribution: U64, layout: Layout
) -> tuple[bytes, U64, list[bytes]] | str:
    """(κ, ρ, this node's blinded tags), or a reason to refuse (a contribution missing or altered).

    ρ is returned so that the check of the published aggregate need not
    expand it again (it is a function of κ alone).
    """
    survivors = set(request.survivors)
    sealed = dict(request.challenge)
    contributions = {ctx.node_id: _own(ctx, index)}
    for peer in sorted(survivors - {ctx.node_id}):
        if peer not in sealed:
            return (
                f"the request does not relay the challenge contribution of survivor {peer!r}, "
                "so this node cannot check the round's aggregate"
            )
        try:
            contributions[peer] = open_contribution(
                sealed[peer],
                ctx.seeds[peer],
                config_hash=ctx.config_hash,
                session_id=ctx.session_id,
                round_index=index,
                sender=peer,
                recipient=ctx.node_id,
            )
        except ValueError as error:
            return str(error)
    key = challenge_key(contributions, round_index=index)
    rho = challenge_vectors(key, layout.size, round_index=index)
    own = tags(contribution, rho)
    blinded = blinded_tags(own, ctx.node_id, survivors, ctx.seeds, round_index=index)
    return key, rho, tags_to_bytes(blinded)


def check_aggregate(
    ctx: SessionContext,
    result: RoundResult,
    index: int,
    layout: Layout,
    key: bytes | None,
    *,
    rho: U64 | None = None,
) -> None:
    """Refuse (SessionFailed) an aggregate its survivors' blinded tags do not vouch for.

    ``rho``: the challenge vectors of ``key`` when already expanded.
    """
    what = f"the aggregate of round {index} ({result.round_name!r})"
    if key is None:
        raise SessionFailed(
            f"{what} is published, but this node holds no challenge key for it, so it cannot "
            "check it; refusing to use an unchecked aggregate"
        )
    given = dict(result.tags)
    if set(given) != set(result.survivors):
        raise SessionFailed(
            f"{what} comes with the tags of {sorted(given)}, not of its survivors "
            f"{sorted(result.survivors)}; it cannot be checked"
        )
    assert result.aggregate is not None
    try:
        blinded = {node: tags_from_bytes(values) for node, values in given.items()}
    except ValueError as error:
        raise SessionFailed(f"{what}: {error}") from None
    if rho is None:
        rho = challenge_vectors(key, layout.size, round_index=index)
    failed = check_tags(blinded, result.aggregate, rho)
    if failed:
        raise SessionFailed(
            f"{what} fails {len(failed)} of {CHALLENGE_VECTORS} secret checks: it is not the sum "
            "of the survivors' contributions (forged or corrupted by the coordinator)"
        )
