"""One review of one egress bundle: every check run, gathered with the facts to show.

:func:`review_bundle` is read-only. It runs the checks of
``node.review.checks`` (files, integrity, schema against the federation
config, SDC thresholds, ε recomputed against the receipt and the caps), the
χ² noise test of ``node.review.noise_test`` when an audit record is given,
and classifies the folder's ``approval.json`` (``node.review.decision``).
The :class:`Review` it returns holds the findings and what the renderers
(``node.review.render``) print; its exit code is 0 pass, 1 needs a human
look, 2 fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.egress.audit import AuditRecord
from node.egress.bundle import EgressBundle, EgressError, EgressIntegrityError
from node.review.checks import (
    GuaranteeFigures,
    check_config,
    check_files,
    check_privacy,
    check_sdc,
    guarantee,
)
from node.review.clipping import ClippingTable, check_clipping, clipping_table
from node.review.decision import (
    DecisionState,
    ReviewKeyError,
    checker_keys,
    current_decision,
    decision_finding,
    federation_for,
)
from node.review.findings import Finding, exit_code, fail, note, passed
from node.review.noise_test import NoiseTest, audit_record, noise_findings, noise_tests
from node.review.sdc import ACRO_DEFAULTS, SDCThresholds
from node.review.units import TensorView, real_units
from proto.federation import FederationConfig

__all__ = ["Review", "review_bundle"]


@dataclass(frozen=True)
class Review:
    """Everything one review found and what its report shows."""

    folder: Path
    findings: tuple[Finding, ...]
    bundle: EgressBundle | None = None
    config: FederationConfig | None = None
    config_path: Path | None = None
    thresholds: SDCThresholds = ACRO_DEFAULTS
    figures: GuaranteeFigures | None = None
    record: AuditRecord | None = None
    noise: tuple[NoiseTest, ...] = ()
    decision: DecisionState = field(default_factory=lambda: DecisionState("none"))
    keys: Mapping[bytes, str] = field(default_factory=dict)
    views: tuple[TensorView, ...] = ()
    clipping: ClippingTable | None = None  # by feature name, with an audit record

    @property
    def clipped(self) -> Mapping[str, int] | None:
        """Values clipped to the public bounds, from the audit record (None without one)."""
        return None if self.record is None else self.record.clipped

    @property
    def exit_code(self) -> int:
        return exit_code(self.findings)

    @property
    def verdict(self) -> str:
        return ("pass", "needs a human look", "fail")[self.exit_code]

    def findings_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.findings]


def _bundle(folder: Path, findings: list[Finding]) -> EgressBundle | None:
    try:
        bundle = EgressBundle.verify(folder)
    except EgressIntegrityError as error:
        findings.extend(fail("integrity", problem) for problem in error.problems)
    else:
        findings.append(
            passed(
                "integrity",
                "SHA-256 of every file matches the manifest and checksums/; values.csv decodes "
                "to the payload bit for bit; results.json follows ACRO's schema",
            )
        )
        return bundle
    try:
        return EgressBundle.read(folder)
    except (EgressError, ValueError, OSError):
        return None


def review_bundle(
    folder: Path,
    *,
    federation: Path | None = None,
    thresholds: SDCThresholds = ACRO_DEFAULTS,
    audit: Path | None = None,
) -> Review:
    """Run every check on the bundle in ``folder``; nothing is written."""
    folder = Path(folder)
    findings = check_files(folder)
    bundle = _bundle(folder, findings)
    if bundle is None:
        findings.append(
            fail("schema", "the manifest or payload cannot be read; nothing else could be checked")
        )
        return Review(folder, tuple(findings), thresholds=thresholds)
    config: FederationConfig | None = None
    config_path: Path | None = None
    try:
        found = federation_for(folder, bundle, federation)
    except ReviewKeyError as error:
        findings.append(fail("config", str(error)))
        found = None
    else:
        if found is not None:
            config, config_path = found
    if found is not None or not any(f.check == "config" for f in findings):
        findings += check_config(bundle, config)
    findings += check_sdc(bundle, thresholds, config)
    findings += check_privacy(bundle, config)
    record: AuditRecord | None = None
    tests: tuple[NoiseTest, ...] = ()
    if audit is not None:
        try:
            record = audit_record(audit, bundle.round_index)
        except (EgressError, ValueError, OSError, KeyError) as error:
            findings.append(fail("noise", f"the audit record {audit} cannot be used: {error}"))
        else:
            findings += noise_findings(bundle, record)
            if not [f for f in findings if f.check == "noise" and "audit record" in f.message]:
                tests = noise_tests(bundle, record)
    findings += check_clipping(bundle, config, record)
    if bundle.approval_mode == "auto":
        findings.append(
            note(
                "approval",
                "the node was run with --approve auto: it released this bundle without waiting "
                "for an output checker's decision",
            )
        )
    keys = checker_keys(config, bundle.node_id) if config is not None else {}
    decision = current_decision(folder, keys) if config is not None else DecisionState("none")
    findings.append(decision_finding(decision, config, bundle.node_id))
    return Review(
        folder,
        tuple(findings),
        bundle=bundle,
        config=config,
        config_path=config_path,
        thresholds=thresholds,
        figures=guarantee(bundle),
        record=record,
        noise=tests,
        decision=decision,
        keys=keys,
        views=real_units(bundle, config),
        clipping=clipping_table(bundle, config, record),
    )
