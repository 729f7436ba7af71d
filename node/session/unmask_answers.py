"""Answering the coordinator's unmask request for the round this node awaits, or refusing.

Every round has an unmask step, once its uploads are in. One call of
:func:`answer` takes one step: attest the survivor set, with this node's
aggregate-check tags sealed for the other survivors (an attestation reveals
nothing; one set per round index, ever: ``node.records.survivor_sets``), or — once
every survivor attested the same set and its tags open — send this node's
self-mask seed and, if nodes dropped, its pair terms with them (under CAPE,
in a CAPE-sum round, its pads with them), or refuse with a sentence. A
survivor whose signed sealed contribution or tags do not open is named in
the refusal, and the node waits for the round's rerun without it
(``node.session.aggregate_tags``). The rules are those of
``node.protocol.unmask`` (consistent request, enough survivors, every attestation
verified, answers of earlier attempts respected), the noise floor — what is
left on this node's egress once the terms are revealed must stay at or above
it — and the budget: pair terms raise the round's release for the coalition
classes (``ReleaseNoise.mu_after_unmask``), so the ledger with the release
raised that way must keep every class the policy bounds finite and within
``privacy.epsilon_budget`` (``node.egress.budget.reveal_excess``), or the node refuses
with a sentence naming the class and the numbers. Everything an answer
reveals is recorded in the ledger before it leaves, and counted as revealed
from then on, whether or not the coordinator takes it.
"""

from __future__ import annotations

from typing import NoReturn

import numpy as np
from numpy.typing import NDArray

from node.egress import budget
from node.egress.release import ReleaseNoise, with_cape_participants
from node.errors import GatewayError, NodeRefused, SessionFailed, SessionStateError
from node.protocol.masking import unmask_corrections
from node.protocol.unmask import (
    RevealedTerms,
    attestation_signature,
    check_against_revealed,
    check_attestations,
    check_request,
)
from node.records.survivor_sets import SignedSet, SurvivorSets
from node.session.aggregate_tags import Culprit, attest_tags, open_relayed_tags
from node.session.context import SessionContext
from node.session.progress import RoundProgress
from noise.layout import Layout
from noise.masks import cape_blinding
from proto.chunks import payload_spec
from proto.messages import Attestation, UnmaskRequest
from proto.rounds import RoundRef

__all__ = ["answer"]

U64 = NDArray[np.uint64]


def _names(nodes: tuple[str, ...] | set[str]) -> str:
    return "{" + ", ".join(sorted(nodes)) + "}"


def _refuse(ctx: SessionContext, request: UnmaskRequest, reason: str) -> NoReturn:
    ctx.ledger.record_refusal(
        session_id=ctx.session_id,
        round_index=request.round_index,
        round_name=request.round_name,
        dropped=request.dropped,
        survivors=request.survivors,
        reason=reason,
    )
    try:
        ctx.gateway.refuse_unmask(request.refusal(ctx.node_id, reason))
    except GatewayError as error:
        ctx.say(f"the coordinator did not take the refusal ({error.details})")
    raise NodeRefused(
        f"refused to unmask round {request.round_index} ({request.round_name!r}): {reason}"
    )


def _accuse(
    ctx: SessionContext, progress: RoundProgress, request: UnmaskRequest, culprit: Culprit
) -> None:
    """Refuse ``request`` naming ``culprit``, then wait for the round's rerun without it.

    Nothing of this node's is revealed: it answers no request of this set
    again, so its upload stays self-masked.
    """
    reason = f"survivor {culprit.node_id!r} is at fault: {culprit.reason}"
    ctx.ledger.record_refusal(
        session_id=ctx.session_id,
        round_index=request.round_index,
        round_name=request.round_name,
        dropped=request.dropped,
        survivors=request.survivors,
        reason=reason,
    )
    progress.answered.add(request.survivor_hash)
    try:
        ctx.gateway.refuse_unmask(request.refusal(ctx.node_id, reason, culprit.node_id))
    except GatewayError as error:
        ctx.say(f"the coordinator did not take the accusation ({error.details})")
    ctx.say(
        f"round {request.round_index} ({request.round_name!r}): named {culprit.node_id!r} to "
        f"every node and refused to unmask; {reason}; waiting for the round to be rerun "
        "without it"
    )


def _survivor_sets(ctx: SessionContext, progress: RoundProgress) -> SurvivorSets:
    if progress.survivor_sets is None:
        try:
            progress.survivor_sets = SurvivorSets(
                ctx.state.folder, ctx.session_id, legacy_out=ctx.out
            )
        except SessionStateError as error:
            raise SessionFailed(str(error)) from None
    return progress.survivor_sets


def signed_set(ctx: SessionContext, progress: RoundProgress, index: int) -> SignedSet | None:
    """The survivor set this node signed for round ``index`` (with its challenge key), if any."""
    return _survivor_sets(ctx, progress).signed(index)


def _sign_once(
    ctx: SessionContext, progress: RoundProgress, request: UnmaskRequest, index: int
) -> str | None:
    """Record ``request``'s set as the one signed for ``index``; a reason to refuse if another was.

    A coordinator that shows a second, different set for a round index is
    lying about who survived: with one set an uploaded node could reveal its
    self-mask seed while, with the other, the rest reveal their pair terms
    with it. One signed set per index, ever, makes that impossible.
    """
    sets = _survivor_sets(ctx, progress)
    earlier = sets.signed(index)
    wanted = SignedSet(request.survivor_hash, tuple(request.survivors), tuple(request.dropped))
    if earlier is not None and not earlier.same_set(wanted):
        return (
            f"I already signed survivors {_names(earlier.survivors)} (dropped "
            f"{_names(earlier.dropped)}) for round {index}; the request now shows survivors "
            f"{_names(request.survivors)} (dropped {_names(request.dropped)}). A survivor set "
            "is signed once per round: a second one could let the coordinator see a node "
            "both survive and drop, and strip its noise"
        )
    if earlier is None:
        sets.sign(index, wanted)
    return None


def answer(
    ctx: SessionContext,
    progress: RoundProgress,
    request: UnmaskRequest,
    *,
    index: int,
    name: str,
    layout: Layout,
    participants: tuple[str, ...],
    noise: ReleaseNoise,
    contribution: U64 | None,
) -> None:
    """One step of answering ``request`` for round ``index``, the round awaited.

    Attest, then (when all agree) answer: this node's self-mask seed, and its
    pair terms with the dropped nodes if there are any. Every check, the
    attestation and the answer use ``index``, never the request's own round:
    a request for another round is refused.
    """
    if request.survivor_hash in progress.answered:
        return
    reason = check_request(
        request,
        node_id=ctx.node_id,
        session_id=ctx.session_id,
        round_index=index,
        participants=participants,
        config_hash=ctx.config_hash,
        min_nodes=ctx.config.min_nodes,
    )
    if reason is None:
        reason = check_against_revealed(request, progress.revealed.get(index))
    if reason is not None:
        _refuse(ctx, request, reason)
    signed_before = _survivor_sets(ctx, progress).signed(index) is not None
    reason = _sign_once(ctx, progress, request, index)
    if reason is not None:
        _refuse(ctx, request, reason)
    if not signed_before or not any(a.node_id == ctx.node_id for a in request.attestations):
        _attest(
            ctx,
            progress,
            request,
            index=index,
            name=name,
            layout=layout,
            noise=noise,
            contribution=contribution,
        )
        return
    complete, reason = check_attestations(
        request, config_hash=ctx.config_hash, identity_keys=ctx.config.identity_keys
    )
    if reason is not None:
        _refuse(ctx, request, reason)
    if not complete:
        if request.survivor_hash not in progress.attested:
            # Signed by this node before a restart: say once that it goes on waiting.
            progress.attested.add(request.survivor_hash)
            dropped = f" (dropped {_names(request.dropped)})" if request.dropped else ""
            ctx.say(
                f"round {index} ({name!r}): attested survivors {_names(request.survivors)}"
                f"{dropped} before; waiting for every survivor's signature"
            )
        return
    # Every survivor's tags must open before this node's seed leaves: one that
    # does not is named, and the round reruns without it.
    opened = open_relayed_tags(
        ctx,
        request.tags,
        index=index,
        survivors=request.survivors,
        survivor_hash=request.survivor_hash,
    )
    if isinstance(opened, Culprit):
        _accuse(ctx, progress, request, opened)
        return
    if isinstance(opened, str):
        _refuse(ctx, request, opened)
    corrections = _corrections(
        ctx, progress, request, index=index, name=name, layout=layout, noise=noise
    )
    try:
        spec = (
            None
            if corrections is None
            else payload_spec(corrections, layout, ctx.config.fixed_point_bits)
        )
        ctx.gateway.submit_unmask(
            request.answer(ctx.node_id, ctx.self_mask_seed(index), spec), corrections
        )
    except GatewayError as error:
        # The round moved on (it was superseded); the next poll shows it.
        ctx.say(f"unmask answer not taken ({error.details}); fetching the request again")
        return
    progress.answered.add(request.survivor_hash)
    what = f"self-mask seed and pair terms with {_names(request.dropped)}"
    ctx.say(f"round {index} ({name!r}): sent {what if request.dropped else 'self-mask seed'}")


def _attest(
    ctx: SessionContext,
    progress: RoundProgress,
    request: UnmaskRequest,
    *,
    index: int,
    name: str,
    layout: Layout,
    noise: ReleaseNoise,
    contribution: U64 | None,
) -> None:
    """Sign ``request``'s survivor set and send this node's sealed tags with the signature;
    a survivor whose contribution does not open is accused instead."""
    if contribution is None:
        _refuse(
            ctx,
            request,
            "this node no longer holds what it contributed to the round, so it cannot give "
            "the tags that let every node check the aggregate",
        )
    tagged = attest_tags(
        ctx,
        request,
        index,
        _summed(
            ctx,
            request,
            index=index,
            name=name,
            layout=layout,
            noise=noise,
            contribution=contribution,
        ),
        layout,
    )
    if isinstance(tagged, Culprit):
        _accuse(ctx, progress, request, tagged)
        return
    if isinstance(tagged, str):
        _refuse(ctx, request, tagged)
    _survivor_sets(ctx, progress).note_challenge(index, tagged.key, tagged.own)
    progress.challenge = (index, tagged.rho)
    signature = attestation_signature(
        ctx.identity,
        config_hash=ctx.config_hash,
        session_id=ctx.session_id,
        round_index=index,
        survivor_hash=request.survivor_hash,
    )
    ctx.gateway.attest(
        Attestation(
            ctx.node_id,
            request.survivor_hash,
            signature,
            session_id=ctx.session_id,
            round_index=index,
            tags=tuple(tagged.sealed),
        )
    )
    dropped = f" (dropped {_names(request.dropped)})" if request.dropped else ""
    ctx.say(f"round {index} ({name!r}): attested survivors {_names(request.survivors)}{dropped}")
    progress.attested.add(request.survivor_hash)


def _summed(
    ctx: SessionContext,
    request: UnmaskRequest,
    *,
    index: int,
    name: str,
    layout: Layout,
    noise: ReleaseNoise,
    contribution: U64,
) -> U64:
    """What this node adds to the aggregate of ``request``'s set, for its tags.

    A model round's contribution to the sum is its egress less the pair terms
    with D it will reveal; a CAPE-sum share's pads cancel mod 2^64 only, so
    the check covers the draw alone (as it does a CAPE model round, whose
    pair terms are never revealed). Computing the terms reveals nothing: they
    leave only in the answer, after its floor check and ledger entry.
    """
    if (
        not request.dropped
        or RoundRef.parse(name).is_cape_sum
        or ctx.config.privacy.noise_design.construction == "cape"
    ):
        return contribution
    corrections = unmask_corrections(
        noise, ctx.seeds, layout, request.dropped, round_index=index, codec=ctx.codec
    )
    summed: U64 = contribution - corrections
    return summed


def _corrections(
    ctx: SessionContext,
    progress: RoundProgress,
    request: UnmaskRequest,
    *,
    index: int,
    name: str,
    layout: Layout,
    noise: ReleaseNoise,
) -> U64 | None:
    """The pair terms (CAPE-sum pads) with the dropped nodes, recorded first; None if none."""
    if not request.dropped:
        return None
    # Everything revealed for this round once this answer is sent: the floor
    # check and the ledger must see the union, not this request alone. (The
    # request contains every earlier dropped set, see check_against_revealed,
    # so the union is request.dropped; the answer itself stays the terms with D.)
    earlier = progress.revealed.get(index)
    revealed = set(request.dropped) | (earlier.dropped if earlier else set())
    if RoundRef.parse(name).is_cape_sum:
        corrections = _cape_pads(
            ctx,
            progress,
            request,
            revealed=revealed,
            index=index,
            name=name,
            layout=layout,
            noise=noise,
        )
    elif ctx.config.privacy.noise_design.construction == "cape":
        _refuse(
            ctx,
            request,
            "CAPE noise cannot be unmasked; the round must be rerun among the survivors",
        )
    else:
        shortfall = noise.floor_shortfall(revealed)
        if shortfall is not None:
            _refuse(ctx, request, shortfall)
        after = noise.mu_after_unmask(revealed)
        if not _recorded(ctx, index, revealed, request):
            excess = _reveal_excess(ctx, index, revealed, noise.mu(), after)
            if excess is not None:
                _refuse(ctx, request, excess)
            ctx.ledger.record_unmask(
                session_id=ctx.session_id,
                round_index=index,
                round_name=request.round_name,
                dropped=sorted(revealed),
                survivors=request.survivors,
                mu=after,
            )
        corrections = unmask_corrections(
            noise, ctx.seeds, layout, request.dropped, round_index=index, codec=ctx.codec
        )
    # Counted as revealed from here on, whether or not the coordinator takes
    # the answer: its bytes may reach the coordinator before a rejection.
    if earlier is None:
        earlier = progress.revealed[index] = RevealedTerms(set(), set())
    earlier.dropped |= revealed
    earlier.survivors |= set(request.survivors)
    return corrections


def _reveal_excess(
    ctx: SessionContext,
    index: int,
    revealed: set[str],
    before: dict[str, float],
    after: dict[str, float],
) -> str | None:
    """Why revealing pair terms with ``revealed`` would pass the budget of a class, or None.

    Every class the policy bounds (``node.egress.budget.checked``) is composed with
    the ledger, the round's release raised to ``after``; a class left with no
    noise at all is refused whatever the budget.
    """
    privacy = ctx.config.privacy
    excess = budget.reveal_excess(
        ctx.ledger,
        session_id=ctx.session_id,
        round_index=index,
        after=after,
        budget=privacy.epsilon_budget,
        residual_dp=privacy.residual_dp,
    )
    if not excess:
        return None
    classes = "; ".join(
        budget.reveal_sentence(
            e, before=before, after=after, delta=privacy.delta, budget=privacy.epsilon_budget
        )
        for e in excess
    )
    return (
        f"revealing my pair terms with {_names(revealed)} in round {index}: {classes} "
        "(privacy.epsilon_budget, over every session in my ledger); nothing was revealed"
    )


def _cape_pads(
    ctx: SessionContext,
    progress: RoundProgress,
    request: UnmaskRequest,
    *,
    revealed: set[str],
    index: int,
    name: str,
    layout: Layout,
    noise: ReleaseNoise,
) -> U64:
    """This node's pads with the dropped nodes in a CAPE-sum round, after the floor check.

    The pads blind a private draw, not data: with D's pads revealed the
    coordinator learns Σ_S ê_k, which it publishes anyway. What it costs is
    the model round's CAPE noise among S alone, so refuse now if that would
    fall below the floor (the model round checks again).
    """
    state = progress.cape[RoundRef.parse(name).model_round]
    shortfall = state.floor_shortfall(
        with_cape_participants(noise, request.survivors),
        ctx.config.privacy.collusion_threshold,
    )
    if shortfall is not None:
        _refuse(ctx, request, shortfall)
    if not _recorded(ctx, index, revealed, request):
        ctx.ledger.record_secure_sum_unmask(
            session_id=ctx.session_id,
            round_index=index,
            round_name=request.round_name,
            dropped=sorted(revealed),
            survivors=request.survivors,
        )
    pad_partners = sorted({ctx.node_id, *request.dropped})
    pads: U64 = layout.build(
        lambda slot: cape_blinding(
            pad_partners,
            ctx.node_id,
            ctx.seeds,
            round_index=index,
            tensor=slot.name,
            size=slot.size,
        )
    )
    return pads


def _recorded(ctx: SessionContext, index: int, revealed: set[str], request: UnmaskRequest) -> bool:
    """True when the ledger already holds this very answer (same terms, same cost).

    It is sent again after a restart, or when the coordinator missed it.
    """
    return ctx.ledger.has_unmask(
        ctx.session_id, index, dropped=sorted(revealed), survivors=request.survivors
    )
