"""The one-release federated fit: uncentred sums at the nodes, centring after aggregation.

Each node sends the uncentred sums of ``sums`` (values clipped to the public
bounds and pre-scaled to [-1, 1]; :func:`local_sums`). Their element-wise
total is the same set of sums over the pooled cohort, and the pooled fit of
Smith et al. (2019, NeuroImage 200:528-539) is a function of it
(:func:`model_from_sums`): the global means follow from N and Σx, Σy, Σk, and
every centred sum the solve of ``_solve`` needs is a polynomial in the
uncentred ones. With u = x − a, v = y − b, w = k − d (a, b, d the global
means, clamped into [-1, 1]):

    Σu = Σx − N a                      Σu uᵀ = Σx xᵀ − a(Σx)ᵀ − (Σx)aᵀ + N a aᵀ
    Σu v = Σx y − bΣx − aΣy + N a b    Σu v² = Σx y² − 2bΣx y + b²Σx − a Σv²
    Σvᵏ = Σ_{i≤k} C(k,i) (−b)^(k−i) Σyⁱ (k ≤ 4, Σy⁰ = N)
    Σw, Σw wᵀ, Σu wᵀ, Σw v, Σw v² likewise.

Numerical precision, and why the centring is plain float64. Σx xᵀ − N a aᵀ
cancels: for a feature whose spread s is small against its mean (in [-1, 1]
units: against its bounds) the relative error of Σx xᵀ grows by (|a|/s)² in
the centred sum, and for the fourth-order age terms by (|b|/s)⁴. The error
that cancellation exposes lives in the released sums themselves — a node's
float64 sums are correct to about ε_mach relative, a fixed-point sum to 2^-33
absolute per node — so evaluating the polynomials above exactly (every
float64 is a dyadic rational) gains nothing: measured against exact rational
centring on the same aggregates, the fits agree with the pooled fit to the
same digits (within a factor of 2 either way). Measured agreement with
``BrainAgeModel`` on pooled data, max |Δ| over max |prediction|:

* the test cohorts (tests/node/conftest.py, 2-10 nodes, bounds 5% beyond the
  data): 4e-14 from float64 sums; through 32 fractional bits at most 1.1e-9
  for 60-160 subjects (the centred two-round plan: up to 4e-9 on the same draws)
  and 1.4e-10 for well-posed fits of 300-800 subjects;
* the synthetic federation of ``zerosum federation init --synthetic``
  (P = 40; 400, 250, 600 subjects; its bounds): 1.2e-15 from float64 sums,
  8e-12 through fixed point;
* features crowded at one end of bounds a hundred times wider than their
  range: 4e-11 (five hundred times: 5e-10);
* the quadratic models when the age bounds dwarf the age spread: 2e-12 for
  ages 45-82 within [0, 240] years, 3e-10 within [0, 1040], 4e-8 within
  [0, 4040] (the centred plan stays at 1e-16; bounds such as 18-100 years
  cost nothing).

Constant variables. A centred sum of squares cannot be told apart from zero
when it is below the rounding error of the raw sum of squares it came from, so
a feature (or confound, or age) whose centred sum of squares is at most
``CANCELLATION_RTOL`` times its raw sum of squares is taken to be constant:
its centred sums are set to exactly zero and the solve leaves it out (or
refuses, for a confound or age) with the pooled fit's message. The pooled fit
resolves spreads down to 1e-12 of the mean; this plan down to 1e-6 of the
root mean square (in [-1, 1] units with bounds). A constant that differs from
its mean by less than the fixed-point resolution is not caught by this
relative rule, but then its sums carry no information either.

Missing values (``nan_policy="mean"``): the ``means`` round gives per feature
the count and the sum of the observed values and the missingness cross-sums
(:func:`local_means`), the ``sums`` round the sums of the zero-filled data
(:func:`local_sums`); after aggregation the clamped global mean
(:func:`imputation_values`) fills the gaps in the sums themselves
(:func:`complete_sums`, the identities in ``sums``), so no node's release
depends on it. ``BrainAgeModel(nan_policy="mean")`` applies the same rule to
pooled data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

from node.deltab._checks import FloatArray, check_nan_policy
from node.deltab._linalg import pack_symmetric, packed_diagonal, symmetrise, unpack_symmetric
from node.deltab._solve import CentredSums
from node.deltab.scaling import Bounds, Standardisation
from node.deltab.stats import Tensors, _infer_sizes, _prescale, _validated, check_tensors
from node.deltab.sums import MEANS, NAN_POLICIES, SUMS

if TYPE_CHECKING:
    from node.deltab.model import BrainAgeModel

IndexArray = NDArray[np.intp]

__all__ = [
    "CANCELLATION_RTOL",
    "centred_from_sums",
    "complete_sums",
    "imputation_values",
    "local_means",
    "local_sums",
    "model_from_sums",
]

# A centred sum of squares at most this fraction of the raw sum of squares is
# rounding error: the variable is constant (spread ≤ 1e-6 of its root mean square).
CANCELLATION_RTOL = 1e-12


def local_means(
    X: ArrayLike,
    age: ArrayLike,
    *,
    confounds: ArrayLike | None = None,
    bounds: Bounds | None = None,
) -> Tensors:
    """The ``means`` round of one node: per feature, count and sum of the observed values.

    Values are clipped to ``bounds`` and pre-scaled to [-1, 1] first when
    bounds are given. Every subject takes part (ages must be known: they are
    not imputed).
    """
    features, ages, conf = _validated(X, age, confounds, "mean")
    features, y, k = _prescale(features, ages, conf, bounds)
    observed = ~np.isnan(features)
    filled = features if observed.all() else np.where(observed, features, 0.0)
    missing = (~observed).astype(np.float64)
    tensors: Tensors = {
        "count_x": observed.sum(axis=0).astype(np.float64),
        "sum_x": filled.sum(axis=0),
        # What completing the zero-filled sums after aggregation needs (sums module).
        "sum_x_miss": filled.T @ missing,
        "count_miss": pack_symmetric(missing.T @ missing),
        "sum_y_miss": missing.T @ y,
        "sum_y2_miss": missing.T @ (y * y),
    }
    if k.shape[1]:
        tensors["sum_c_miss"] = missing.T @ k
    return tensors


def imputation_values(means: Mapping[str, ArrayLike], bounds: Bounds | None = None) -> FloatArray:
    """The value that replaces a missing feature value: the global mean of the observed ones.

    Σx_j / count_j from the aggregated ``means`` round, in pre-scaled units and
    clamped into [-1, 1] when bounds are given (a no-op for exact sums; it
    keeps noised sums inside the public range, which the sensitivity of the
    ``sums`` round relies on).
    """
    p = int(np.shape(means["sum_x"])[0]) if "sum_x" in means else 0
    # Only the counts and sums are needed here (the cross-sums complete the sums).
    tensors = {
        name: value
        for name, value in check_tensors(
            MEANS, _with_cross_sums(means, p), p, _confounds_of(means)
        ).items()
        if name in ("count_x", "sum_x")
    }
    if bounds is not None:
        bounds.check_shapes(p, bounds.n_confounds)
    count = tensors["count_x"]
    empty = np.flatnonzero(~(count > 0))
    if empty.size:
        raise ValueError(
            f"feature {int(empty[0])} has no observed value in any contribution; remove it."
        )
    mean = tensors["sum_x"] / count
    return np.clip(mean, -1.0, 1.0) if bounds is not None else mean


def local_sums(
    X: ArrayLike,
    age: ArrayLike,
    *,
    confounds: ArrayLike | None = None,
    bounds: Bounds | None = None,
    nan_policy: str = "drop",
    fill: ArrayLike | None = None,
) -> Tensors:
    """The ``sums`` round of one node (names and shapes: ``sums.round_shapes``).

    ``nan_policy="drop"`` leaves out the node's subjects with any missing
    value; ``"mean"`` replaces a missing feature value by ``fill`` (in
    pre-scaled units), by 0 when ``fill`` is None: the zero-filled sums a
    node releases, completed after aggregation by :func:`complete_sums`.
    """
    check_nan_policy(nan_policy, NAN_POLICIES)
    features, ages, conf = _validated(X, age, confounds, nan_policy)
    x, y, k = _prescale(features, ages, conf, bounds)
    missing = np.isnan(x)
    if missing.any():
        values = np.zeros(x.shape[1]) if fill is None else np.asarray(fill, dtype=np.float64)
        if values.shape != (x.shape[1],):
            raise ValueError(
                f"fill has shape {values.shape}; expected one value per feature, ({x.shape[1]},)."
            )
        x = np.where(missing, values, x)
    y2 = y * y
    tensors: Tensors = {
        "n": np.array(float(x.shape[0])),
        "sum_x": x.sum(axis=0),
        "sum_xx": pack_symmetric(x.T @ x),
        "sum_xy": x.T @ y,
        "sum_xy2": x.T @ y2,
        "sum_y": np.array(y.sum()),
        "sum_y2": np.array(y @ y),
        "sum_y3": np.array(y2 @ y),
        "sum_y4": np.array(y2 @ y2),
    }
    if k.shape[1]:
        tensors |= {
            "sum_c": k.sum(axis=0),
            "sum_cc": pack_symmetric(k.T @ k),
            "sum_xc": x.T @ k,
            "sum_yc": k.T @ y,
            "sum_y2c": k.T @ y2,
        }
    return tensors


def _confounds_of(means: Mapping[str, ArrayLike]) -> int:
    return int(np.shape(means["sum_c_miss"])[1]) if "sum_c_miss" in means else 0


def _with_cross_sums(means: Mapping[str, ArrayLike], p: int) -> dict[str, ArrayLike]:
    """``means`` with zero cross-sums where absent (counts and sums alone: no gaps to fill)."""
    out = dict(means)
    for name, shape in (
        ("sum_x_miss", (p, p)),
        ("count_miss", (p * (p + 1) // 2,)),
        ("sum_y_miss", (p,)),
        ("sum_y2_miss", (p,)),
    ):
        out.setdefault(name, np.zeros(shape))
    return out


def complete_sums(
    sums: Mapping[str, ArrayLike], means: Mapping[str, ArrayLike], fill: ArrayLike
) -> Tensors:
    """The ``sums`` of the mean-imputed data from those of the zero-filled data.

    ``sums``: the aggregated ``sums`` round (zero-filled data x₀); ``means``:
    the aggregated ``means`` round (its missingness cross-sums W, Q, Σ(1−o)y,
    Σ(1−o)y², Σ(1−o)kᵀ); ``fill``: the pre-scaled imputation m
    (:func:`imputation_values`). The identities of the ``sums`` module:
    post-processing of the two aggregates, exact up to float64 rounding.
    """
    m = np.asarray(fill, dtype=np.float64)
    p = m.shape[0]
    out: Tensors = {name: np.array(value, dtype=np.float64) for name, value in sums.items()}
    w = np.asarray(means["sum_x_miss"], dtype=np.float64).reshape(p, p)
    q = unpack_symmetric(np.asarray(means["count_miss"], dtype=np.float64), p)
    out["sum_x"] = out["sum_x"] + m * np.diag(q)
    xx = unpack_symmetric(out["sum_xx"], p)
    xx = xx + w * m[None, :] + m[:, None] * w.T + q * np.outer(m, m)
    out["sum_xx"] = pack_symmetric(xx)
    out["sum_xy"] = out["sum_xy"] + m * np.asarray(means["sum_y_miss"], dtype=np.float64)
    out["sum_xy2"] = out["sum_xy2"] + m * np.asarray(means["sum_y2_miss"], dtype=np.float64)
    if "sum_xc" in out and "sum_c_miss" in means:
        out["sum_xc"] = out["sum_xc"] + m[:, None] * np.asarray(
            means["sum_c_miss"], dtype=np.float64
        )
    return out


def _central_powers(raw: list[float], b: float) -> list[float]:
    """Σ(y − b)^k for k = 1..4 from raw = [N, Σy, Σy², Σy³, Σy⁴] (binomial expansion)."""
    return [
        sum(math.comb(k, i) * (-b) ** (k - i) * raw[i] for i in range(k, -1, -1))
        for k in range(1, 5)
    ]


def _cross(
    s_pq: FloatArray, s_p: FloatArray, s_q: FloatArray, a: FloatArray, b: FloatArray, *, n: float
) -> FloatArray:
    """Σ(p − a)(q − b)ᵀ = Σp qᵀ − (Σp) bᵀ − a (Σq)ᵀ + N a bᵀ."""
    centred: FloatArray = s_pq - np.outer(s_p, b) - np.outer(a, s_q) + n * np.outer(a, b)
    return centred


def _cross_in_place(
    s_pq: FloatArray,
    s_p: FloatArray,
    s_q: FloatArray,
    a: FloatArray,
    b: FloatArray,
    *,
    n: float,
    block: int = 256,
) -> FloatArray:
    """:func:`_cross` computed inside ``s_pq``, a block of rows at a time; returns ``s_pq``.

    Every entry goes through the same operations in the same order as in
    :func:`_cross` ((s − p_i b_j) − a_i q_j) + N (a_i b_j), so the result is
    the same float for float; the P × P outer products are never formed whole.
    """
    for i in range(0, s_pq.shape[0], block):
        rows = slice(i, i + block)
        part = s_pq[rows]
        part -= np.multiply.outer(s_p[rows], b)
        part -= np.multiply.outer(a[rows], s_q)
        part += n * np.multiply.outer(a[rows], b)
    return s_pq


def _flat_variables(centred_squares: FloatArray, raw_squares: FloatArray) -> IndexArray:
    """Indices whose centred sum of squares is rounding error of the raw one."""
    flat: IndexArray = np.flatnonzero(centred_squares <= CANCELLATION_RTOL * raw_squares)
    return flat


def centred_from_sums(
    sums: Mapping[str, ArrayLike], bounds: Bounds | None = None
) -> tuple[CentredSums, Standardisation]:
    """The centred sums and global standardisation of an aggregated ``sums`` round.

    Sums are in [-1, 1] units when ``bounds`` are given (the nodes' pre-scaling);
    the standardisation is returned in original units.
    """
    p, c = _infer_sizes(SUMS, sums)
    t = check_tensors(SUMS, sums, p, c)
    if bounds is not None:
        bounds.check_shapes(p, c)
    n = float(t["n"])
    if not n >= 2:
        raise ValueError(f"the sums cover {n:g} subjects; at least 2 are needed.")
    a = t["sum_x"] / n
    b = float(t["sum_y"]) / n
    d = t["sum_c"] / n if c else np.zeros(0)
    if bounds is not None:
        a, d = np.clip(a, -1.0, 1.0), np.clip(d, -1.0, 1.0)
        b = min(max(b, -1.0), 1.0)

    s_x, s_y = t["sum_x"], float(t["sum_y"])
    v1, v2, v3, v4 = _central_powers([n, s_y, *(float(t[f"sum_y{k}"]) for k in (2, 3, 4))], b)
    sum_u = s_x - n * a
    # The P × P sums are centred and symmetrised inside one matrix (the only one
    # of that size here); the raw diagonal is read from the packed triangle.
    sum_xx = _cross_in_place(unpack_symmetric(t["sum_xx"], p), s_x, s_x, a, a, n=n)
    sum_uv = t["sum_xy"] - b * s_x - a * s_y + n * a * b
    sum_uv2 = t["sum_xy2"] - 2.0 * b * t["sum_xy"] + b * b * s_x - a * v2
    if c:
        s_c = t["sum_c"]
        sum_w = s_c - n * d
        sum_cc = _cross(unpack_symmetric(t["sum_cc"], c), s_c, s_c, d, d, n=n)
        sum_uw = _cross(t["sum_xc"], s_x, s_c, a, d, n=n)
        sum_wv = t["sum_yc"] - b * s_c - d * s_y + n * d * b
        sum_wv2 = t["sum_y2c"] - 2.0 * b * t["sum_yc"] + b * b * s_c - d * v2
    else:
        sum_cc, sum_w, sum_uw = np.zeros((0, 0)), np.zeros(0), np.zeros((p, 0))
        sum_wv = sum_wv2 = np.zeros(0)
    # Rounding leaves the two triangles of a centred matrix a few ulps apart.
    sum_xx = symmetrise(sum_xx)
    sum_cc = (sum_cc + sum_cc.T) / 2.0
    y_sums = [v1, v2, v3, v4]

    raw_xx = packed_diagonal(np.asarray(t["sum_xx"], dtype=np.float64), p)
    flat = _flat_variables(np.diag(sum_xx), raw_xx)
    sum_u[flat] = sum_uv[flat] = sum_uv2[flat] = 0.0
    sum_xx[flat, :] = sum_xx[:, flat] = 0.0
    sum_uw[flat, :] = 0.0
    if c:
        flat_c = _flat_variables(np.diag(sum_cc), np.diag(unpack_symmetric(t["sum_cc"], c)))
        sum_w[flat_c] = sum_wv[flat_c] = sum_wv2[flat_c] = 0.0
        sum_cc[flat_c, :] = sum_cc[:, flat_c] = 0.0
        sum_uw[:, flat_c] = 0.0
    if y_sums[1] <= CANCELLATION_RTOL * float(t["sum_y2"]):
        y_sums = [0.0, 0.0, 0.0, 0.0]
        sum_uv[:] = sum_uv2[:] = 0.0
        sum_wv[:] = sum_wv2[:] = 0.0

    centred = CentredSums(
        n=n,
        sum_x=sum_u,
        diag_xx=np.diag(sum_xx).copy(),
        sum_xx=sum_xx,
        sum_xy=sum_uv,
        sum_xy2=sum_uv2,
        sum_y=y_sums[0],
        sum_y2=y_sums[1],
        sum_y3=y_sums[2],
        sum_y4=y_sums[3],
        sum_c=sum_w,
        sum_cc=sum_cc,
        sum_xc=sum_uw,
        sum_yc=sum_wv,
        sum_y2c=sum_wv2,
    )
    return centred, _standardisation(centred, a, b, d, bounds)


def _spread(sum_squares: FloatArray, total: FloatArray, n: float) -> FloatArray:
    variance = np.maximum(sum_squares / n - (total / n) ** 2, 0.0)
    spread: FloatArray = np.sqrt(variance)
    return spread


def _standardisation(
    s: CentredSums, a: FloatArray, b: float, d: FloatArray, bounds: Bounds | None
) -> Standardisation:
    n = s.n
    feature_std = _spread(s.diag_xx, s.sum_x, n)
    age_std = float(_spread(np.array(s.sum_y2), np.array(s.sum_y), n))
    confound_std = _spread(np.diag(s.sum_cc), s.sum_c, n)
    if bounds is None:
        return Standardisation(
            n=n,
            feature_mean=a,
            feature_std=feature_std,
            age_mean=b,
            age_std=age_std,
            confound_mean=d,
            confound_std=confound_std,
        )
    return Standardisation(
        n=n,
        feature_mean=bounds.feature_centre + bounds.feature_half * a,
        feature_std=bounds.feature_half * feature_std,
        age_mean=bounds.age_centre + bounds.age_half * b,
        age_std=bounds.age_half * age_std,
        confound_mean=bounds.confound_centre + bounds.confound_half * d,
        confound_std=bounds.confound_half * confound_std,
        bounds=bounds,
    )


def model_from_sums(
    sums: Mapping[str, ArrayLike],
    bounds: Bounds | None = None,
    *,
    fill: ArrayLike | None = None,
    model: str = "unbiased",
    n_components: int | None = None,
    feature_proportion: float | None = None,
    variance_explained: float | None = None,
    kaiser_guttman: bool = False,
    nan_policy: str = "drop",
    noisy: bool = False,
) -> BrainAgeModel:
    """Fitted :class:`~node.deltab.model.BrainAgeModel` from an aggregated ``sums`` round.

    ``noisy`` says the sums carry residual DP noise: a component count the
    noised scatter cannot support is then capped at its numerical rank rather
    than refused (post-processing of a DP release, so no privacy cost).

    ``nan_policy`` is recorded in the model (how it treats missing values when
    predicting) and must be the policy the nodes used; under "mean", ``fill``
    is the pre-scaled imputation the nodes used (:func:`imputation_values`),
    which the model reuses at prediction (default: the global means).
    """
    from node.deltab.model import BrainAgeModel

    check_nan_policy(nan_policy, NAN_POLICIES)
    estimator = BrainAgeModel(
        model,
        n_components=n_components,
        feature_proportion=feature_proportion,
        variance_explained=variance_explained,
        kaiser_guttman=kaiser_guttman,
        nan_policy=nan_policy,
    )
    centred, standardisation = centred_from_sums(sums, bounds)
    fill_values: FloatArray | None = None
    if fill is not None:
        fill_values = np.asarray(fill, dtype=np.float64)
        if fill_values.shape != (standardisation.n_features,):
            raise ValueError(
                f"fill has shape {fill_values.shape}; expected ({standardisation.n_features},)."
            )
        if bounds is not None:
            fill_values = bounds.feature_centre + bounds.feature_half * fill_values
    return estimator._fit_from_sums(centred, standardisation, fill=fill_values, noisy=noisy)
