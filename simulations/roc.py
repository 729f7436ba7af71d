"""Operating points of a membership test and the bounds differential privacy puts on them.

A test that says "member" when its score exceeds a threshold has a false
positive rate α (on non-members) and a true positive rate β (on members).
Differential privacy bounds β for every α:

* μ-GDP: β ≤ Φ(Φ⁻¹(α) + μ), the tradeoff function of two unit Gaussians μ
  apart, and AUC ≤ Φ(μ/√2) (Dong, Roth & Su 2022, JRSS-B);
* (ε, δ)-DP: β ≤ min(e^ε α + δ, 1 − e^{−ε}(1 − δ − α)) (Kairouz, Oh &
  Viswanath 2015, ICML, Theorem 2.1).

Empirical rates come with exact Clopper–Pearson intervals (Clopper & Pearson
1934, Biometrika) and the AUC with the Hanley–McNeil (1982, Radiology)
standard error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtr, ndtri
from scipy.stats import beta as beta_distribution
from scipy.stats import rankdata

__all__ = [
    "CONFIDENCE",
    "FPR_LEVELS",
    "RocSummary",
    "clopper_pearson",
    "dp_tpr_bound",
    "gdp_tpr_bound",
    "roc_summary",
]

FloatArray = NDArray[np.float64]

FPR_LEVELS = (0.01, 0.1)
CONFIDENCE = 0.999


def gdp_tpr_bound(fpr: float, mu: float) -> float:
    """Largest TPR at this FPR for any test against a μ-GDP mechanism: Φ(Φ⁻¹(α) + μ)."""
    if math.isinf(mu):
        return 1.0
    if fpr <= 0.0:
        return 0.0
    if fpr >= 1.0:
        return 1.0
    return float(ndtr(ndtri(fpr) + mu))


def dp_tpr_bound(fpr: float, epsilon: float, delta: float) -> float:
    """Largest TPR at this FPR under (ε, δ)-DP: min(1, e^ε α + δ, 1 − e^{−ε}(1 − δ − α))."""
    if math.isinf(epsilon):
        return 1.0
    first = math.exp(epsilon) * fpr + delta
    second = 1.0 - math.exp(-epsilon) * (1.0 - delta - fpr)
    return float(min(1.0, first, second))


@dataclass(frozen=True)
class RocSummary:
    """Empirical operating points, AUC and their sampling intervals."""

    fpr: tuple[float, ...]
    tpr: tuple[float, ...]
    fpr_hi: tuple[float, ...]
    tpr_lo: tuple[float, ...]
    tpr_hi: tuple[float, ...]
    auc: float
    auc_lo: float
    auc_hi: float
    advantage: float


def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0
    lo = (
        0.0
        if successes == 0
        else float(beta_distribution.ppf(tail, successes, trials - successes + 1))
    )
    hi = (
        1.0
        if successes == trials
        else float(beta_distribution.ppf(1 - tail, successes + 1, trials - successes))
    )
    return lo, hi


def roc_summary(
    null: FloatArray, member: FloatArray, levels: tuple[float, ...] = FPR_LEVELS
) -> RocSummary:
    """Operating points at nominal FPR ``levels`` (thresholds from the null scores) and AUC.

    The threshold for level α is the (1 − α) quantile of the null scores and
    the test says "member" when the score is strictly above it, so the
    realised FPR is at most α. AUC counts ties as one half; its interval uses
    the Hanley–McNeil (1982) standard error.
    """
    n0, n1 = null.size, member.size
    fprs, tprs, fhis, tlos, this = [], [], [], [], []
    for level in levels:
        threshold = float(np.quantile(null, 1.0 - level, method="higher"))
        false_pos = int(np.count_nonzero(null > threshold))
        true_pos = int(np.count_nonzero(member > threshold))
        fprs.append(false_pos / n0)
        tprs.append(true_pos / n1)
        fhis.append(clopper_pearson(false_pos, n0, CONFIDENCE)[1])
        lo, hi = clopper_pearson(true_pos, n1, CONFIDENCE)
        tlos.append(lo)
        this.append(hi)
    ranks = rankdata(np.concatenate([null, member]))
    auc = float((ranks[n0:].sum() - n1 * (n1 + 1) / 2.0) / (n0 * n1))
    q1, q2 = auc / (2.0 - auc), 2.0 * auc * auc / (1.0 + auc)
    se = math.sqrt(
        max(auc * (1 - auc) + (n1 - 1) * (q1 - auc * auc) + (n0 - 1) * (q2 - auc * auc), 0.0)
        / (n0 * n1)
    )
    z = float(ndtri(0.5 + CONFIDENCE / 2.0))
    scores = np.sort(np.concatenate([null, member]))
    null_sorted, member_sorted = np.sort(null), np.sort(member)
    fpr_curve = 1.0 - np.searchsorted(null_sorted, scores, side="right") / n0
    tpr_curve = 1.0 - np.searchsorted(member_sorted, scores, side="right") / n1
    advantage = float(max(np.max(tpr_curve - fpr_curve), 0.0))
    return RocSummary(
        fpr=tuple(fprs),
        tpr=tuple(tprs),
        fpr_hi=tuple(fhis),
        tpr_lo=tuple(tlos),
        tpr_hi=tuple(this),
        auc=auc,
        auc_lo=max(0.0, auc - z * se),
        auc_hi=min(1.0, auc + z * se),
        advantage=advantage,
    )
