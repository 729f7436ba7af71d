"""A review as text for the terminal, as JSON, and as a self-contained HTML page."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from node.review.findings import Finding
from node.review.noise_test import FALSE_ALARM_RATE
from node.review.report import Review

__all__ = ["review_html", "review_json", "review_text"]

_MARK = {"pass": "ok  ", "note": "note", "look": "LOOK", "fail": "FAIL"}
_APPROVAL_MODES = {
    "manual": "manual (the node sends it only with an output checker's signed approval.json)",
    "auto": "auto (the node released it without waiting for an output checker: demo or test use)",
    "": "not recorded (a bundle written before the mode was)",
}
# Entries of each tensor printed on a terminal unless every value is asked for.
_SHOWN = 3


def _num(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.4g}"


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _header(review: Review) -> list[str]:
    bundle = review.bundle
    if bundle is None:
        return [f"{review.folder}: not a readable egress bundle"]
    lines = [
        f"{review.folder}: session {bundle.session_id}, round {bundle.round_index} "
        f"({bundle.round_name!r}), node {bundle.node_id}",
        f"  {bundle.payload.size} values in fixed point with {bundle.fixed_point_bits} "
        f"fraction bits; masking: {bundle.masking.construction} ({bundle.masking.graph}), "
        f"{bundle.masking.n_nodes} nodes, collusion threshold "
        f"{bundle.masking.collusion_threshold}, residual noise "
        f"{'on' if bundle.masking.residual_dp else 'off'}",
        f"  SDC: {bundle.sdc.n_subjects} subjects"
        + (
            f", residual degrees of freedom {bundle.sdc.residual_degrees_of_freedom}"
            if bundle.sdc.residual_degrees_of_freedom is not None
            else ""
        ),
    ]
    mode = bundle.approval_mode
    lines.append(f"  approval mode: {_APPROVAL_MODES.get(mode, mode)}")
    if review.config_path is not None:
        lines.append(f"  federation config: {_shown(review.config_path)} (config hash matches)")
    return lines


def _tensors(review: Review, *, all_values: bool = False) -> list[str]:
    bundle = review.bundle
    if bundle is None:
        return []
    lines = ["", f"  {'tensor':<12} {'shape':<14} {'noise σ':>12} {'sensitivity':>12}"]
    for t in bundle.tensors:
        shape = "×".join(str(n) for n in t.shape) or "scalar"
        lines.append(f"  {t.name:<12} {shape:<14} {t.sigma:>12.4g} {t.sensitivity:>12.4g}")
    lines += ["", "  released values (as sent, and in real units):"]
    for view in review.views:
        lines.append(f"    {view.name}: {view.meaning}")
        shown = view.rows if all_values else view.rows[:_SHOWN]
        for row in shown:
            real = "" if row.real is None else f"  = {row.real:.6g} {row.unit}"
            lines.append(f"      {row.label:<28} sent {row.scaled:>14.6g}{real}")
        if len(shown) < len(view.rows):
            lines.append(
                f"      … {len(view.rows) - len(shown)} more (--values, --json or --html list all)"
            )
    if review.clipping is not None:
        lines += ["  " + line for line in review.clipping.lines()]
    else:
        lines.append("  " + _clipped_line(review))
    return lines


def _clipped_line(review: Review) -> str:
    clipped = review.clipped
    if clipped is None:
        return (
            "clipped to the public bounds: not in the bundle (the counts stay in the TRE's "
            "audit record; pass --audit to see them)"
        )
    listed = ", ".join(f"{name} {count}" for name, count in clipped.items()) or "none recorded"
    return f"clipped to the public bounds (audit record): {listed}"


def _receipt(review: Review) -> list[str]:
    bundle = review.bundle
    if bundle is None:
        return []
    lines = ["", f"  DP receipt ({bundle.dp.mechanism}, δ = {bundle.dp.delta:g}):"]
    if bundle.dp.sampler:
        lines.append(
            f"    drawn by: {bundle.dp.sampler}; δ_sampler = {bundle.dp.delta_sampler:g}, "
            f"δ_discretisation = {bundle.dp.delta_discretisation:.2g} (added to δ for one egress)"
        )
    totals = {(t.observer, t.coalition_size): t for t in bundle.dp.cumulative}
    for release in bundle.dp.release:
        who = release.observer + (f" + {release.coalition_size}" if release.coalition_size else "")
        line = f"    {who:<24} this release ε = {_num(release.epsilon)}"
        total = totals.get((release.observer, release.coalition_size))
        if total is not None:
            line += (
                f"; with the ledger's {bundle.dp.releases_in_ledger} release(s) "
                f"ε = {_num(total.epsilon)}"
            )
        lines.append(line)
    figures = review.figures
    if figures is not None:
        cap = (
            f"configured guarantee ε ≤ {review.config.privacy.epsilon:g} per release against "
            f"{figures.guarantee_label}"
            if review.config is not None
            else f"configured guarantee unknown (no federation config) against "
            f"{figures.guarantee_label}"
        )
        lines.append(
            f"    {cap}; this release: ε = {_num(figures.guarantee_epsilon)} against that "
            f"observer, ε = {_num(figures.outsider_epsilon)} against an outsider"
        )
    for line in bundle.sdc.notes:
        lines.append(f"  note: {line}")
    return lines


def _noise(review: Review) -> list[str]:
    if not review.noise:
        return []
    lines = [
        "",
        f"  noise against the audit record (two-sided χ², false-alarm rate {FALSE_ALARM_RATE:g}):",
        f"    {'tensor':<12} {'entries':>8} {'found std':>12} {'declared σ':>12} {'ratio':>7}",
    ]
    for test in review.noise:
        lines.append(
            f"    {test.name:<12} {test.entries:>8} {test.empirical_std:>12.4g} "
            f"{test.declared_sigma:>12.4g} {test.ratio:>7.3f}" + ("" if test.passed else "  FAIL")
        )
    return lines


def _finding_line(finding: Finding) -> str:
    return f"  [{_MARK[finding.level]}] {finding.check}: {finding.message}"


def review_text(review: Review, *, all_values: bool = False) -> str:
    """The review for a terminal: the bundle, its figures, every finding, the verdict."""
    lines = (
        _header(review)
        + _tensors(review, all_values=all_values)
        + _receipt(review)
        + _noise(review)
    )
    lines += ["", "  checks:"]
    lines += [_finding_line(f) for f in review.findings]
    lines += ["", f"  verdict: {review.verdict} (exit {review.exit_code})"]
    return "\n".join(lines) + "\n"


def review_json(review: Review) -> dict[str, Any]:
    """The review as one JSON document (findings, figures, noise tests, verdict)."""
    bundle = review.bundle
    document: dict[str, Any] = {
        "format": "zerosum-review",
        "version": 1,
        "folder": str(review.folder),
        "verdict": review.verdict,
        "exit_code": review.exit_code,
        "findings": review.findings_json(),
        "sdc_thresholds": {
            "safe_threshold": review.thresholds.safe_threshold,
            "safe_dof_threshold": review.thresholds.safe_dof_threshold,
            "source": review.thresholds.source,
        },
    }
    if bundle is not None:
        document["bundle"] = {
            "session_id": bundle.session_id,
            "round_index": bundle.round_index,
            "round_name": bundle.round_name,
            "node_id": bundle.node_id,
            "n_subjects": bundle.sdc.n_subjects,
            "residual_degrees_of_freedom": bundle.sdc.residual_degrees_of_freedom,
            "tensors": [
                {
                    "name": t.name,
                    "shape": list(t.shape),
                    "sigma": t.sigma,
                    "sensitivity": t.sensitivity,
                }
                for t in bundle.tensors
            ],
            "values": [
                {
                    "tensor": view.name,
                    "meaning": view.meaning,
                    "entries": [
                        {"label": r.label, "sent": r.scaled, "real": r.real, "unit": r.unit}
                        for r in view.rows
                    ],
                }
                for view in review.views
            ],
            "clipped": None if review.clipped is None else dict(review.clipped),
            "clipping": None if review.clipping is None else review.clipping.to_json(),
            "approval_mode": bundle.approval_mode or None,
        }
    if review.figures is not None:
        figures = review.figures
        document["epsilon"] = {
            "delta": figures.delta,
            "outsider": _json_float(figures.outsider_epsilon),
            "guarantee": _json_float(figures.guarantee_epsilon),
            "guarantee_against": figures.guarantee_label,
            "cap": review.config.privacy.epsilon if review.config is not None else None,
        }
    if review.noise:
        document["noise_tests"] = {
            "false_alarm_rate": FALSE_ALARM_RATE,
            "tests": [
                {
                    "tensor": t.name,
                    "entries": t.entries,
                    "chi2": t.statistic,
                    "accept": [t.low, t.high],
                    "found_std": t.empirical_std,
                    "declared_sigma": t.declared_sigma,
                    "passed": t.passed,
                }
                for t in review.noise
            ],
        }
    return document


def _json_float(value: float) -> float | str | None:
    if math.isnan(value):
        return None
    return "inf" if math.isinf(value) else value


def review_html(review: Review) -> str:
    """A self-contained HTML page of the review (node.review.html_report)."""
    from node.review.html_report import review_html as page

    return page(review, _header(review) + _tensors(review, all_values=True) + _receipt(review))
