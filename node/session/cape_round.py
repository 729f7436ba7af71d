"""A CAPE secure-sum round: this node's private draws under one-time pads, and S back.

Before each CAPE model round the nodes learn S = Σ_k q(ê_k), the sum of their
private Gaussian draws (Imtiaz, Mohammadi & Sarwate 2019, arXiv 1904.10059),
through a secure sum blinded by uniform pairwise pads that cancel modulo
2^64. The share carries no data, so it is not an egress for review; its digest
is noted in ``OUT/egress/round-<r>/cape-sum.json`` just before it is sent. The
draws are saved before the share leaves and S on receipt
(``node.session.cape_material``). A rerun reuses the draws; keeping τ² among
fewer nodes lowers every egress's noise, so a rerun is joined only while the
floor holds. A restarted node sends its noted share again, recomputed from
the saved draws and checked against the note, byte for byte.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from node.egress.bundle import egress_folder
from node.egress.release import plan_release, with_cape_participants
from node.errors import NodeRefused, SessionFailed
from node.protocol.masking import cape_draws, cape_sum_payload
from node.records.atomic import atomic_write_json
from node.records.cape_state import CapeStore
from node.session.cape_material import CapeState, cape_state, save_cape_state
from node.session.context import SessionContext
from node.session.model_round import upload
from node.session.outputs import CAPE_SUM_NOTE, json_object
from node.session.progress import RoundProgress
from node.session.results import await_result
from noise.layout import Layout, payload_digest, payload_sha256
from proto.rounds import RoundRef

__all__ = ["noted_share", "run_cape_sum_round", "take_cape_sum"]

U64 = NDArray[np.uint64]


def _names(nodes: tuple[str, ...]) -> str:
    return "{" + ", ".join(sorted(nodes)) + "}"


def noted_share(ctx: SessionContext, index: int) -> dict[str, object] | None:
    """This session's note of the CAPE-sum share of round ``index`` (``cape-sum.json``).

    None when there is none (a note of an earlier session is not this
    node's share). An unreadable note stops the node: it may have been
    written just before the share left.
    """
    path = egress_folder(ctx.out, index) / CAPE_SUM_NOTE
    if not path.exists():
        return None
    data = json_object(path)
    if data is None:
        raise SessionFailed(
            f"{path} is not a readable JSON object; it notes the digest of a CAPE sum share "
            "this node may have sent, which it must check before sending again: restore it"
        )
    return data if data.get("session_id") == ctx.session_id else None


def take_cape_sum(
    ctx: SessionContext,
    model_round: str,
    state: CapeState,
    *,
    index: int,
    total: U64,
    survivors: tuple[str, ...],
    layout: Layout,
) -> None:
    """S of CAPE-sum round ``index`` (over ``survivors``) into ``state``, saved at once."""
    state.take_sum(index, total, survivors)
    # Saved before the model round's egress, which is derived from S, is written.
    save_cape_state(ctx, model_round, state, layout)


def _note(
    ctx: SessionContext,
    *,
    index: int,
    name: str,
    participants: tuple[str, ...],
    digest: str,
    sent_digest: str,
) -> None:
    atomic_write_json(
        egress_folder(ctx.out, index) / CAPE_SUM_NOTE,
        {
            "format": "zerosum-cape-sum",
            "session_id": ctx.session_id,
            "round_index": index,
            "round_name": name,
            "node_id": ctx.node_id,
            "participants": list(participants),
            "payload_sha256": digest,
            "sent_digest": sent_digest,
            "note": (
                "CAPE secure-sum share: a private Gaussian draw under uniform pairwise "
                "one-time pads; it carries no data and needs no review. It leaves under "
                "this node's uniform self-mask too (sent_digest), whose seed is revealed "
                "once every survivor of the round has signed the same survivor set"
            ),
        },
    )


def run_cape_sum_round(
    ctx: SessionContext,
    progress: RoundProgress,
    *,
    index: int,
    name: str,
    participants: tuple[str, ...],
) -> None:
    """Send this node's share of CAPE-sum round ``index`` and take S in."""
    progress.unsent = index
    model_round = RoundRef.parse(name).model_round
    if model_round not in ctx.plan.round_names:
        raise SessionFailed(f"the coordinator opened {name!r} for an unknown model round")
    _, layout = ctx.round_tensors(model_round)
    noted = noted_share(ctx, index)
    if noted is not None:
        progress.cape_sent.add(model_round)
    state = cape_state(ctx, progress, model_round, layout)
    if state is not None and state.drawn_for is not None and state.drawn_for != index:
        # A rerun of the CAPE sum: the last attempt's draws may be known in part
        # (S − S' = q(ê) of a node reported dropped after its share), so every
        # attempt draws ê and the residual afresh; its model egress is another
        # counted release.
        ctx.say(
            f"round {index} ({name!r}) reruns the CAPE sum of round {state.drawn_for}; "
            "drawing fresh CAPE noise"
        )
        state = None
    if state is None:
        noise = plan_release(
            ctx.config, participants, ctx.node_id, ctx.plan.sensitivities(model_round), model_round
        )
        state = CapeState(
            noise=noise,
            draws=cape_draws(noise, layout, seed=ctx.private_seed(), round_index=index),
            planned=participants,
            drawn_for=index,
        )
        # Saved before the share leaves: a restart must send this very draw again.
        save_cape_state(ctx, model_round, state, layout)
        progress.cape[model_round] = state
    else:
        state.noise = with_cape_participants(state.noise, participants)
        # Stop before a rerun whose model round could not be released anyway.
        shortfall = state.floor_shortfall(state.noise, ctx.config.privacy.collusion_threshold)
        if shortfall is not None:
            raise NodeRefused(f"round {index} ({name!r}) not joined: {shortfall}")
    payload = cape_sum_payload(
        state.draws, participants, ctx.node_id, ctx.seeds, layout, round_index=index
    )
    digest = payload_sha256(payload).hex()
    if noted is not None:
        mine = (index, name, ctx.node_id, list(participants), digest)
        keys = ("round_index", "round_name", "node_id", "participants", "payload_sha256")
        found = tuple(noted.get(key) for key in keys)
        if found != mine:
            note = egress_folder(ctx.out, index) / CAPE_SUM_NOTE
            raise SessionFailed(
                f"round {index} ({name!r}): the CAPE sum share recomputed from the draws saved "
                f"in {CapeStore(ctx.out).folder(model_round)} (sha256 {digest[:16]}…, "
                f"participants {_names(participants)}) is not the share {note} notes "
                f"(sha256 {str(noted.get('payload_sha256'))[:16]}…); refusing to send a "
                "different share"
            )
        ctx.say(
            f"round {index} ({name!r}): sending the CAPE sum share noted in "
            f"{egress_folder(ctx.out, index) / CAPE_SUM_NOTE} again"
        )
    else:
        sent = payload_digest(ctx.sent_payload(index, payload, layout)).hex()
        _note(
            ctx, index=index, name=name, participants=participants, digest=digest, sent_digest=sent
        )
    upload(ctx, index=index, name=name, payload=payload, layout=layout, participants=participants)
    progress.unsent = None
    ctx.say(f"round {index} ({name!r}) CAPE sum share uploaded")
    outcome = await_result(
        ctx,
        progress,
        index=index,
        name=name,
        layout=layout,
        participants=participants,
        noise=state.noise,
        contribution=state.draws,
    )
    if outcome is None:
        return
    take_cape_sum(
        ctx,
        model_round,
        state,
        index=index,
        total=outcome.aggregate,
        survivors=outcome.survivors,
        layout=layout,
    )
