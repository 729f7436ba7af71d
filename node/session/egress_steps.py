"""One egress, from noised payload to recorded release: budget, bundle, audit, approval, ledger.

A model round's egress is written to ``OUT/egress/round-<r>/`` before it may
leave (``node.egress.EgressBundle``), with the un-noised values in
``OUT/audit/round-<r>/``; the budget is checked first; the output checker's
approval is awaited (automatic in demo mode); the ledger records the release
(keyed by session, round and payload digest) and the state folder's session
record notes it, both before the bytes leave. A bundle written before a restart is never
recomputed — its residual noise came from the OS CSPRNG, so a recomputation
would be a second, different release of the same data — but verified
(:func:`bundle_before_restart`), checked against the noise the node plans
now, and released again as it is (:func:`release_again`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from node.egress import budget
from node.egress.approval import ApprovalGate, read_approval
from node.egress.audit import AUDIT, AuditRecord, audit_folder, write_audit
from node.egress.bundle import MANIFEST, EgressBundle, egress_folder
from node.egress.receipt import SDCEvidence
from node.egress.release import ReleaseNoise
from node.errors import (
    EgressIntegrityError,
    NodeRefused,
    SessionFailed,
)
from node.records.ledger import NoiseFacts
from node.session.context import SessionContext
from noise.keys import key_fingerprint
from noise.layout import Layout

__all__ = [
    "budget_refusal",
    "bundle_before_restart",
    "check_budget",
    "check_bundle_noise",
    "check_session_budget",
    "release",
    "release_again",
]

U64 = NDArray[np.uint64]
# How often to ask the coordinator about the session while awaiting approval.
_WATCH_SECONDS = 2.0


def budget_refusal(
    ctx: SessionContext,
    what: str,
    releases: list[dict[str, float]],
    *,
    laplace: Sequence[float] = (),
) -> None:
    """Raise NodeRefused when ``releases`` (and ``laplace``) would pass the budget.

    ``releases``: μ per class of prospective Gaussian releases; ``laplace``: ε
    of prospective Laplace releases. The sentence is also the withdrawal's
    reason, so it names no local path.
    """
    privacy = ctx.config.privacy
    excess = budget.over_budget(
        ctx.ledger,
        releases,
        budget=privacy.epsilon_budget,
        residual_dp=privacy.residual_dp,
        laplace=laplace,
    )
    if not excess:
        return
    reasons = "; ".join(budget.excess_sentence(e) for e in excess)
    labels = [t.label for t in ctx.ledger.totals(extras=releases, laplace=laplace)]
    note = budget.unbounded_note(labels, privacy.residual_dp)
    raise NodeRefused(
        f"{what} would bring this node's total ε {reasons}, above the budget of "
        f"{privacy.epsilon_budget:g} (privacy.epsilon_budget, over every session in this "
        f"node's ledger){'; ' + note if note else ''}; nothing was sent"
    )


def check_budget(ctx: SessionContext, index: int, name: str, mu: dict[str, float]) -> None:
    """Refuse (NodeRefused) a release that would take any checked class above the budget.

    The classes are those of ``node.egress.budget``: outsider and outsider with up
    to T colluding nodes always, the coordinator and its coalitions when
    residual noise bounds them.
    """
    budget_refusal(ctx, f"releasing round {index} ({name!r})", [mu])


def check_session_budget(ctx: SessionContext, participants: tuple[str, ...]) -> None:
    """Refuse (NodeRefused) a session whose remaining releases could pass the budget.

    The worst case the rerun cap allows: each plan round released
    ``session.max_reruns`` + 1 times in all (every attempt but the last
    superseded), less the attempts the ledger already holds for this
    session, planned among ``participants`` and composed with everything
    the ledger holds; checked before this node's first release or share of
    the session (and again after a restart).
    """
    plan = ctx.plan
    attempts = ctx.config.session.max_reruns + 1
    released = Counter(
        e.round_name
        for e in ctx.ledger.entries
        if e.kind == "release" and e.session_id == ctx.session_id
    )
    left = {name: max(0, attempts - released[name]) for name in plan.round_names}
    rounds = {name: plan.sensitivities(name) for name in plan.round_names if left[name]}
    # The plan's release after the model (the delta summary) is part of the session's cost.
    after = plan.post_model_release()
    laplace = (
        [after.epsilon]
        if after is not None
        and not any(
            e.kind == "laplace" and e.session_id == ctx.session_id for e in ctx.ledger.entries
        )
        else []
    )
    if not rounds and not laplace:
        return
    costs = budget.session_cost(ctx.config, participants, ctx.node_id, rounds)
    releases = [mu for name, mu in costs.items() for _ in range(left[name])]
    names = [*costs, *([after.label] if after is not None and laplace else [])]
    count = len(releases) + len(laplace)
    cap = (
        f", each plan round at most {attempts} times (session.max_reruns = "
        f"{ctx.config.session.max_reruns})"
        if attempts > 1
        else ""
    )
    budget_refusal(
        ctx,
        f"session {ctx.session_id} ({count} release{'s' if count != 1 else ''} among "
        f"{len(participants)} nodes: {', '.join(names)}{cap})",
        releases,
        laplace=laplace,
    )


def _write_audit(
    ctx: SessionContext, index: int, name: str, bundle: EgressBundle, clean: U64
) -> None:
    write_audit(
        ctx.out,
        AuditRecord(
            session_id=ctx.session_id,
            round_index=index,
            round_name=name,
            node_id=ctx.node_id,
            fixed_point_bits=ctx.config.fixed_point_bits,
            tensors=bundle.tensors,
            payload=clean,
            clipped=ctx.plan.clipped(name),
            egress_payload_sha256=bundle.payload_sha256,
            subjects=ctx.plan.n_used(),
        ),
    )


def release(
    ctx: SessionContext,
    *,
    index: int,
    name: str,
    layout: Layout,
    noise: ReleaseNoise,
    clean: U64,
    egress: U64,
) -> Path:
    """Budget check, egress bundle, audit record, approval, ledger entry; the bundle folder."""
    privacy = ctx.config.privacy
    mu = noise.mu()
    check_budget(ctx, index, name, mu)
    totals = [t.as_release() for t in ctx.ledger.totals(extra=mu)]
    bundle = EgressBundle(
        session_id=ctx.session_id,
        round_index=index,
        round_name=name,
        node_id=ctx.node_id,
        fixed_point_bits=ctx.config.fixed_point_bits,
        tensors=noise.entries(layout.shapes),
        masking=noise.masking_facts(residual_dp=privacy.residual_dp),
        dp=noise.receipt(totals, len(ctx.ledger.release_mu()) + 1),
        sdc=SDCEvidence(
            n_subjects=ctx.plan.n_used(),
            residual_degrees_of_freedom=ctx.plan.residual_dof(name),
            notes=ctx.plan.sdc_notes(name),
        ),
        payload=egress,
        config_hash=ctx.config_hash.hex(),
        approval_mode=ctx.options.approve,
    )
    folder = bundle.write(ctx.out)
    _write_audit(ctx, index, name, bundle, clean)
    ctx.say(f"round {index} ({name!r}): egress bundle written to {folder}")
    return _approve_and_record(
        ctx, index=index, name=name, layout=layout, noise=noise, folder=folder, egress=egress
    )


def _session_watch(ctx: SessionContext, index: int) -> Callable[[], None]:
    """While a reviewer decides: stop if the session ends or moves on without this node."""
    last = [time.monotonic()]

    def check() -> None:
        if time.monotonic() - last[0] < _WATCH_SECONDS:
            return
        last[0] = time.monotonic()
        status = ctx.gateway.status(ctx.session_id)
        if status.state.ended:
            raise SessionFailed(
                f"the session ended while round {index} awaited approval: "
                f"{status.reason or 'completed without this node'}"
            )
        for summary in status.rounds:
            if summary.index <= index and ctx.node_id in summary.dropped:
                raise SessionFailed(
                    f"the coordinator dropped this node from round {summary.index} "
                    "while its egress awaited approval (the round deadline passed)"
                )

    return check


def _approve_and_record(
    ctx: SessionContext,
    *,
    index: int,
    name: str,
    layout: Layout,
    noise: ReleaseNoise,
    folder: Path,
    egress: U64,
    resumed: bool = False,
) -> Path:
    """The reviewer's approval of the bundle in ``folder``, then its ledger entry (once).

    A resumed bundle keeps an approval given before the restart (checked
    again); in manual mode the gate finds it on its first look.
    """
    options = ctx.options
    checkers = ctx.config.node(ctx.node_id).checker_public_keys
    gate = ApprovalGate(
        options.approve,
        identity=ctx.identity,
        checker_keys={key: f"output checker key {key_fingerprint(key)}" for key in checkers},
        timeout_seconds=options.approval_timeout,
        progress=ctx.say,
        interrupt=_session_watch(ctx, index),
    )
    found = read_approval(folder) if resumed and options.approve == "auto" else None
    approval = gate.check(folder, found) if found is not None else gate.wait(folder)
    checked = EgressBundle.verify(folder)
    if not np.array_equal(checked.payload, egress):
        raise SessionFailed(f"the payload in {folder} changed after it was written")
    ctx.say(f"round {index} ({name!r}) approved by {approval.reviewer}")
    # Both records are written before the bytes leave (the caller uploads
    # after this returns). The same payload recorded before a restart is
    # the same release: the ledger keeps its one entry.
    ctx.ledger.record_release(
        session_id=ctx.session_id,
        round_index=index,
        round_name=name,
        mu=noise.mu(),
        manifest_sha256=EgressBundle.manifest_sha256(folder),
        payload_sha256=checked.payload_sha256,
        tensors=list(layout.names),
        noise=NoiseFacts(
            mechanism=checked.dp.mechanism,
            delta_sampler=checked.dp.delta_sampler,
            delta_discretisation=checked.dp.delta_discretisation,
        ),
    )
    ctx.state.record_release(ctx.session_id, index)
    return folder


def bundle_before_restart(ctx: SessionContext, index: int, name: str) -> EgressBundle | None:
    """This node's verified egress of round ``index``, written before a restart, or None.

    None when the round has no bundle yet (a folder without a manifest is
    the remains of an interrupted write: nothing of it was approved or
    sent). A bundle that fails verification, belongs to another round,
    session or node, or is not the one the ledger recorded stops the node:
    it never replaces a release record.
    """
    folder = egress_folder(ctx.out, index)
    if not (folder / MANIFEST).exists():
        return None
    try:
        bundle = EgressBundle.verify(folder)
    except EgressIntegrityError as error:
        raise SessionFailed(
            f"{error}. This node wrote that bundle before it restarted and never recomputes "
            "a release (new noise would make it a second, different release); restore the "
            "folder, or move it away if it was certainly never approved nor sent"
        ) from None
    mine = (ctx.session_id, index, name, ctx.node_id, ctx.config_hash.hex())
    found = (
        bundle.session_id,
        bundle.round_index,
        bundle.round_name,
        bundle.node_id,
        bundle.config_hash,
    )
    if found != mine:
        raise SessionFailed(
            f"{folder} holds the egress of session {bundle.session_id}, round "
            f"{bundle.round_index} ({bundle.round_name!r}), node {bundle.node_id!r}, not this "
            f"node's round {index} ({name!r}) of session {ctx.session_id}; move it away "
            "to go on"
        )
    recorded = ctx.ledger.release_entries(ctx.session_id, index)
    digest = EgressBundle.manifest_sha256(folder)
    if recorded and not any(e.manifest_sha256 == digest for e in recorded):
        shown = recorded[-1].manifest_sha256[:16]
        raise SessionFailed(
            f"the ledger records the release of round {index} with manifest sha256 "
            f"{shown}…, but {folder} holds manifest {digest[:16]}…; refusing to send anything "
            "but the recorded release"
        )
    # A kill inside the bundle's write can leave ACRO's records unwritten.
    EgressBundle.complete_after_crash(folder)
    return bundle


def check_bundle_noise(bundle: EgressBundle, noise: ReleaseNoise, layout: Layout) -> None:
    """Raise unless ``bundle`` declares the tensors and σ of ``noise`` over ``layout``."""
    name = bundle.round_name
    planned = noise.entries(layout.shapes)
    for have, want in itertools.zip_longest(bundle.tensors, planned):
        same = (
            have is not None
            and want is not None
            and (have.name, have.shape, have.offset) == (want.name, want.shape, want.offset)
            and math.isclose(have.sigma, want.sigma, rel_tol=1e-9)
        )
        if not same:
            raise SessionFailed(
                f"the egress of round {bundle.round_index} ({name!r}) written before the "
                f"restart declares tensors {[t.name for t in bundle.tensors]} with other "
                "noise than this node plans for the round now; refusing to resubmit it"
            )


def release_again(
    ctx: SessionContext,
    *,
    index: int,
    name: str,
    layout: Layout,
    noise: ReleaseNoise,
    clean: U64,
    bundle: EgressBundle,
) -> Path:
    """Approval and ledger entry of a bundle written before a restart (once each)."""
    folder = egress_folder(ctx.out, index)
    if not (audit_folder(ctx.out, index) / AUDIT).exists():
        # The crash came between the bundle and its audit record.
        _write_audit(ctx, index, name, bundle, clean)
    released = (
        ctx.ledger.recorded_release(
            ctx.session_id,
            index,
            payload_sha256=bundle.payload_sha256,
            manifest_sha256=EgressBundle.manifest_sha256(folder),
        )
        is not None
    )
    if not released:
        check_budget(ctx, index, name, noise.mu())
    state = "approved and recorded" if released else "not yet released"
    ctx.say(
        f"round {index} ({name!r}): resubmitting the egress bundle in {folder} written "
        f"before the restart ({state}; not recomputed)"
    )
    return _approve_and_record(
        ctx,
        index=index,
        name=name,
        layout=layout,
        noise=noise,
        folder=folder,
        egress=bundle.payload,
        resumed=True,
    )
