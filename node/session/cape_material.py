"""A CAPE model round's private material in memory, and its copy on disk for a restart.

Under CAPE (Imtiaz, Mohammadi & Sarwate 2019, arXiv 1904.10059) a node's
noise for a model round is e_k = q(ê_k) − share_k(S) plus residual noise,
from its private draws q(ê_k) and the secure sum S of a preceding CAPE-sum
round. :class:`CapeState` holds that material while the session runs (a
rerun reuses the draws and residual); ``node.records.cape_state.CapeStore`` keeps a
copy in ``OUT/audit/cape-<round>/``, each piece saved before anything derived
from it leaves (:func:`save_cape_state`), and a restarted node loads it back
(:func:`cape_state`). A node that sent a share made from its draws never
draws afresh: damaged or missing material stops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from node.egress.release import (
    ReleaseNoise,
    cape_floor_shortfall,
    plan_release,
    with_cape_participants,
)
from node.errors import CapeStateError, SessionFailed
from node.records.cape_state import CapeMaterial, CapeStore, CapeSum
from noise.layout import Layout

if TYPE_CHECKING:
    from node.session.context import SessionContext
    from node.session.progress import RoundProgress

__all__ = ["CapeState", "cape_state", "save_cape_state"]

U64 = NDArray[np.uint64]


@dataclass
class CapeState:
    """A model round's CAPE material for one attempt (a rerun of its CAPE sum draws afresh)."""

    noise: ReleaseNoise
    draws: U64
    residual: U64 | None = None
    participants: tuple[str, ...] = ()
    total: U64 | None = None
    planned: tuple[str, ...] = ()  # the roster τ² was planned for
    sum_index: int | None = None  # the CAPE-sum round whose result ``total`` is
    drawn_for: int | None = None  # the CAPE-sum round whose share the draws were made for

    def floor_shortfall(self, noise: ReleaseNoise, threshold: int) -> str | None:
        """The floor check of a CAPE round with ``noise`` (see cape_floor_shortfall)."""
        dropped = len(self.planned) - len(noise.unit.design.node_ids)
        return cape_floor_shortfall(noise, threshold, dropped)

    def take_sum(self, index: int, total: U64, participants: tuple[str, ...]) -> None:
        """S of CAPE-sum round ``index`` over ``participants`` becomes this state's sum."""
        self.total = total
        self.participants = participants
        self.sum_index = index
        self.noise = with_cape_participants(self.noise, participants)


def save_cape_state(
    ctx: SessionContext, model_round: str, state: CapeState, layout: Layout
) -> None:
    """Save ``state`` in ``OUT/audit/cape-<round>/`` (node/records/cape_state.py), checked."""
    cape_sum = None
    if state.total is not None:
        assert state.sum_index is not None
        cape_sum = CapeSum(state.sum_index, state.participants, state.total)
    material = CapeMaterial(
        session_id=ctx.session_id,
        node_id=ctx.node_id,
        config_hash=ctx.config_hash,
        round_name=model_round,
        layout=layout,
        planned=state.planned,
        draws=state.draws,
        residual=state.residual,
        sum=cape_sum,
        drawn_for=state.drawn_for,
    )
    try:
        CapeStore(ctx.out).save(material)
    except CapeStateError as error:
        raise SessionFailed(
            f"could not save the CAPE material of {model_round!r}: {error}; nothing derived "
            "from it was sent"
        ) from None


def cape_state(
    ctx: SessionContext, progress: RoundProgress, model_round: str, layout: Layout
) -> CapeState | None:
    """This node's CAPE state of ``model_round``: in memory, else saved before a restart.

    None when there is none; a node that sent a share of the round
    (``progress.cape_sent``) must find it, and damaged material stops the
    node: it never draws afresh what its earlier shares were made of.
    """
    state = progress.cape.get(model_round)
    if state is not None or not ctx.resuming:
        return state
    store = CapeStore(ctx.out)
    folder = store.folder(model_round)
    try:
        saved = store.load(
            model_round,
            session_id=ctx.session_id,
            node_id=ctx.node_id,
            config_hash=ctx.config_hash,
            layout=layout,
        )
    except CapeStateError as error:
        raise SessionFailed(
            f"cannot resume the CAPE rounds of {model_round!r} in session {ctx.session_id}: "
            f"{error}. This node never draws its CAPE noise afresh once it may have sent a "
            f"share made from it; restore {folder}, or move it away if this node certainly "
            f"sent no CAPE sum share of {model_round!r} in this session"
        ) from None
    if saved is None:
        if model_round in progress.cape_sent:
            raise SessionFailed(
                f"cannot resume session {ctx.session_id}: this node sent a CAPE sum share of "
                f"{model_round!r} before it restarted, but {folder} holds no saved CAPE "
                "material for it; drawing afresh would make its shares disagree with what it "
                "sent. It stops here; the coordinator drops it at the round deadline and "
                "reruns the round among the others, and a new session includes it again"
            )
        return None
    noise = plan_release(
        ctx.config, saved.planned, ctx.node_id, ctx.plan.sensitivities(model_round), model_round
    )
    if saved.sum is not None:
        noise = with_cape_participants(noise, saved.sum.participants)
    state = CapeState(
        noise=noise,
        draws=saved.draws,
        residual=saved.residual,
        participants=saved.sum.participants if saved.sum is not None else (),
        total=saved.sum.total if saved.sum is not None else None,
        planned=saved.planned,
        sum_index=saved.sum.round_index if saved.sum is not None else None,
        drawn_for=saved.drawn_for,
    )
    progress.cape[model_round] = state
    ctx.say(f"CAPE material of {model_round!r} loaded from {folder}")
    return state
