"""A model round: local tensors to a released, uploaded egress, and the aggregate back.

The plan's tensors for the round (values clipped to the public bounds) are
encoded in fixed point, q(x_k); the zero-sum mask is added — pairwise
(``node.protocol.masking``, drawn ahead in the background when the round was foreseen)
or CAPE's e_k = q(ê_k) − share_k(S) from the round's completed CAPE sum — and
residual noise when the policy enables it. The egress is released
(``node.session.egress_steps``: budget, bundle, audit, approval, ledger),
uploaded with a signed upload statement, and the aggregate awaited
(``node.session.results``); the plan takes it in. A bundle written before a
restart is released and sent again exactly as it was.

What leaves is the released egress z plus a uniform self-mask b
(``noise.self_mask``; its seed is a function of the saved session key and the
round index), with a commitment to the seed: until the node reveals the seed,
in the round's unmask step and only once every survivor has signed the same
survivor set, its upload is a one-time pad (docs/design.md §4.6).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from node.egress.bundle import MANIFEST, EgressBundle, egress_folder
from node.egress.release import ReleaseNoise, plan_release
from node.errors import NodeRefused, SessionFailed
from node.protocol.masking import MaskPrefetch, add_residual_noise, cape_masks
from node.protocol.statements import sign_upload_statement
from node.records.cape_state import CapeStore
from node.session import egress_steps
from node.session.aggregate_tags import sealed_challenge
from node.session.cape_material import cape_state, save_cape_state
from node.session.context import SessionContext
from node.session.progress import RoundProgress
from node.session.results import Outcome, await_result
from noise.errors import NoiseError
from noise.layout import Layout, payload_digest
from noise.self_mask import self_mask_commitment
from proto.chunks import payload_spec
from proto.messages import UploadHeader

__all__ = ["prefetch_mask", "run_model_round", "upload"]

U64 = NDArray[np.uint64]


def _names(nodes: tuple[str, ...]) -> str:
    return "{" + ", ".join(sorted(nodes)) + "}"


def upload(
    ctx: SessionContext,
    *,
    index: int,
    name: str,
    payload: U64,
    layout: Layout,
    participants: tuple[str, ...],
) -> tuple[int, int, bool]:
    """Upload ``payload`` under its self-mask, with the signed statement of what was sent.

    Returns (submitted, expected, duplicate).
    """
    seed = ctx.self_mask_seed(index)
    sent = ctx.sent_payload(index, payload, layout)
    digest = payload_digest(sent)
    header = UploadHeader(
        session_id=ctx.session_id,
        round_index=index,
        round_name=name,
        node_id=ctx.node_id,
        payload=payload_spec(None, layout, ctx.config.fixed_point_bits, digest=digest),
        roster_hash=ctx.roster.roster_hash,
        statement_signature=sign_upload_statement(
            ctx.identity,
            config_hash=ctx.config_hash,
            session_id=ctx.session_id,
            round_index=index,
            round_name=name,
            roster_hash=ctx.roster.roster_hash,
            payload_digest=digest,
        ),
        self_mask_commitment=self_mask_commitment(seed),
        challenge=tuple(sealed_challenge(ctx, index, participants)),
    )
    receipt = ctx.gateway.upload(header, sent)
    return receipt.submitted_count, receipt.expected_count, receipt.duplicate


def _earlier_cape_noise(
    ctx: SessionContext,
    progress: RoundProgress,
    bundle: EgressBundle,
    *,
    participants: tuple[str, ...],
    layout: Layout,
    clean: U64,
) -> ReleaseNoise:
    """The CAPE noise plan of ``bundle`` (written before a restart), checked bit for bit.

    The saved CAPE material must rebuild the bundle's payload exactly,
    q(x_k) + q(ê_k) − share_k(S) + q(r_k): it is what unmask refusals,
    the ledger and any rerun of the round go on with.
    """
    name = bundle.round_name
    folder = egress_folder(ctx.out, bundle.round_index)
    saved = CapeStore(ctx.out).folder(name)
    state = cape_state(ctx, progress, name, layout)
    if (
        state is None
        or state.total is None
        or state.residual is None
        or state.participants != participants
    ):
        raise SessionFailed(
            f"{folder} holds a CAPE egress written before a restart, but {saved} does not "
            f"hold the draws, the CAPE sum among {_names(participants)} and the residual "
            "noise it was built with; this node cannot take part in the round again"
        )
    egress_steps.check_bundle_noise(bundle, state.noise, layout)
    mask = cape_masks(state.draws, state.total, participants, ctx.node_id)
    if not np.array_equal(clean + mask + state.residual, bundle.payload):
        raise SessionFailed(
            f"the payload in {folder} is not the local values plus the CAPE noise saved in "
            f"{saved}; refusing to resubmit it"
        )
    return state.noise


def _fresh_cape_egress(
    ctx: SessionContext,
    progress: RoundProgress,
    *,
    index: int,
    name: str,
    participants: tuple[str, ...],
    layout: Layout,
    clean: U64,
) -> tuple[ReleaseNoise, U64]:
    state = cape_state(ctx, progress, name, layout)
    if state is None or state.total is None or state.participants != participants:
        raise SessionFailed(
            f"round {index} ({name!r}) opened without a completed CAPE sum among "
            f"{_names(participants)}"
        )
    noise = state.noise
    # A rerun keeps τ² but shrinks K; the ε budget check cannot see that the
    # remaining participants' noise fell below the floor.
    shortfall = state.floor_shortfall(noise, ctx.config.privacy.collusion_threshold)
    if shortfall is not None:
        raise NodeRefused(f"round {index} ({name!r}) not released: {shortfall}; nothing was sent")
    mask = cape_masks(state.draws, state.total, participants, ctx.node_id)
    if state.residual is None:
        state.residual = add_residual_noise(
            np.zeros_like(clean), noise, layout, seed=ctx.private_seed(), round_index=index
        )
        # Saved before the bundle is written: a rerun must add this very noise again.
        save_cape_state(ctx, name, state, layout)
    return noise, clean + mask + state.residual


def run_model_round(
    ctx: SessionContext,
    progress: RoundProgress,
    masks: MaskPrefetch,
    *,
    index: int,
    name: str,
    participants: tuple[str, ...],
) -> Outcome | None:
    """Release and upload this node's egress of round ``index``; its aggregate, or None."""
    progress.unsent = index
    tensors, layout = ctx.round_tensors(name)
    clean = layout.encode(tensors, ctx.codec)
    earlier = egress_steps.bundle_before_restart(ctx, index, name)
    cape = ctx.config.privacy.noise_design.construction == "cape"
    if earlier is not None:
        # Sent again exactly as written: recomputing would draw new residual
        # noise, a second and different release of the same data.
        if cape:
            noise = _earlier_cape_noise(
                ctx, progress, earlier, participants=participants, layout=layout, clean=clean
            )
        else:
            noise = plan_release(
                ctx.config, participants, ctx.node_id, ctx.plan.sensitivities(name), name
            )
            egress_steps.check_bundle_noise(earlier, noise, layout)
        egress = earlier.payload
        folder = egress_steps.release_again(
            ctx, index=index, name=name, layout=layout, noise=noise, clean=clean, bundle=earlier
        )
    else:
        if cape:
            noise, egress = _fresh_cape_egress(
                ctx,
                progress,
                index=index,
                name=name,
                participants=participants,
                layout=layout,
                clean=clean,
            )
        else:
            noise = plan_release(
                ctx.config, participants, ctx.node_id, ctx.plan.sensitivities(name), name
            )
            # q(x_k) + m_k formed inside the mask's own buffer (addition modulo 2^64
            # commutes), so the round holds q(x_k), the egress and nothing more.
            mask = masks.take(noise, layout, round_index=index)
            np.add(mask, clean, out=mask)
            egress = add_residual_noise(
                mask, noise, layout, seed=ctx.private_seed(), round_index=index, in_place=True
            )
            del mask
        folder = egress_steps.release(
            ctx, index=index, name=name, layout=layout, noise=noise, clean=clean, egress=egress
        )
    del clean  # recorded in the audit folder; the rest of the round needs only the egress
    submitted, expected, duplicate = upload(
        ctx, index=index, name=name, payload=egress, layout=layout, participants=participants
    )
    progress.unsent = None
    held = "; the coordinator already held these bytes" if duplicate else ""
    ctx.say(
        f"round {index} ({name!r}) uploaded from {folder} "
        f"({submitted} of {expected} nodes in{held})"
    )
    outcome = await_result(
        ctx,
        progress,
        index=index,
        name=name,
        layout=layout,
        participants=participants,
        noise=noise,
        contribution=egress,
    )
    if outcome is None:
        ctx.say(f"round {index} ({name!r}) is superseded; waiting for the rerun")
        return None
    del egress  # the aggregate is verified: the own contribution is needed no more
    ctx.plan.receive(name, layout.decode(outcome.aggregate, ctx.codec))
    ctx.say(f"round {index} ({name!r}) aggregated")
    return outcome


def prefetch_mask(
    ctx: SessionContext, masks: MaskPrefetch, index: int, participants: tuple[str, ...]
) -> None:
    """Start drawing round ``index``'s pairwise mask now (``node.protocol.masking.MaskPrefetch``).

    Under the pairwise construction round ``index`` is the plan's round of
    that position, and its participants are those of the round just
    finished unless someone drops meanwhile. The mask needs no data, so it
    is drawn in the background while this node computes, waits for the
    round to open or writes its bundle; the round takes it if it turns out
    as predicted and draws afresh otherwise.
    """
    if (
        ctx.config.privacy.noise_design.construction != "pairwise"
        or index >= len(ctx.plan.round_names)
        or (egress_folder(ctx.out, index) / MANIFEST).exists()
    ):
        return
    name = ctx.plan.round_names[index]
    try:
        # The public layout: a plan's tensors may depend on aggregates not yet received.
        layout = ctx.config.plan.round(name).layout
        noise = plan_release(
            ctx.config, participants, ctx.node_id, ctx.plan.sensitivities(name), name
        )
    except (ValueError, KeyError, NoiseError):
        return  # the round itself reports the problem if it really opens so
    masks.start(noise, layout, round_index=index)
