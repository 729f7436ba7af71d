"""The one-release plan's public layout: rounds, tensor shapes, sensitivities, receipts.

Every quantity the pooled fit needs is a sum over subjects (see ``_solve``),
and in uint64 fixed point the aggregated sums are exact, so centring and
standardisation can follow aggregation (``uncentred``). Each node then sends,
once, its *uncentred* sums of clipped, pre-scaled values (x for the P
features, y for age, k for the C confounds, all in [-1, 1]; ``scaling``):

``"sums"``: n (), sum_x (P,), sum_xx (P(P+1)/2,), sum_xy (P,), sum_xy2 (P,),
sum_y (), sum_y2 (), sum_y3 (), sum_y4 (); with confounds also sum_c (C,),
sum_cc (C(C+1)/2,), sum_xc (P, C), sum_yc (C,), sum_y2c (C,). ``sum_xx`` and
``sum_cc`` are Σ x xᵀ and Σ k kᵀ as their packed upper triangle, row by row,
diagonal included (its diagonal is Σx²); ``sum_xc`` is Σ x kᵀ.

Missing feature values. With ``nan_policy="drop"`` each node leaves out its
subjects with any missing value, and complete data need nothing else: one
round, one release. With ``nan_policy="mean"`` a missing value is replaced by
the global mean m of the observed values. No node's release may depend on
that mean: it is a function of every node's exact first-round aggregate, so a
release computed from it would depend on each subject through the mean too,
beyond its declared sensitivity (docs/design.md §7.3). The imputation is
therefore applied after aggregation, like the centring. With o the indicator
of an observed value and x₀ the features with missing values set to 0, the
sums of the completed data x̃ = x₀ + (1 − o)∘m are

    Σx̃ = Σx₀ + m∘M           Σx̃x̃ᵀ = Σx₀x₀ᵀ + W diag(m) + diag(m) Wᵀ + diag(m) Q diag(m)
    Σx̃y = Σx₀y + m∘Σ(1−o)y   Σx̃y² = Σx₀y² + m∘Σ(1−o)y²   Σx̃kᵀ = Σx₀kᵀ + diag(m) Σ(1−o)kᵀ

with W = Σx₀(1 − o)ᵀ, Q = Σ(1 − o)(1 − o)ᵀ and M = diag Q, the missing
counts. So a first round

``"means"``: count_x (P,), sum_x (P,) — per feature, the number and the sum of
the observed pre-scaled values — and sum_x_miss (P, P) = W, count_miss
(P(P+1)/2,) = Q packed, sum_y_miss (P,), sum_y2_miss (P,) (with confounds
sum_c_miss (P, C)),

and the ``"sums"`` round of the zero-filled data x₀; neither depends on the
other, and the completion (``uncentred.complete_sums``) is post-processing of
the two aggregates.

Nothing here depends on data: names, shapes and sensitivities are functions
of the public settings (P, C, the policy and the bounds), so every node, the
coordinator and a reviewer derive the same layout and the same noise scale
before any data are touched.
"""

from __future__ import annotations

import math

from node.deltab._checks import check_nan_policy
from node.deltab._linalg import packed_size
from node.deltab.scaling import Bounds

__all__ = [
    "DERIVATIONS",
    "MEANS",
    "NAN_POLICIES",
    "ROUND_NAMES",
    "SUMS",
    "plan_shapes",
    "round_sensitivity",
    "round_shapes",
    "rounds_for",
    "sensitivity",
]

MEANS = "means"
SUMS = "sums"
ROUND_NAMES = (MEANS, SUMS)
NAN_POLICIES = ("drop", "mean")


def rounds_for(nan_policy: str) -> tuple[str, ...]:
    """The plan's rounds: ("sums",) for ``nan_policy`` "drop", ("means", "sums") for "mean"."""
    check_nan_policy(nan_policy, NAN_POLICIES)
    return (MEANS, SUMS) if nan_policy == "mean" else (SUMS,)


def _check_round(round_name: str) -> None:
    if round_name not in ROUND_NAMES:
        raise ValueError(f"round_name must be one of {ROUND_NAMES}; got {round_name!r}.")


def round_shapes(
    round_name: str, n_features: int, n_confounds: int = 0
) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors of ``round_name``, in payload order."""
    _check_round(round_name)
    p, c = n_features, n_confounds
    if round_name == MEANS:
        means: dict[str, tuple[int, ...]] = {
            "count_x": (p,),
            "sum_x": (p,),
            "sum_x_miss": (p, p),
            "count_miss": (packed_size(p),),
            "sum_y_miss": (p,),
            "sum_y2_miss": (p,),
        }
        if c:
            means["sum_c_miss"] = (p, c)
        return means
    shapes: dict[str, tuple[int, ...]] = {
        "n": (),
        "sum_x": (p,),
        "sum_xx": (packed_size(p),),
        "sum_xy": (p,),
        "sum_xy2": (p,),
        "sum_y": (),
        "sum_y2": (),
        "sum_y3": (),
        "sum_y4": (),
    }
    if c:
        shapes |= {
            "sum_c": (c,),
            "sum_cc": (packed_size(c),),
            "sum_xc": (p, c),
            "sum_yc": (c,),
            "sum_y2c": (c,),
        }
    return shapes


def plan_shapes(
    n_features: int, n_confounds: int, nan_policy: str
) -> dict[str, dict[str, tuple[int, ...]]]:
    """Every round of the plan for ``nan_policy`` with its tensors' names and shapes, in order."""
    return {r: round_shapes(r, n_features, n_confounds) for r in rounds_for(nan_policy)}


def sensitivity(round_name: str, bounds: Bounds) -> dict[str, float]:
    """L2 sensitivity of each tensor to adding or removing one subject, from the bounds alone.

    Derivation. After clipping and pre-scaling every feature value x_j, the
    age y and every confound k_l lie in [-1, 1]. A subject changes each sum by
    its own term, so a tensor's sensitivity is the largest L2 norm that one
    subject's term can have over the cube [-1, 1]^(P+1+C) (replacing a
    subject rather than adding or removing one doubles every figure). Each
    term below is a product of factors whose magnitudes grow with every |x_j|,
    |y| and |k_l|, so the largest norm is reached at a corner of the cube,
    where every |value| is 1:

    * n → 1 (the subject's count);
    * sum_x → ‖x‖ ≤ √P; sum_xy → ‖x y‖ ≤ √P; sum_xy2 → ‖x y²‖ ≤ √P;
    * sum_xx → the packed triangle of x xᵀ: Σ_{i≤j} x_i² x_j² = (‖x‖⁴ + Σ x_i⁴)/2
      ≤ P(P+1)/2, so √(P(P+1)/2). This is below the Frobenius bound
      ‖x xᵀ‖_F = ‖x‖² ≤ P: the packed form sends each off-diagonal product once;
    * sum_y, sum_y2, sum_y3, sum_y4 → |yᵏ| ≤ 1;
    * sum_c → √C; sum_cc → √(C(C+1)/2) as for sum_xx; sum_xc → ‖x kᵀ‖_F =
      ‖x‖‖k‖ ≤ √(PC); sum_yc, sum_y2c → ‖y k‖, ‖y² k‖ ≤ √C.

    means: count_x → ‖indicator of observed values‖ ≤ √P; sum_x → √P over
    the observed values; sum_x_miss → ‖x₀ (1 − o)ᵀ‖_F = ‖x₀‖‖1 − o‖ ≤
    √(a(P − a)) with a the subject's observed count, at most √(⌊P/2⌋⌈P/2⌉);
    count_miss → the packed triangle of (1 − o)(1 − o)ᵀ, √(P(P+1)/2) (every
    value missing); sum_y_miss, sum_y2_miss → √P; sum_c_miss → √(PC).

    Under ``nan_policy="mean"`` the "sums" round runs on the zero-filled data,
    so the same cube, and the same figures, hold, and no figure — nor any
    released value — depends on a mean derived from other nodes' data (the
    imputation is applied to the aggregates: module docstring). The two
    releases are independent mechanisms and compose as such.

    The whole round's sensitivity is the L2 norm of these figures
    (:func:`round_sensitivity`).
    """
    _check_round(round_name)
    p, c = bounds.n_features, bounds.n_confounds
    root_p = math.sqrt(p)
    if round_name == MEANS:
        means = {
            "count_x": root_p,
            "sum_x": root_p,
            "sum_x_miss": math.sqrt((p // 2) * (p - p // 2)),
            "count_miss": math.sqrt(packed_size(p)),
            "sum_y_miss": root_p,
            "sum_y2_miss": root_p,
        }
        if c:
            means["sum_c_miss"] = math.sqrt(p * c)
        return means
    out = {
        "n": 1.0,
        "sum_x": root_p,
        "sum_xx": math.sqrt(packed_size(p)),
        "sum_xy": root_p,
        "sum_xy2": root_p,
        "sum_y": 1.0,
        "sum_y2": 1.0,
        "sum_y3": 1.0,
        "sum_y4": 1.0,
    }
    if c:
        root_c = math.sqrt(c)
        out |= {
            "sum_c": root_c,
            "sum_cc": math.sqrt(packed_size(c)),
            "sum_xc": math.sqrt(p * c),
            "sum_yc": root_c,
            "sum_y2c": root_c,
        }
    return out


def round_sensitivity(round_name: str, bounds: Bounds) -> float:
    """L2 sensitivity of all of a round's tensors taken together."""
    return math.sqrt(sum(v * v for v in sensitivity(round_name, bounds).values()))


# One phrase per tensor for the DP receipt, completing "one subject changes this
# tensor by at most ...": the figure, then what the tensor sums and why one
# subject's term is that small.
DERIVATIONS: dict[str, dict[str, str]] = {
    MEANS: {
        "count_x": "√P (the count of observed values per feature: one indicator per feature)",
        "sum_x": "√P (the sum of the observed pre-scaled feature values, each in [-1, 1])",
        "sum_x_miss": "√(⌊P/2⌋⌈P/2⌉) (Σ x₀(1 − o)ᵀ: each observed value times each missing "
        "indicator, a·(P − a) products in [-1, 1] for a observed values)",
        "count_miss": "√(P(P+1)/2) (the packed upper triangle of Σ (1 − o)(1 − o)ᵀ: pairs of "
        "missing indicators)",
        "sum_y_miss": "√P (Σ (1 − o)·y: the pre-scaled age per missing feature, in [-1, 1])",
        "sum_y2_miss": "√P (Σ (1 − o)·y²: per missing feature, in [0, 1])",
        "sum_c_miss": "√(PC) (Σ (1 − o)kᵀ: P·C products, each in [-1, 1])",
    },
    SUMS: {
        "n": "1 (the number of subjects: its own count)",
        "sum_x": "√P (the sum of the pre-scaled features x, each in [-1, 1])",
        "sum_xx": "√(P(P+1)/2) (the packed upper triangle of Σ x xᵀ: P(P+1)/2 products "
        "x_i x_j, each in [-1, 1])",
        "sum_xy": "√P (Σ x·y with the pre-scaled age y: P products, each in [-1, 1])",
        "sum_xy2": "√P (Σ x·y²: P products, each in [-1, 1])",
        "sum_y": "1 (the sum of the pre-scaled age y, in [-1, 1])",
        "sum_y2": "1 (the sum of y², in [0, 1])",
        "sum_y3": "1 (the sum of y³, in [-1, 1])",
        "sum_y4": "1 (the sum of y⁴, in [0, 1])",
        "sum_c": "√C (the sum of the pre-scaled confounds k, each in [-1, 1])",
        "sum_cc": "√(C(C+1)/2) (the packed upper triangle of Σ k kᵀ: C(C+1)/2 products, "
        "each in [-1, 1])",
        "sum_xc": "√(PC) (Σ x kᵀ: P·C products, each in [-1, 1])",
        "sum_yc": "√C (Σ y·k: C products, each in [-1, 1])",
        "sum_y2c": "√C (Σ y²·k: C products, each in [-1, 1])",
    },
}
