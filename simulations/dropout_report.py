"""The dropout scenario's section of ``report.md``: what the table shows and the table."""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulations.config import SimConfig
from simulations.dropout_summary import DropoutSummary, GroupKey

__all__ = ["dropout_section", "dropout_table"]


def _eps(value: float) -> str:
    if math.isnan(value):
        return "—"
    return "∞" if math.isinf(value) else f"{value:.3g}"


def _variance(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3g}"


def _fraction(summary: DropoutSummary | None) -> str:
    if summary is None or not summary.rounds:
        return "—"
    lo, hi = summary.infeasible_interval
    return f"{summary.infeasible_fraction:.2f} [{lo:.2f}, {hi:.2f}]"


def dropout_table(summaries: Sequence[DropoutSummary]) -> str:
    """One line per (graph, K, T, r): zero-sum against independent noise."""
    by_point: dict[GroupKey, dict[str, DropoutSummary]] = {}
    for s in summaries:
        by_point.setdefault(s.key, {})[s.scheme] = s
    header = [
        "graph",
        "K",
        "T",
        "r",
        "dropped (mean)",
        "infeasible: zerosum [95% CI]",
        "zerosum+residual",
        "strict rule",
        "ε vs outsider (worst)",
        "ε vs outsider + T: median finished round",
        "worst round",
        "below target vs T (share)",
        "aggregate var: +residual",
        "independent",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for key, schemes in sorted(by_point.items()):
        zs = schemes.get("zerosum")
        res = schemes.get("zerosum+residual")
        ind = schemes.get("independent")
        first = zs or res or ind
        assert first is not None
        lines.append(
            "| "
            + " | ".join(
                [
                    key.graph_label,
                    str(key.n_nodes),
                    str(key.collusion_threshold),
                    f"{key.dropout_rate:.0%}",
                    f"{first.mean_dropped:.3g}",
                    _fraction(zs),
                    _fraction(res),
                    f"{zs.infeasible_strict_fraction:.2f}" if zs else "—",
                    _eps(zs.epsilon_outsider_worst) if zs else "—",
                    _eps(zs.epsilon_coalition_finished) if zs else "—",
                    _eps(zs.epsilon_coalition_worst) if zs else "—",
                    f"{zs.exposed_fraction:.3g}" if zs else "—",
                    _variance(res.aggregate_noise_var) if res else "—",
                    _variance(ind.aggregate_noise_var) if ind else "—",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def dropout_section(
    summaries: Sequence[DropoutSummary], config: SimConfig, figure: str
) -> list[str]:
    """Markdown lines: the model, the figure and the table."""
    d = config.dropout
    return [
        "## Dropouts at scale",
        "",
        f"Each round plans the design over all K nodes (per-egress ε = {d.epsilon:g}, "
        f"δ = {d.delta:g}, collusion threshold T); every node drops before uploading with "
        "probability r; the survivors reveal their pair terms with the dropped nodes and "
        "refuse when the noise left on their egress would fall below the per-egress target "
        "(the live floor check), which ends the round infeasible; fewer than 2 survivors "
        f"also end it. {d.reps} rounds per point. 'ε vs outsider' is the worst survivor's ε "
        "against an observer who holds its egress and the revealed pair terms; 'vs outsider "
        "+ T' adds the T survivors that share the largest pair terms with it, as the median "
        "over the rounds that finished of the worst survivor, and the worst over all rounds "
        "(a survivor that refused revealed nothing and keeps the design's guarantee). "
        "Aggregate variance: in units of one egress's target variance, over finished "
        "rounds (zerosum: exactly 0). Independent noise: never infeasible, ε at the target "
        "for every observer, aggregate variance = survivors. 'Strict rule': the fraction "
        "of rounds that would end if every survivor also required the floor against the "
        "dropped nodes and T colluding survivors together (no live node applies it).",
        "",
        figure,
        dropout_table(summaries),
        "",
    ]
