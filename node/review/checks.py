"""The checks of a review that need only the bundle and the federation config.

* ``files``: every file the bundle lists is there, with a checksum record in
  ``checksums/`` (as ACRO writes them), and nothing else is in the folder
  (an unlisted file would leave with the bundle unreviewed);
* ``integrity`` and ``schema``: :meth:`node.egress.EgressBundle.verify` —
  SHA-256 of every file against the manifest and ``checksums/``, the payload's
  word digest, ``values.csv`` decoding to the payload bit for bit,
  ``results.json`` in ACRO's schema; then the round's layout, node and
  fixed-point scale against the federation config, and (for the brain-age
  plan) each declared sensitivity against the one derived from the public
  bounds;
* ``sdc``: N against ACRO's ``safe_threshold`` and the config's
  ``min_cohort_size``, the residual degrees of freedom against
  ``safe_dof_threshold`` (node/review/sdc.py);
* ``privacy``: every ε recomputed from the declared σ and sensitivity (below)
  and compared with the receipt and the config's caps.

ε from σ and Δ. Tensor t carries independent N(0, σ_t²) noise on each entry
as an outsider sees one egress (√(R_kk + σ_res²), node/egress/receipt.py), and one
subject moves it by at most Δ_t in L2, so the release is μ-GDP with
μ = √(Σ_t (Δ_t/σ_t)²) (Gaussian mechanism and GDP composition, Dong, Roth &
Su 2022, Corollaries 2.13 and 3.3), and (ε, δ)-DP with ε from the exact
tradeoff (Balle & Wang 2018; ``noise.accounting.gaussian_epsilon``). Against
an outsider who also holds the pairwise seeds of T colluding nodes the
per-entry std left is the tensor's ``coalition_sigma[T-1]``; that is the
figure the federation's ε cap is calibrated for (the *configured guarantee*).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from node.egress.bundle import (
    APPROVAL,
    CHECKSUMS,
    MANIFEST,
    PAYLOAD,
    RESULTS,
    VALUES,
    EgressBundle,
)
from node.review.findings import Finding, fail, look, note, passed
from node.review.sdc import SDCThresholds
from noise.accounting import compose_mu, gaussian_epsilon
from proto.federation import ConfigError, FederationConfig

__all__ = [
    "LISTED",
    "GuaranteeFigures",
    "check_config",
    "check_files",
    "check_privacy",
    "check_sdc",
    "guarantee",
]

LISTED = (MANIFEST, PAYLOAD, VALUES, RESULTS)
# Relative agreement asked of a recomputed μ or ε with the receipt's figure:
# both come from the same float64 formulas, so anything looser is a real change.
_RTOL = 1e-6


def check_files(folder: Path, *, listed: Sequence[str] = LISTED) -> list[Finding]:
    """Listed files present with checksum records; no unlisted file anywhere in the folder.

    ``listed``: the bundle's files (a round's egress by default; a delta
    summary lists its own).
    """
    findings: list[Finding] = []
    for name in listed:
        if not (folder / name).is_file():
            findings.append(fail("files", f"{name} is missing"))
        elif not (folder / CHECKSUMS / f"{name}.txt").is_file():
            findings.append(fail("files", f"{CHECKSUMS}/{name}.txt is missing (ACRO checksum)"))
    allowed = {*listed, APPROVAL, *(f"{CHECKSUMS}/{name}.txt" for name in listed)}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_dir() and relative == CHECKSUMS:
            continue
        if relative not in allowed:
            findings.append(
                fail(
                    "files",
                    f"{relative} is not part of the bundle (unlisted; it would leave unreviewed)",
                )
            )
    if not findings:
        findings.append(passed("files", "every listed file is present, and nothing else"))
    return findings


def check_config(bundle: EgressBundle, config: FederationConfig | None) -> list[Finding]:
    """The bundle's round, layout, node and scale are the ones the federation config fixes."""
    if config is None:
        return [
            look(
                "config",
                "no federation config: the layout, the ε caps and the checker keys are not "
                "checked (pass --federation)",
            )
        ]
    findings: list[Finding] = []
    if bundle.round_name not in config.plan.round_names:
        findings.append(
            fail(
                "schema",
                f"round {bundle.round_name!r} is not a round of plan {config.plan.name!r} "
                f"({', '.join(config.plan.round_names)})",
            )
        )
    elif config.plan.round(bundle.round_name).layout != bundle.layout:
        findings.append(
            fail(
                "schema",
                f"the tensors of round {bundle.round_name!r} differ from the config's public "
                "layout",
            )
        )
    if bundle.fixed_point_bits != config.fixed_point_bits:
        findings.append(
            fail(
                "schema",
                f"fixed_point_bits is {bundle.fixed_point_bits}, the config says "
                f"{config.fixed_point_bits}",
            )
        )
    if bundle.masking.n_nodes > len(config.nodes):
        findings.append(
            fail(
                "schema",
                f"the masking declares {bundle.masking.n_nodes} nodes, the federation has "
                f"{len(config.nodes)}",
            )
        )
    threshold = config.privacy.collusion_threshold
    if bundle.masking.construction == "cape":
        if bundle.masking.collusion_threshold != threshold:
            findings.append(
                note(
                    "schema",
                    "CAPE masking declares no collusion profile (its noise is drawn by each "
                    "node, not from pairwise seeds), so its guarantee is stated against an "
                    "outsider",
                )
            )
    elif bundle.masking.collusion_threshold != threshold:
        findings.append(
            fail(
                "schema",
                f"the masking declares collusion threshold {bundle.masking.collusion_threshold}, "
                f"the config says {threshold}",
            )
        )
    findings += _sensitivities(bundle, config)
    if not [f for f in findings if f.level != "note"]:
        findings.insert(
            0, passed("schema", "round, layout, fixed-point scale and masking match the config")
        )
    return findings


def _sensitivities(bundle: EgressBundle, config: FederationConfig) -> list[Finding]:
    """Declared Δ against the installed plan's derivation from the public bounds.

    A Δ below the plan's would make the recomputed ε look smaller than it is,
    so when the config's plan is installed here (its ``public_sensitivities``)
    every declared sensitivity must be at least the derived one.
    """
    if bundle.round_name not in config.plan.round_names:
        return []
    from node.plans.registry import installed_plans

    try:
        plans = installed_plans()
    except ConfigError as error:
        return [look("privacy", f"the installed plans cannot be listed: {error}")]
    definition = plans.get(config.plan.name)
    if definition is None:
        return [
            note(
                "privacy",
                f"plan {config.plan.name!r} is not installed here, so its sensitivities were not "
                "derived independently of the bundle",
            )
        ]
    try:
        derived = {
            s.name: s.sensitivity
            for s in definition.public_sensitivities(config, bundle.round_name)
        }
    except (ConfigError, ValueError, KeyError):
        return [look("privacy", "the plan's sensitivities could not be derived from the config")]
    findings = []
    for t in bundle.tensors:
        want = derived.get(t.name)
        if want is not None and t.sensitivity < want * (1 - _RTOL):
            findings.append(
                fail(
                    "privacy",
                    f"{t.name} declares sensitivity {t.sensitivity:.6g}, below the "
                    f"{want:.6g} the plan derives from the public bounds",
                )
            )
    return findings


def check_sdc(
    bundle: EgressBundle, thresholds: SDCThresholds, config: FederationConfig | None
) -> list[Finding]:
    """Minimum N and residual degrees of freedom."""
    findings: list[Finding] = []
    n = bundle.sdc.n_subjects
    where = f"(thresholds: {thresholds.source})"
    if n < thresholds.safe_threshold:
        findings.append(
            fail(
                "sdc",
                f"N = {n} subjects is below safe_threshold {thresholds.safe_threshold} {where}",
            )
        )
    if config is not None and n < config.min_cohort_size:
        findings.append(
            fail(
                "sdc",
                f"N = {n} subjects is below the federation's min_cohort_size "
                f"{config.min_cohort_size}",
            )
        )
    dof = bundle.sdc.residual_degrees_of_freedom
    if dof is not None and dof < thresholds.safe_dof_threshold:
        findings.append(
            fail(
                "sdc",
                f"residual degrees of freedom {dof} are below safe_dof_threshold "
                f"{thresholds.safe_dof_threshold} {where}",
            )
        )
    if not findings:
        dof_text = "" if dof is None else f", residual degrees of freedom {dof} >= "
        dof_text += "" if dof is None else str(thresholds.safe_dof_threshold)
        findings.append(
            passed(
                "sdc",
                f"N = {n} >= {thresholds.safe_threshold}{dof_text} {where}",
            )
        )
    return findings


class GuaranteeFigures:
    """μ and ε recomputed from the manifest's σ and Δ: outsider, and outsider with T nodes."""

    def __init__(self, bundle: EgressBundle) -> None:
        delta = bundle.dp.delta
        self.delta = delta
        self.threshold = bundle.masking.collusion_threshold
        self.outsider_mu = _mu([(t.sensitivity, t.sigma) for t in bundle.tensors])
        self.outsider_epsilon = gaussian_epsilon(self.outsider_mu, delta)
        if self.threshold == 0:
            self.guarantee_mu = self.outsider_mu
        else:
            pairs = []
            for t in bundle.tensors:
                left = (
                    t.coalition_sigma[self.threshold - 1]
                    if len(t.coalition_sigma) >= self.threshold
                    else math.nan
                )
                pairs.append((t.sensitivity, left))
            self.guarantee_mu = _mu(pairs)
        self.guarantee_epsilon = (
            math.nan
            if math.isnan(self.guarantee_mu)
            else gaussian_epsilon(self.guarantee_mu, delta)
        )

    @property
    def guarantee_label(self) -> str:
        if self.threshold == 0:
            return "an outsider"
        return f"an outsider holding the seeds of T = {self.threshold} colluding node(s)"


def guarantee(bundle: EgressBundle) -> GuaranteeFigures:
    return GuaranteeFigures(bundle)


def _mu(pairs: list[tuple[float, float]]) -> float:
    """√(Σ (Δ/σ)²); +inf when some Δ > 0 meets σ = 0; NaN when a σ is unknown."""
    terms = []
    for sensitivity, sigma in pairs:
        if math.isnan(sigma):
            return math.nan
        if sensitivity == 0:
            continue
        if sigma <= 0:
            return math.inf
        terms.append(sensitivity / sigma)
    return compose_mu(terms)


def _close(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=_RTOL, abs_tol=1e-12)


def check_privacy(bundle: EgressBundle, config: FederationConfig | None) -> list[Finding]:
    """Every ε recomputed from σ and Δ, against the receipt and the config's caps."""
    findings: list[Finding] = []
    figures = guarantee(bundle)
    try:
        receipt = bundle.dp.observer("outsider")
    except KeyError:
        return [fail("privacy", "the DP receipt has no row for an outsider")]
    if not _close(receipt.mu, figures.outsider_mu):
        findings.append(
            fail(
                "privacy",
                f"the receipt states outsider μ = {receipt.mu:.6g}, but the tensors' σ and "
                f"sensitivity give μ = {figures.outsider_mu:.6g}",
            )
        )
    if not _close(receipt.epsilon, figures.outsider_epsilon):
        findings.append(
            fail(
                "privacy",
                f"the receipt states outsider ε = {receipt.epsilon:.6g}, but σ and sensitivity "
                f"give ε = {figures.outsider_epsilon:.6g} at δ = {figures.delta:g}",
            )
        )
    if math.isnan(figures.guarantee_epsilon):
        findings.append(
            fail(
                "privacy",
                f"the tensors do not declare the noise left against T = {figures.threshold} "
                "colluding nodes (coalition_sigma)",
            )
        )
    for row in bundle.dp.release:
        if row.observer_class.sees_every_egress:
            findings.append(
                note(
                    "privacy",
                    f"ε against {row.observer_class.describe()} is "
                    f"{_number(row.epsilon)} (not recomputed: it depends on the whole round's "
                    "noise design, not on this bundle alone"
                    + (
                        "; the coordinator learns the exact aggregate without residual noise)"
                        if math.isinf(row.epsilon)
                        else ")"
                    ),
                )
            )
    if config is not None:
        findings += _caps(bundle, figures, config)
    if not [f for f in findings if f.level == "fail"]:
        findings.insert(
            0,
            passed(
                "privacy",
                f"outsider ε = {figures.outsider_epsilon:.4g} and ε against "
                f"{figures.guarantee_label} = {figures.guarantee_epsilon:.4g} at δ = "
                f"{figures.delta:g}, recomputed from σ and sensitivity, agree with the receipt"
                + (
                    f" and stay within the cap ε = {config.privacy.epsilon:g}"
                    if config is not None
                    else ""
                ),
            ),
        )
    return findings


def _caps(
    bundle: EgressBundle, figures: GuaranteeFigures, config: FederationConfig
) -> list[Finding]:
    privacy = config.privacy
    findings: list[Finding] = []
    cap = privacy.epsilon * (1 + _RTOL)
    for label, value in (
        ("an outsider", figures.outsider_epsilon),
        (figures.guarantee_label, figures.guarantee_epsilon),
    ):
        if value > cap:
            findings.append(
                fail(
                    "privacy",
                    f"ε against {label} is {value:.4g}, above the cap privacy.epsilon = "
                    f"{privacy.epsilon:g} per release",
                )
            )
    if bundle.dp.delta > privacy.delta * (1 + _RTOL):
        findings.append(
            fail(
                "privacy",
                f"δ = {bundle.dp.delta:g} is above the config's privacy.delta = {privacy.delta:g}",
            )
        )
    try:
        total = bundle.dp.observer("outsider", cumulative=True)
    except KeyError:
        findings.append(look("privacy", "the receipt has no cumulative outsider ε to check"))
        return findings
    if total.epsilon > privacy.epsilon_budget * (1 + _RTOL):
        findings.append(
            fail(
                "privacy",
                f"the ledger's cumulative outsider ε = {total.epsilon:.4g} is above the budget "
                f"privacy.epsilon_budget = {privacy.epsilon_budget:g}",
            )
        )
    if total.epsilon < figures.outsider_epsilon * (1 - _RTOL):
        findings.append(
            fail(
                "privacy",
                f"the cumulative outsider ε = {total.epsilon:.4g} is below this release's own "
                f"ε = {figures.outsider_epsilon:.4g}; the ledger totals cannot be right",
            )
        )
    return findings


def _number(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.4g}"
