"""Unmask requests a coordinator could send, driven at a node's answers, and what it revealed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from node.egress.release import ReleaseNoise
from node.protocol.unmask import attestation_signature
from node.records.ledger import SecureSumUnmask, UnmaskReveal
from node.session.unmask_answers import answer
from noise.aggregate_check import CHALLENGE_VECTORS
from noise.layout import Layout
from noise.transcript import survivor_set_hash
from proto.federation import FederationConfig
from proto.messages import Attestation, UnmaskRequest
from tests.node.nodes import CONFIG_HASH, LAYOUT, Node, joined
from tests.node.peer_checks import sealed_contributions, sealed_tags
from tests.support.made_up_federation import (
    SENSITIVITIES,
    SESSION,
    _identities,
    _seeds,
    release_for,
)

LAYOUT_ZEROS = np.zeros(LAYOUT.size, dtype=np.uint64)


def _node(tmp_path: Path, config: FederationConfig, plan: object | None = None) -> Node:
    """Node a past its roster, without network or cohort (only unmask state is used)."""
    return joined(tmp_path, config, plan=plan)


def _request(
    ids: list[str],
    round_index: int,
    survivors: Sequence[str],
    dropped: Sequence[str],
    *,
    attested: Sequence[str] | None = None,
    round_name: str = "scatter",
    me: str = "a",
) -> UnmaskRequest:
    """A well-formed request, signed by ``attested`` (default: every survivor).

    It relays, as the coordinator does, the challenge contribution every other
    survivor sealed for ``me``.
    """
    keys = _identities(ids)
    digest = survivor_set_hash(CONFIG_HASH, SESSION, round_index, survivors, dropped)
    attestations = tuple(
        Attestation(
            node_id=node,
            survivor_hash=digest,
            signature=attestation_signature(
                keys[node],
                config_hash=CONFIG_HASH,
                session_id=SESSION,
                round_index=round_index,
                survivor_hash=digest,
            ),
        )
        for node in (survivors if attested is None else attested)
    )
    attesters = survivors if attested is None else attested
    seeds = _seeds(ids)
    return UnmaskRequest(
        session_id=SESSION,
        round_index=round_index,
        round_name=round_name,
        dropped=tuple(sorted(dropped)),
        survivors=tuple(sorted(survivors)),
        survivor_hash=digest,
        attestations=attestations,
        min_survivors=2,
        challenge=sealed_contributions(
            me,
            ids,
            survivors,
            identities=keys,
            seeds=seeds,
            config_hash=CONFIG_HASH,
            session_id=SESSION,
            round_index=round_index,
        ),
        tags=sealed_tags(
            me,
            {peer: (0,) * CHALLENGE_VECTORS for peer in attesters if peer != me},
            identities=keys,
            seeds=seeds,
            config_hash=CONFIG_HASH,
            session_id=SESSION,
            round_index=round_index,
            survivor_hash=digest,
        ),
    )


def _released(node: Node, ids: list[str], rounds: Sequence[int]) -> ReleaseNoise:
    noise = release_for(node.ctx.config, ids, node.ctx.node_id, SENSITIVITIES)
    for index in rounds:
        node.ctx.ledger.record_release(
            session_id=SESSION,
            round_index=index,
            round_name="x",
            mu=noise.mu(),
            manifest_sha256="",
            payload_sha256="ab" * 32,
        )
    return noise


def _answer(
    node: Node,
    request: UnmaskRequest,
    ids: list[str],
    noise: ReleaseNoise,
    *,
    awaiting: int,
    name: str = "scatter",
    layout: Layout = LAYOUT,
) -> None:
    """Two polls of the same request: the first attests, the second answers."""
    for _ in range(2):
        answer(
            node.ctx,
            node.progress,
            request,
            index=awaiting,
            name=name,
            layout=layout,
            participants=tuple(ids),
            noise=noise,
            contribution=np.zeros(layout.size, dtype=np.uint64),
        )


def _unmask_entries(node: Node) -> list[tuple[int, list[str]]]:
    return [
        (e.round_index, list(e.dropped))
        for e in node.ctx.ledger.entries
        if isinstance(e, UnmaskReveal | SecureSumUnmask)
    ]
