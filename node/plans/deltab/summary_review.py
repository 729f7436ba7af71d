"""The review of a delta-summary bundle (``summary_bundle``): the same verdicts, its checks.

:func:`review_summary` is read-only, like ``node.review.report.review_bundle``
for a round's egress, and gives the same exit codes (0 pass, 1 needs a human
look, 2 fail). Checks:

* ``files`` — the listed files with their ACRO checksum records, nothing else;
* ``integrity`` — every SHA-256 and ``values.csv`` against the manifest;
* ``config`` — the manifest's ε, delta range, bins, quantiles and N₀ are the
  federation's ``[plan.delta_summary]`` and ``min_cohort_size``;
* ``sdc`` — the bundle states only N ≥ N₀ (an exact N in it fails: not DP),
  at least the SDC minimum (ACRO's 10 by default); with ``--audit`` the exact
  N of the audit record as well;
* ``privacy`` — every sensitivity recomputed from the range and N₀, every
  scale as sensitivity/ε, the shares adding up to the release's ε, ε within
  the budget, and the receipt's composed totals within it;
* ``noise`` (with ``--audit``) — released values are not the exact ones, and
  the 2 + B Laplace draws (mean, second moment, B histogram counts) carry the
  declared scale: S = Σ|eᵢ|/bᵢ is Gamma(2 + B, 1) under the declared noise,
  and S outside its central 1 − 10⁻⁶ interval fails. With B = 30 that fails
  noise at a quarter of the declared scale with probability 0.99, and at half
  the scale about one time in twenty: a single summary holds few draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scipy.stats import gamma

from bounded.files import read_limited_text
from bounded.nesting import parse_json
from node.egress.budget import BUDGET_RTOL, checked
from node.errors import EgressIntegrityError
from node.plans.deltab.delta_summary import DeltaSummarySettings
from node.plans.deltab.settings import DeltabSettings
from node.plans.deltab.summary_bundle import (
    AUDIT,
    MANIFEST,
    RESULTS,
    VALUES,
    SummaryBundle,
)
from node.review.checks import check_files
from node.review.decision import (
    DecisionState,
    ReviewKeyError,
    checker_keys,
    current_decision,
    decision_finding,
    federation_for,
)
from node.review.findings import Finding, exit_code, fail, look, note, passed
from node.review.sdc import ACRO_DEFAULTS, SDCThresholds
from proto.federation import FederationConfig

__all__ = ["FALSE_ALARM_RATE", "SummaryReview", "review_summary", "summary_text"]

FALSE_ALARM_RATE = 1e-6
_LISTED = (MANIFEST, VALUES, RESULTS)
_RTOL = 1e-9


@dataclass(frozen=True)
class SummaryReview:
    """Everything one review of a delta summary found."""

    folder: Path
    findings: tuple[Finding, ...]
    bundle: SummaryBundle | None = None
    config: FederationConfig | None = None
    decision: DecisionState = field(default_factory=lambda: DecisionState("none"))
    keys: Mapping[bytes, str] = field(default_factory=dict)
    audit: Mapping[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return exit_code(self.findings)

    @property
    def verdict(self) -> str:
        return ("pass", "needs a human look", "fail")[self.exit_code]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_RTOL, abs_tol=1e-12)


def _config(manifest: Mapping[str, Any], config: FederationConfig) -> list[Finding]:
    declared = DeltabSettings.from_tables(config.plan.settings).delta_summary
    if declared is None or not declared.enabled:
        return [fail("config", "the federation config does not enable [plan.delta_summary]")]
    got = DeltaSummarySettings.from_table(
        {
            "epsilon": manifest["epsilon"],
            "delta_low": manifest["delta_range"][0],
            "delta_high": manifest["delta_range"][1],
            "bins": manifest["bins"],
            "quantiles": manifest["quantiles"],
        }
    )
    wrong = [
        f"{name} {mine!r} (the config says {theirs!r})"
        for name, mine, theirs in (
            ("ε", got.epsilon, declared.epsilon),
            (
                "delta range",
                (got.delta_low, got.delta_high),
                (declared.delta_low, declared.delta_high),
            ),
            ("bins", got.bins, declared.bins),
            ("quantiles", got.quantiles, declared.quantiles),
            ("N₀", manifest["n_floor"], config.min_cohort_size),
        )
        if mine != theirs
    ]
    if wrong:
        return [
            fail("config", "the bundle's settings are not the federation's: " + "; ".join(wrong))
        ]
    return [passed("config", "ε, delta range, bins, quantiles and N₀ are the federation's")]


def _sdc(
    manifest: Mapping[str, Any],
    thresholds: SDCThresholds,
    config: FederationConfig | None,
    record: Mapping[str, Any] | None,
) -> list[Finding]:
    """N against the SDC minimum: the manifest's public N ≥ N₀, the exact N from the audit.

    The bundle leaves the TRE whole, so it carries no exact N (not DP); with
    ``--audit`` the reviewer checks the exact N kept in the TRE as well.
    """
    sdc = manifest["sdc"]
    if isinstance(sdc.get("n_subjects"), int | float) and not isinstance(
        sdc.get("n_subjects"), bool
    ):
        return [fail("sdc", "the manifest holds the exact N, which is not DP; it must not leave")]
    floor = int(sdc["n_at_least"])
    need = max(
        thresholds.safe_threshold, config.min_cohort_size if config else 0, int(manifest["n_floor"])
    )
    if floor < need:
        return [fail("sdc", f"the bundle states N ≥ {floor}, below the minimum {need}")]
    if record is None:
        return [
            passed(
                "sdc",
                f"N ≥ {floor} (minimum {need}; {thresholds.source}); the exact N is in the "
                "audit record (--audit)",
            )
        ]
    if not isinstance(record.get("n_subjects"), int):
        return [look("sdc", f"N ≥ {floor}; the audit record holds no exact N to check")]
    n = int(record["n_subjects"])
    if n < need:
        return [fail("sdc", f"N = {n} subjects (audit record) is below the minimum {need}")]
    return [
        passed("sdc", f"N = {n} subjects in the audit record (minimum {need}; {thresholds.source})")
    ]


def _privacy(manifest: Mapping[str, Any], config: FederationConfig | None) -> list[Finding]:
    findings: list[Finding] = []
    low, high = (float(v) for v in manifest["delta_range"])
    width, n0, epsilon = high - low, int(manifest["n_floor"]), float(manifest["epsilon"])
    expected = {"mean": width / n0, "second_moment": width * width / (4 * n0), "histogram": 1.0}
    shares = 0.0
    for query in manifest["queries"]:
        name = query["name"]
        if name not in expected:
            findings.append(fail("privacy", f"query {name!r} is not one of the summary's"))
            continue
        shares += float(query["epsilon"])
        if not _close(float(query["sensitivity"]), expected[name]):
            findings.append(
                fail(
                    "privacy",
                    f"{name}: sensitivity {query['sensitivity']!r} is not {expected[name]!r} "
                    f"from the range [{low:g}, {high:g}] and N₀ = {n0}",
                )
            )
        grid = float(query.get("grid", 0.0) or 0.0)
        on_grid = float(query["sensitivity"])
        if grid > 0:  # the rounded value's sensitivity: ⌊Δ/g⌋ + 1 grid units (counts: Δ)
            units = on_grid / grid
            whole = units.is_integer() and grid == 1.0
            on_grid = (units if whole else math.floor(units) + 1) * grid
        recomputed = on_grid / float(query["scale"])
        if not _close(recomputed, float(query["epsilon"])):
            findings.append(
                fail(
                    "privacy",
                    f"{name}: sensitivity/scale gives ε = {recomputed:.6g}, but the receipt says "
                    f"{query['epsilon']!r}",
                )
            )
    if set(expected) - {q["name"] for q in manifest["queries"]}:
        findings.append(fail("privacy", "the manifest does not list all three noised queries"))
    if not _close(shares, epsilon):
        findings.append(fail("privacy", f"the queries' ε add up to {shares:.6g}, not {epsilon:g}"))
    if config is not None:
        budget = config.privacy.epsilon_budget
        for row in manifest["dp_receipt"]["totals_after"]:
            value = float(row["epsilon"])
            held = checked(str(row["observer"]), config.privacy.residual_dp)
            if held and value > budget * (1 + BUDGET_RTOL):
                findings.append(
                    fail(
                        "privacy",
                        f"the node's composed ε against {row['observer']} after this release "
                        f"is {value:.4g}, above the budget {budget:g}",
                    )
                )
    if not findings:
        findings.append(
            passed(
                "privacy",
                f"Laplace, ε = {epsilon:g}: every sensitivity and scale recomputed from the range "
                f"[{low:g}, {high:g}] and N₀ = {n0}; composed totals within the budget",
            )
        )
    return findings


def _audit(
    folder: Path, manifest: Mapping[str, Any]
) -> tuple[list[Finding], dict[str, Any] | None]:
    path = folder / AUDIT if (folder / AUDIT).is_file() else folder / "delta-summary" / AUDIT
    try:
        record = parse_json(
            read_limited_text(path, 4 << 20, what="audit record"), what=f"audit record {path}"
        )
    except (OSError, ValueError) as error:
        return [fail("noise", f"the audit record {path} cannot be read: {error}")], None
    if (record.get("session_id"), record.get("node_id")) != (
        manifest["session_id"],
        manifest["node_id"],
    ):
        return [fail("noise", "the audit record is of another session or node")], None
    released = {s["name"]: float(s["value"]) for s in manifest["statistics"]}
    exact = record["exact"]
    if all(_close(released[k], float(exact[k])) for k in ("mean", "second_moment")):
        return [
            fail("noise", "the released mean and second moment equal the exact ones: no noise")
        ], record
    scales = {q["name"]: float(q["scale"]) for q in manifest["queries"]}
    draws = [
        abs(released["mean"] - float(exact["mean"])) / scales["mean"],
        abs(released["second_moment"] - float(exact["second_moment"])) / scales["second_moment"],
        *(
            abs(float(a) - float(b)) / scales["histogram"]
            for a, b in zip(record["noised_histogram"], record["exact_histogram"], strict=True)
        ),
    ]
    k, s = len(draws), math.fsum(draws)
    lo, hi = float(gamma.ppf(FALSE_ALARM_RATE / 2, k)), float(gamma.isf(FALSE_ALARM_RATE / 2, k))
    text = (
        f"S = Σ|noise|/scale = {s:.4g} over {k} Laplace draws; the declared noise gives "
        f"Gamma({k}, 1), central interval [{lo:.4g}, {hi:.4g}] at false-alarm rate "
        f"{FALSE_ALARM_RATE:g}"
    )
    if s < lo:
        return [fail("noise", f"less noise than declared: {text}")], record
    if s > hi:
        return [look("noise", f"more noise than declared: {text}")], record
    findings = [passed("noise", text)]
    if record.get("clipped"):
        findings.append(
            note(
                "noise",
                f"{record['clipped']} deltas lay outside the declared range and were clipped",
            )
        )
    return findings, record


def review_summary(
    folder: Path,
    *,
    federation: Path | None = None,
    thresholds: SDCThresholds = ACRO_DEFAULTS,
    audit: Path | None = None,
) -> SummaryReview:
    """Run every check on the delta summary in ``folder``; nothing is written."""
    folder = Path(folder)
    findings = check_files(folder, listed=_LISTED)
    try:
        bundle: SummaryBundle | None = SummaryBundle.verify(folder)
    except EgressIntegrityError as error:
        findings.extend(fail("integrity", p) for p in error.problems)
        bundle = None
    else:
        findings.append(
            passed("integrity", "SHA-256 of every file matches the manifest and checksums/")
        )
    if bundle is None:
        return SummaryReview(folder, tuple(findings))
    manifest = bundle.manifest
    config: FederationConfig | None = None
    try:
        found = federation_for(folder, bundle, federation)
    except ReviewKeyError as error:
        findings.append(fail("config", str(error)))
        found = None
    if found is not None:
        config = found[0]
        findings += _config(manifest, config)
    record = None
    more: list[Finding] = []
    if audit is not None:
        more, record = _audit(Path(audit), manifest)
    findings += _sdc(manifest, thresholds, config, record)
    findings += _privacy(manifest, config)
    findings += more
    keys = checker_keys(config, bundle.node_id) if config is not None else {}
    decision = current_decision(folder, keys) if config is not None else DecisionState("none")
    findings.append(decision_finding(decision, config, bundle.node_id))
    return SummaryReview(folder, tuple(findings), bundle, config, decision, keys, record)


def summary_text(review: SummaryReview) -> str:
    """The review as a checker reads it: the released values with their meaning, then checks."""
    lines = [f"zerosum review: {review.folder} — delta summary", ""]
    bundle = review.bundle
    if bundle is not None:
        m = bundle.manifest
        lines += [
            f"  node {m['node_id']!r}, session {m['session_id']}, N ≥ {m['sdc']['n_at_least']}; "
            f"Laplace, ε = {m['epsilon']:g} (neighbours: {m['adjacency']})",
            f"  deltas clipped to the declared range [{m['delta_range'][0]:g}, "
            f"{m['delta_range'][1]:g}] years; N₀ = {m['n_floor']}",
            "",
            f"  {'statistic':<14}{'released':>10}{'exact':>10}  {'units':<7} meaning",
        ]
        exact = review.audit["exact"] if review.audit is not None else {}
        for s in m["statistics"]:
            shown = f"{exact[s['name']]:.4g}" if s["name"] in exact else "—"
            lines.append(
                f"  {s['name']:<14}{s['value']:>10.4g}{shown:>10}  {s['units']:<7} {s['meaning']}"
            )
        lines += ["", "  noise per query:"]
        for q in m["queries"]:
            lines.append(
                f"    {q['name']:<14} sensitivity {q['sensitivity']:.4g} ({q['derivation']}), "
                f"ε {q['epsilon']:.4g}, Laplace scale {q['scale']:.4g}"
            )
        lines += ["", "  the node's composed ε after this release:"]
        for row in m["dp_receipt"]["totals_after"]:
            lines.append(
                f"    {row['observer']:<14} ε {float(row['epsilon']):.4g}  "
                f"({row['releases']} releases)"
            )
    lines += ["", "  checks:"]
    marks = {"pass": "ok  ", "note": "note", "look": "LOOK", "fail": "FAIL"}
    lines += [f"    {marks[f.level]} {f.check:<10} {f.message}" for f in review.findings]
    lines += ["", f"  verdict: {review.verdict} (exit {review.exit_code})"]
    return "\n".join(lines) + "\n"
