"""The delta summary after the model: budget, noised statistics, bundle, approval, ledger.

When ``[plan.delta_summary]`` is enabled the plan's release after the model
(:class:`DeltaSummaryRelease`, a ``node.plans.interface.PostModelRelease``)
summarises the node's own subjects' deltas under the model fitted without
them (the plan's ``summary_deltas``: the others' sums, so the summary is ε-DP
in this node's cohort whatever else is known; docs/design.md §8) with
``delta_summary`` and writes the bundle of ``summary_bundle``. As
for a round's egress the budget is checked first (the summary's ε is seen
by every observer class), the output checker's decision is awaited (the
same gate and checker keys), and the ledger records the release before it
may leave. A bundle already on disk (a restart after it was written) is
verified and taken as it is: drawing new noise would be a second release.

The ledger entry is written before the bundle, not after the approval: once
the bundle is on disk a checker may approve it and the TRE export it while
this node is no longer running, so the release is counted from the moment it
could leave. A rejected summary therefore still counts (an overcount, never
an undercount).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from node.egress.approval import ApprovalGate
from node.errors import EgressIntegrityError, ModelFitError, NodeRefused, SessionFailed
from node.plans.deltab.delta_summary import DeltaSummarySettings, summarise
from node.plans.deltab.summary_bundle import (
    MANIFEST,
    SUMMARY_ROUND,
    SUMMARY_ROUND_NAME,
    SummaryBundle,
    summary_folder,
)
from node.session.context import SessionContext
from node.session.egress_steps import budget_refusal
from noise.keys import key_fingerprint

__all__ = ["DeltaSummaryRelease", "release_delta_summary"]


@dataclass(frozen=True)
class DeltaSummaryRelease:
    """The delta summary as the brain-age plan's release after the model."""

    settings: DeltaSummarySettings
    # The deltas under the model fitted without this node's subjects (docs/design.md §8).
    summary_deltas: Callable[[], NDArray[np.float64]]

    @property
    def label(self) -> str:
        return "delta summary"

    @property
    def epsilon(self) -> float:
        return self.settings.epsilon

    def release(self, ctx: SessionContext, model_path: Path) -> Path:
        return release_delta_summary(ctx, model_path, self.settings, self.summary_deltas)


def release_delta_summary(
    ctx: SessionContext,
    model_path: Path,
    settings: DeltaSummarySettings,
    summary_deltas: Callable[[], NDArray[np.float64]],
) -> Path:
    """Write, get approved and record this node's delta summary; its folder."""
    folder = summary_folder(ctx.out)
    if (folder / MANIFEST).exists():
        try:
            bundle = SummaryBundle.verify(folder)
        except EgressIntegrityError as error:
            raise SessionFailed(
                f"the delta summary written before a restart does not verify ({error}); it is "
                "not released again"
            ) from None
        if bundle.session_id != ctx.session_id:
            raise SessionFailed(
                f"{folder} holds the delta summary of session {bundle.session_id}, not "
                f"{ctx.session_id}; move it away"
            )
        ctx.say(f"delta summary: taking the bundle written before the restart, {folder}")
    else:
        budget_refusal(ctx, "releasing the delta summary", [], laplace=[settings.epsilon])
        try:
            deltas = summary_deltas()
        except ModelFitError as error:
            raise NodeRefused(f"the delta summary cannot be released: {error}") from None
        deltas = deltas[np.isfinite(deltas)]
        try:
            summary = summarise(
                deltas, settings, n_floor=ctx.config.min_cohort_size, seed=ctx.private_seed()
            )
        except ValueError as error:
            raise NodeRefused(f"the delta summary cannot be released: {error}") from None
        values = SummaryBundle.values_of(summary)
        ctx.ledger.record_laplace(
            session_id=ctx.session_id,
            round_index=SUMMARY_ROUND,
            round_name=SUMMARY_ROUND_NAME,
            epsilon=settings.epsilon,
            manifest_sha256="",
            payload_sha256=hashlib.sha256(values).hexdigest(),
            statistics=list(summary.released),
        )
        bundle = SummaryBundle.write(
            ctx.out,
            summary,
            session_id=ctx.session_id,
            node_id=ctx.node_id,
            config_hash=ctx.config_hash.hex(),
            model_sha256=hashlib.sha256(model_path.read_bytes()).hexdigest(),
            # The ledger holds this release already (recorded just above).
            totals=ctx.ledger.totals(),
        )
        ctx.say(
            f"delta summary (Laplace, ε = {settings.epsilon:g}) written to {folder}; "
            f"{summary.clipped} of {summary.n_subjects} deltas were clipped to the declared "
            f"range [{settings.delta_low:g}, {settings.delta_high:g}] years"
        )
    checkers = ctx.config.node(ctx.node_id).checker_public_keys
    gate = ApprovalGate(
        ctx.options.approve,
        identity=ctx.identity,
        checker_keys={key: f"output checker key {key_fingerprint(key)}" for key in checkers},
        timeout_seconds=ctx.options.approval_timeout,
        progress=ctx.say,
    )
    approval = gate.wait(folder)
    try:
        checked = SummaryBundle.verify(folder)
    except EgressIntegrityError as error:
        raise SessionFailed(f"the delta summary changed after it was written: {error}") from None
    if checked.manifest != bundle.manifest:
        raise SessionFailed(f"the delta summary in {folder} changed after it was written")
    ctx.ledger.record_laplace(
        session_id=ctx.session_id,
        round_index=SUMMARY_ROUND,
        round_name=SUMMARY_ROUND_NAME,
        epsilon=checked.epsilon,
        manifest_sha256=SummaryBundle.manifest_sha256(folder),
        payload_sha256=checked.values_sha256,
        statistics=[str(s["name"]) for s in checked.statistics],
    )
    ctx.say(f"delta summary approved by {approval.reviewer}; it may leave the TRE")
    return folder
