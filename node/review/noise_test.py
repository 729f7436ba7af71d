"""Does the egress carry noise of the declared scale? A χ² test against the audit record.

``OUT/audit/round-<r>/`` (node/egress/audit.py) holds the node's un-noised payload,
so d = egress − audit (modulo 2^64, read as signed, decoded) is exactly the
noise the node added: its mask plus residual noise. Under the declared
design every entry of tensor t is an independent N(0, σ_t²) draw (σ_t the
outsider std of the manifest), so

    Q_t = Σ_i (d_i / σ_t)²  ~  χ²(k_t)      (k_t entries of tensor t)

and the pooled Q = Σ_t Q_t ~ χ²(Σ k_t). Each statistic is tested two-sided:
too small means less noise than declared (an un-noised release gives Q = 0;
half the declared σ gives Q ≈ k/4), too large means more — or the audit
record is not this egress's. The m = (tensors + 1) tests share the
false-alarm rate :data:`FALSE_ALARM_RATE` by Bonferroni's inequality, so a
bundle whose noise is exactly as declared fails with probability at most
1e-6. A scalar tensor alone cannot tell half the noise from chance; the
pooled test over every entry can once there are about a hundred entries:
half the noise gives Q ≈ k/4, and with three tensors (m = 4) the lower end of
the acceptance interval is 9.4 for k = 40 and 43.2 for k = 100; for the
brain-age round with P = 40 (945 entries, nine tensors) it is 731.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
from scipy.special import gammainccinv, gammaincinv

from node.egress.audit import AuditRecord, read_audit
from node.egress.bundle import EgressBundle, EgressError
from node.review.findings import Finding, fail, passed
from noise.fixed_point import FixedPointCodec

__all__ = ["FALSE_ALARM_RATE", "NoiseTest", "audit_record", "noise_findings", "noise_tests"]

FALSE_ALARM_RATE: Final = 1e-6


@dataclass(frozen=True)
class NoiseTest:
    """One χ² test: the statistic, its degrees of freedom and the acceptance interval."""

    name: str
    entries: int
    statistic: float
    low: float
    high: float
    empirical_std: float
    declared_sigma: float

    @property
    def passed(self) -> bool:
        return self.low <= self.statistic <= self.high

    @property
    def ratio(self) -> float:
        """Found over declared std (about 1 when the declared noise is there)."""
        return self.empirical_std / self.declared_sigma if self.declared_sigma > 0 else 0.0


def audit_record(path: Path, round_index: int) -> AuditRecord:
    """The audit record at ``path``: the round's folder ``OUT/audit/round-<r>/`` or ``OUT``."""
    path = Path(path)
    if (path / "audit.json").is_file():
        if path.name != f"round-{round_index}":
            raise EgressError(f"{path} is the audit folder of {path.name}, not round-{round_index}")
        return read_audit(path.parent.parent, round_index)
    return read_audit(path, round_index)


def noise_tests(bundle: EgressBundle, record: AuditRecord) -> tuple[NoiseTest, ...]:
    """Per-tensor tests, then the pooled one (named "all tensors")."""
    noise = FixedPointCodec(bundle.fixed_point_bits).decode(bundle.payload - record.payload)
    tested = [t for t in bundle.tensors if t.sigma > 0 and t.size > 0]
    alpha = FALSE_ALARM_RATE / (len(tested) + 1)
    tests = []
    total_q = 0.0
    total_k = 0
    for t in tested:
        part = noise[t.offset : t.offset + t.size]
        q = float(np.sum((part / t.sigma) ** 2))
        rms = float(np.sqrt(np.mean(part * part)))
        total_q += q
        total_k += t.size
        tests.append(_test(t.name, t.size, q, alpha, rms=rms, sigma=t.sigma))
    if total_k:
        pooled_sigma = float(
            np.sqrt(np.mean(np.concatenate([np.full(t.size, t.sigma**2) for t in tested])))
        )
        pooled_rms = float(
            np.sqrt(
                np.mean(np.concatenate([noise[t.offset : t.offset + t.size] for t in tested]) ** 2)
            )
        )
        tests.append(
            _test("all tensors", total_k, total_q, alpha, rms=pooled_rms, sigma=pooled_sigma)
        )
    return tuple(tests)


def _test(name: str, k: int, q: float, alpha: float, *, rms: float, sigma: float) -> NoiseTest:
    # χ²_k quantiles as 2 × those of Gamma(k/2, 1), through the regularised incomplete
    # gamma function: the same numbers as scipy.stats.chi2, without importing scipy.stats.
    return NoiseTest(
        name=name,
        entries=k,
        statistic=q,
        low=2.0 * float(gammaincinv(k / 2, alpha / 2)),
        high=2.0 * float(gammainccinv(k / 2, alpha / 2)),
        empirical_std=rms,
        declared_sigma=sigma,
    )


def noise_findings(bundle: EgressBundle, record: AuditRecord) -> list[Finding]:
    """The audit checks as findings: the record is this egress's, and the noise is there."""
    mine = (bundle.session_id, bundle.round_index, bundle.node_id)
    theirs = (record.session_id, record.round_index, record.node_id)
    if mine != theirs:
        return [
            fail(
                "noise",
                f"the audit record is of session {record.session_id}, round "
                f"{record.round_index}, node {record.node_id!r}, not this bundle's",
            )
        ]
    if record.egress_payload_sha256 and record.egress_payload_sha256 != bundle.payload_sha256:
        return [fail("noise", "the audit record was written for another egress payload")]
    if record.fixed_point_bits != bundle.fixed_point_bits or record.payload.size != (
        bundle.payload.size
    ):
        return [fail("noise", "the audit record's layout or fixed-point scale is not the egress's")]
    findings: list[Finding] = []
    codec = FixedPointCodec(bundle.fixed_point_bits)
    difference = codec.decode(bundle.payload - record.payload)
    for t in bundle.tensors:
        part = difference[t.offset : t.offset + t.size]
        if t.size and t.sigma > 0 and not np.any(part):
            findings.append(
                fail(
                    "noise",
                    f"{t.name}: the egress equals the audit record — released without noise "
                    f"(declared σ = {t.sigma:.4g})",
                )
            )
        elif t.sigma == 0 and np.any(part):
            findings.append(fail("noise", f"{t.name}: declares σ = 0 but differs from the audit"))
    rate = f"two-sided χ² test, false-alarm rate {FALSE_ALARM_RATE:g} for the whole bundle"
    for test in noise_tests(bundle, record):
        if test.passed:
            continue
        side = "less" if test.statistic < test.low else "more"
        findings.append(
            fail(
                "noise",
                f"{test.name}: {side} noise than declared — egress − audit has std "
                f"{test.empirical_std:.4g} against σ = {test.declared_sigma:.4g} "
                f"(ratio {test.ratio:.3f}); χ² = {test.statistic:.4g} on {test.entries} entries, "
                f"outside [{test.low:.4g}, {test.high:.4g}] ({rate})",
            )
        )
    if not findings:
        tests = noise_tests(bundle, record)
        pooled = tests[-1] if tests else None
        ratio = f"; found/declared std {pooled.ratio:.3f} over all entries" if pooled else ""
        findings.append(
            passed(
                "noise",
                f"every tensor carries noise of its declared scale ({rate}){ratio}",
            )
        )
    return findings
