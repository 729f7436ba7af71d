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
the global mean of the observed values, which needs a first round

``"means"``: count_x (P,), sum_x (P,) — per feature, the number and the sum of
the observed pre-scaled values,

after which every node fills its gaps with clamp(sum_x / count_x, -1, 1) and
sends its ``"sums"`` of the completed data.

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
        return {"count_x": (p,), "sum_x": (p,)}
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
    the observed values.

    Under ``nan_policy="mean"`` the "sums" round runs on completed data whose
    filled-in values are global means clamped into [-1, 1], so the same cube,
    and the same figures, hold. (Conditioning the second release on the first
    one's output is sound under adaptive composition.) Unlike the centred
    two-round plan (``stats.sensitivity``), no figure depends on a mean
    derived from other nodes' data.

    The whole round's sensitivity is the L2 norm of these figures
    (:func:`round_sensitivity`).
    """
    _check_round(round_name)
    p, c = bounds.n_features, bounds.n_confounds
    root_p = math.sqrt(p)
    if round_name == MEANS:
        return {"count_x": root_p, "sum_x": root_p}
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
