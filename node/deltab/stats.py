"""Sufficient statistics for the brain-age fit: per-node sums, combination, solve.

The pooled fit of Smith et al. (2019, NeuroImage 200:528-539) needs only sums
over subjects (see ``_solve``), so K sites can fit the pooled model without
pooling data. The federated plan is one release of uncentred sums (``sums``
for its layout and sensitivities, ``uncentred`` for the node sums and the fit
from their aggregate). This module keeps what both plans share (checking,
combining, clipping) and the earlier centred plan, in two rounds:

* ``"moments"`` — each node sends N, per-feature counts of observed values,
  Σx and Σx², and Σy, Σy² for age (and Σk, Σk² per confound). Their sum gives
  the global means (``standardisation_from_moments``).
* ``"scatter"`` — each node centres its values with the global means and sends
  N, Σc, Σc cᵀ, Σc y, Σc y², Σyᵏ (k = 1..4) and, with confounds, their cross-
  products. The solve step (``model_from_scatter``) builds the PCA basis from
  the eigendecomposition of the pooled P×P scatter and every model's
  regressions from the same sums. The scatter round carries its own N and Σc,
  so the solve re-centres exactly even if the global means were slightly off
  (noised moments, or a node that dropped out between rounds).

Tensors travel as ``dict[str, numpy.ndarray]`` (float64) with the names and
shapes of :func:`expected_shapes`; combining is an element-wise sum
(:func:`combine`), which is what secure aggregation delivers. Symmetric
matrices (``sum_xx``, ``sum_cc``) travel as their packed upper triangle, row by
row, diagonal included.

Missing values. Medians do not decompose into sums, so the federated path
offers ``nan_policy="mean"`` (a missing feature value is replaced by the
global mean of the observed values, from the moments round; it contributes 0
to every centred sum) or ``"drop"`` (each node drops its own subjects with any
missing value). ``BrainAgeModel(nan_policy="mean")`` applies the same rule to
pooled data, which is the reference the federated model reproduces.

Bounds. With public ``Bounds`` every value is clipped to its range, then mapped
onto [-1, 1] before summing (see ``scaling``). The clipped counts stay at the
node (:func:`count_clipped`); :func:`sensitivity` gives the L2 sensitivity of
each tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from node.deltab._checks import (
    FloatArray,
    as_age,
    as_confounds,
    as_features,
    check_nan_policy,
    complete_rows,
    first_missing_age,
)
from node.deltab._linalg import pack_symmetric, packed_size, unpack_symmetric
from node.deltab._solve import CentredSums
from node.deltab.scaling import Bounds, ClipCounts, Standardisation, clip_counts, clip_to_bounds
from node.deltab.sums import ROUND_NAMES as ONE_RELEASE_ROUNDS
from node.deltab.sums import round_shapes
from node.deltab.sums import sensitivity as one_release_sensitivity

if TYPE_CHECKING:
    from node.deltab.model import BrainAgeModel

__all__ = [
    "KNOWN_ROUNDS",
    "MOMENTS",
    "ROUND_NAMES",
    "SCATTER",
    "Tensors",
    "combine",
    "count_clipped",
    "expected_shapes",
    "local_moments",
    "local_scatter",
    "model_from_scatter",
    "sensitivity",
    "standardisation_from_moments",
]

Tensors = dict[str, FloatArray]

MOMENTS = "moments"
SCATTER = "scatter"
ROUND_NAMES = (MOMENTS, SCATTER)
KNOWN_ROUNDS = (*ONE_RELEASE_ROUNDS, *ROUND_NAMES)
FEDERATED_NAN_POLICIES = ("mean", "drop")


def expected_shapes(
    round_name: str, n_features: int, n_confounds: int = 0
) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors a node sends in ``round_name``.

    The one-release plan's rounds ("means", "sums") are those of
    ``sums.round_shapes``; the centred two-round plan's are:

    moments: n (), count_x (P,), sum_x (P,), sum_x2 (P,), sum_y (), sum_y2 ();
      with confounds also sum_c (C,), sum_c2 (C,).
    scatter: n (), sum_x (P,), sum_xx (P(P+1)/2,), sum_xy (P,), sum_xy2 (P,),
      sum_y (), sum_y2 (), sum_y3 (), sum_y4 (); with confounds also sum_c (C,),
      sum_cc (C(C+1)/2,), sum_xc (P, C), sum_yc (C,), sum_y2c (C,).
    """
    p, c = n_features, n_confounds
    if round_name in ONE_RELEASE_ROUNDS:
        return round_shapes(round_name, p, c)
    if round_name == MOMENTS:
        shapes: dict[str, tuple[int, ...]] = {
            "n": (),
            "count_x": (p,),
            "sum_x": (p,),
            "sum_x2": (p,),
            "sum_y": (),
            "sum_y2": (),
        }
        if c:
            shapes |= {"sum_c": (c,), "sum_c2": (c,)}
        return shapes
    if round_name == SCATTER:
        shapes = {
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
    raise ValueError(f"round_name must be one of {KNOWN_ROUNDS}; got {round_name!r}.")


def check_tensors(
    round_name: str, tensors: Mapping[str, ArrayLike], n_features: int, n_confounds: int = 0
) -> Tensors:
    """Float64 copies of ``tensors`` after checking names, shapes and finiteness."""
    shapes = expected_shapes(round_name, n_features, n_confounds)
    missing = sorted(set(shapes) - set(tensors))
    extra = sorted(set(tensors) - set(shapes))
    if missing or extra:
        raise ValueError(
            f"the {round_name} tensors do not match the plan: missing {missing or 'none'}, "
            f"unexpected {extra or 'none'}."
        )
    checked: Tensors = {}
    for name, shape in shapes.items():
        value = np.asarray(tensors[name], dtype=np.float64)
        if value.shape != shape:
            raise ValueError(
                f"{round_name} tensor {name!r} has shape {value.shape}; expected {shape}."
            )
        if not np.isfinite(value).all():
            raise ValueError(f"{round_name} tensor {name!r} contains NaN or infinite values.")
        checked[name] = value
    return checked


def _infer_sizes(round_name: str, tensors: Mapping[str, ArrayLike]) -> tuple[int, int]:
    try:
        p = int(np.shape(tensors["sum_x"])[0])
    except (KeyError, IndexError):
        raise ValueError(f"the {round_name} tensors need a 1-D 'sum_x'.") from None
    c = int(np.shape(tensors["sum_c"])[0]) if "sum_c" in tensors else 0
    return p, c


def combine(contributions: Sequence[Mapping[str, ArrayLike]]) -> Tensors:
    """Element-wise sum of node contributions (names and shapes must agree)."""
    if not contributions:
        raise ValueError("combine needs at least one contribution; got none.")
    first = contributions[0]
    names = sorted(first)
    total: Tensors = {name: np.array(first[name], dtype=np.float64) for name in names}
    for index, contribution in enumerate(contributions[1:], start=1):
        if sorted(contribution) != names:
            raise ValueError(
                f"contribution {index} has tensors {sorted(contribution)}; contribution 0 has "
                f"{names}."
            )
        for name in names:
            value = np.asarray(contribution[name], dtype=np.float64)
            if value.shape != total[name].shape:
                raise ValueError(
                    f"tensor {name!r} of contribution {index} has shape {value.shape}; "
                    f"contribution 0 has {total[name].shape}."
                )
            total[name] = total[name] + value
    return total


def _select_subjects(
    X: FloatArray, age: FloatArray, confounds: FloatArray, nan_policy: str
) -> tuple[FloatArray, FloatArray, FloatArray]:
    if nan_policy == "drop":
        keep = complete_rows(X, age)
        if not keep.all():
            X, age, confounds = X[keep], age[keep], confounds[keep]
        return X, age, confounds
    missing = first_missing_age(age)
    if missing is not None:
        raise ValueError(
            f"age[{missing}] is missing (NaN); ages cannot be imputed — remove that subject "
            "or use nan_policy='drop'."
        )
    return X, age, confounds


def _validated(
    X: ArrayLike, age: ArrayLike, confounds: ArrayLike | None, nan_policy: str
) -> tuple[FloatArray, FloatArray, FloatArray]:
    check_nan_policy(nan_policy, FEDERATED_NAN_POLICIES)
    features = as_features(X)
    ages = as_age(age, features.shape[0])
    conf = as_confounds(confounds, features.shape[0])
    return _select_subjects(features, ages, conf, nan_policy)


def _prescale(
    X: FloatArray, age: FloatArray, confounds: FloatArray, bounds: Bounds | None
) -> tuple[FloatArray, FloatArray, FloatArray]:
    X, age, confounds, _ = clip_to_bounds(X, age, confounds, bounds)
    if bounds is None:
        return X, age, confounds
    # The clipped arrays are fresh copies: pre-scale them in place, the same
    # (v − centre) / half as out of place, without two more copies of the cohort.
    for values, centre, half in (
        (X, bounds.feature_centre, bounds.feature_half),
        (age, bounds.age_centre, bounds.age_half),
        (confounds, bounds.confound_centre, bounds.confound_half),
    ):
        np.subtract(values, centre, out=values)
        np.divide(values, half, out=values)
    return X, age, confounds


def local_moments(
    X: ArrayLike,
    age: ArrayLike,
    *,
    confounds: ArrayLike | None = None,
    bounds: Bounds | None = None,
    nan_policy: str = "mean",
) -> Tensors:
    """First-round sums of one node (names and shapes: :func:`expected_shapes`).

    Values are clipped to ``bounds`` and mapped onto [-1, 1] first when bounds
    are given. Missing feature values are left out of ``sum_x``/``sum_x2`` and
    of ``count_x`` (policy "mean"), or their subjects are dropped ("drop").
    """
    features, ages, conf = _validated(X, age, confounds, nan_policy)
    features, ages, conf = _prescale(features, ages, conf, bounds)
    observed = ~np.isnan(features)
    filled = features if observed.all() else np.where(observed, features, 0.0)
    tensors: Tensors = {
        "n": np.array(float(features.shape[0])),
        "count_x": observed.sum(axis=0).astype(np.float64),
        "sum_x": filled.sum(axis=0),
        "sum_x2": np.einsum("ij,ij->j", filled, filled),
        "sum_y": np.array(ages.sum()),
        "sum_y2": np.array(ages @ ages),
    }
    if conf.shape[1]:
        tensors["sum_c"] = conf.sum(axis=0)
        tensors["sum_c2"] = np.einsum("ij,ij->j", conf, conf)
    return tensors


def standardisation_from_moments(
    moments: Mapping[str, ArrayLike], bounds: Bounds | None = None
) -> Standardisation:
    """Global means and standard deviations from the aggregated first round.

    mean_j = Σx_j / count_j and sd_j = sqrt(Σx²_j / count_j - mean_j²) over the
    observed values of feature j; age and confounds over all N subjects. With
    bounds the sums are in [-1, 1] units; means are clamped into [-1, 1] (a
    no-op for exact sums; it keeps noised sums inside the public range) and
    the results are mapped back to original units.
    """
    p, c = _infer_sizes(MOMENTS, moments)
    tensors = check_tensors(MOMENTS, moments, p, c)
    if bounds is not None:
        bounds.check_shapes(p, c)
    n = float(tensors["n"])
    if not n >= 2:
        raise ValueError(f"the moments cover {n:g} subjects; at least 2 are needed.")
    count = tensors["count_x"]
    empty = np.flatnonzero(~(count > 0))
    if empty.size:
        raise ValueError(
            f"feature {int(empty[0])} has no observed value in any contribution; remove it."
        )
    mean = tensors["sum_x"] / count
    var = np.maximum(tensors["sum_x2"] / count - mean**2, 0.0)
    age_mean = float(tensors["sum_y"]) / n
    age_var = max(float(tensors["sum_y2"]) / n - age_mean**2, 0.0)
    if c:
        conf_mean = tensors["sum_c"] / n
        conf_var = np.maximum(tensors["sum_c2"] / n - conf_mean**2, 0.0)
    else:
        conf_mean = conf_var = np.zeros(0)
    if bounds is None:
        return Standardisation(
            n=n,
            feature_mean=mean,
            feature_std=np.sqrt(var),
            age_mean=age_mean,
            age_std=math.sqrt(age_var),
            confound_mean=conf_mean,
            confound_std=np.sqrt(conf_var),
        )
    return Standardisation(
        n=n,
        feature_mean=bounds.feature_centre + bounds.feature_half * np.clip(mean, -1.0, 1.0),
        feature_std=bounds.feature_half * np.sqrt(var),
        age_mean=bounds.age_centre + bounds.age_half * min(max(age_mean, -1.0), 1.0),
        age_std=bounds.age_half * math.sqrt(age_var),
        confound_mean=bounds.confound_centre + bounds.confound_half * np.clip(conf_mean, -1.0, 1.0),
        confound_std=bounds.confound_half * np.sqrt(conf_var),
        bounds=bounds,
    )


def centred_data(
    X: FloatArray, age: FloatArray, confounds: FloatArray, standardisation: Standardisation
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Clip, pre-scale and centre with the global means; a missing feature value becomes 0."""
    s = standardisation
    if X.shape[1] != s.n_features or confounds.shape[1] != s.n_confounds:
        raise ValueError(
            f"the data have {X.shape[1]} features and {confounds.shape[1]} confounds but the "
            f"standardisation has {s.n_features} and {s.n_confounds}."
        )
    X, age, confounds, _ = clip_to_bounds(X, age, confounds, s.bounds)
    centred = X - s.feature_mean
    if s.bounds is not None:
        centred /= s.feature_half
    np.nan_to_num(centred, copy=False, nan=0.0)
    y = (age - s.age_mean) / s.age_half
    k = (confounds - s.confound_mean) / s.confound_half
    return centred, y, k


def scatter_sums(
    centred: FloatArray, y: FloatArray, k: FloatArray, *, with_xx: bool
) -> CentredSums:
    """The second-round sums of centred data (``sum_xx`` only when ``with_xx``)."""
    y2 = y * y
    if with_xx:
        sum_xx = centred.T @ centred
        diag = np.diag(sum_xx).copy()
    else:
        sum_xx = None
        diag = np.einsum("ij,ij->j", centred, centred)
    return CentredSums(
        n=float(centred.shape[0]),
        sum_x=centred.sum(axis=0),
        diag_xx=diag,
        sum_xx=sum_xx,
        sum_xy=centred.T @ y,
        sum_xy2=centred.T @ y2,
        sum_y=float(y.sum()),
        sum_y2=float(y @ y),
        sum_y3=float(y2 @ y),
        sum_y4=float(y2 @ y2),
        sum_c=k.sum(axis=0),
        sum_cc=k.T @ k,
        sum_xc=centred.T @ k,
        sum_yc=k.T @ y,
        sum_y2c=k.T @ y2,
    )


def local_scatter(
    X: ArrayLike,
    age: ArrayLike,
    standardisation: Standardisation,
    *,
    confounds: ArrayLike | None = None,
    nan_policy: str = "mean",
) -> Tensors:
    """Second-round sums of one node, centred with the global ``standardisation``.

    The clipping bounds are the ones the standardisation was built with.
    """
    features, ages, conf = _validated(X, age, confounds, nan_policy)
    centred, y, k = centred_data(features, ages, conf, standardisation)
    sums = scatter_sums(centred, y, k, with_xx=True)
    assert sums.sum_xx is not None
    tensors: Tensors = {
        "n": np.array(sums.n),
        "sum_x": sums.sum_x,
        "sum_xx": pack_symmetric(sums.sum_xx),
        "sum_xy": sums.sum_xy,
        "sum_xy2": sums.sum_xy2,
        "sum_y": np.array(sums.sum_y),
        "sum_y2": np.array(sums.sum_y2),
        "sum_y3": np.array(sums.sum_y3),
        "sum_y4": np.array(sums.sum_y4),
    }
    if k.shape[1]:
        tensors |= {
            "sum_c": sums.sum_c,
            "sum_cc": pack_symmetric(sums.sum_cc),
            "sum_xc": sums.sum_xc,
            "sum_yc": sums.sum_yc,
            "sum_y2c": sums.sum_y2c,
        }
    return tensors


def sums_from_scatter(
    scatter: Mapping[str, ArrayLike], standardisation: Standardisation
) -> CentredSums:
    """Unpack aggregated scatter tensors (checked against the standardisation's sizes)."""
    p, c = standardisation.n_features, standardisation.n_confounds
    t = check_tensors(SCATTER, scatter, p, c)
    sum_xx = unpack_symmetric(t["sum_xx"], p)
    zeros = np.zeros(0)
    return CentredSums(
        n=float(t["n"]),
        sum_x=t["sum_x"],
        diag_xx=np.diag(sum_xx).copy(),
        sum_xx=sum_xx,
        sum_xy=t["sum_xy"],
        sum_xy2=t["sum_xy2"],
        sum_y=float(t["sum_y"]),
        sum_y2=float(t["sum_y2"]),
        sum_y3=float(t["sum_y3"]),
        sum_y4=float(t["sum_y4"]),
        sum_c=t["sum_c"] if c else zeros,
        sum_cc=unpack_symmetric(t["sum_cc"], c) if c else np.zeros((0, 0)),
        sum_xc=t["sum_xc"] if c else np.zeros((p, 0)),
        sum_yc=t["sum_yc"] if c else zeros,
        sum_y2c=t["sum_y2c"] if c else zeros,
    )


def model_from_scatter(
    scatter: Mapping[str, ArrayLike],
    standardisation: Standardisation,
    *,
    model: str = "unbiased",
    n_components: int | None = None,
    feature_proportion: float | None = None,
    variance_explained: float | None = None,
    kaiser_guttman: bool = False,
    nan_policy: str = "mean",
) -> BrainAgeModel:
    """Fitted :class:`~node.deltab.model.BrainAgeModel` from aggregated scatter tensors.

    ``nan_policy`` is recorded in the model (how it treats missing values when
    predicting); it must be the policy the nodes used.
    """
    from node.deltab.model import BrainAgeModel

    check_nan_policy(nan_policy, FEDERATED_NAN_POLICIES)
    estimator = BrainAgeModel(
        model,
        n_components=n_components,
        feature_proportion=feature_proportion,
        variance_explained=variance_explained,
        kaiser_guttman=kaiser_guttman,
        nan_policy=nan_policy,
    )
    sums = sums_from_scatter(scatter, standardisation)
    return estimator._fit_from_sums(sums, standardisation)


def count_clipped(
    X: ArrayLike,
    age: ArrayLike,
    bounds: Bounds,
    *,
    confounds: ArrayLike | None = None,
    nan_policy: str = "mean",
) -> ClipCounts:
    """Values of the subjects a node uses that lie outside the public bounds (kept locally)."""
    features, ages, conf = _validated(X, age, confounds, nan_policy)
    return clip_counts(features, ages, conf, bounds)


def sensitivity(
    round_name: str, bounds: Bounds, standardisation: Standardisation | None = None
) -> dict[str, float]:
    """L2 sensitivity of each tensor to adding or removing one subject.

    Derivation. After clipping and pre-scaling every feature value x', age a'
    and confound k' lies in [-1, 1]. A subject changes each sum by its own
    term, so the sensitivity of a tensor is the largest L2 norm of one
    subject's term (replacing a subject, rather than adding or removing one,
    doubles every figure).

    moments: n → 1; count_x → ‖indicator‖ ≤ √P; sum_x → ‖x'‖ ≤ √P; sum_x2 →
    ‖x'²‖ ≤ √P; sum_y, sum_y2 → 1; sum_c, sum_c2 → √C.

    scatter: values are centred with the public global means m (in [-1, 1]),
    so |c_j| ≤ β_j = 1 + |m_j|, |y| ≤ α = 1 + |m_age|, |k_l| ≤ κ_l = 1 + |m_l|
    (without a standardisation, the worst case β = α = κ = 2). Then n → 1;
    sum_x → ‖β‖; sum_xx (packed triangle) → ‖vech(c cᵀ)‖ ≤ ‖c cᵀ‖_F = ‖c‖² ≤
    ‖β‖²; sum_xy → ‖β‖α; sum_xy2 → ‖β‖α²; sum_yᵗ → αᵗ; sum_c → ‖κ‖; sum_cc →
    ‖κ‖²; sum_xc → ‖c kᵀ‖_F ≤ ‖β‖‖κ‖; sum_yc → α‖κ‖; sum_y2c → α²‖κ‖.

    The whole round's sensitivity is the L2 norm of these figures
    (:func:`round_sensitivity`). Conditioning the second round on the released
    first-round means is sound under adaptive composition.

    The one-release plan's rounds ("means", "sums") take their figures from
    ``sums.sensitivity``, which needs the bounds only (``standardisation``
    is ignored).
    """
    if round_name in ONE_RELEASE_ROUNDS:
        return one_release_sensitivity(round_name, bounds)
    p, c = bounds.n_features, bounds.n_confounds
    if round_name == MOMENTS:
        out = {
            "n": 1.0,
            "count_x": math.sqrt(p),
            "sum_x": math.sqrt(p),
            "sum_x2": math.sqrt(p),
            "sum_y": 1.0,
            "sum_y2": 1.0,
        }
        if c:
            out |= {"sum_c": math.sqrt(c), "sum_c2": math.sqrt(c)}
        return out
    if round_name != SCATTER:
        raise ValueError(f"round_name must be one of {KNOWN_ROUNDS}; got {round_name!r}.")
    if standardisation is None:
        beta = 2.0 * math.sqrt(p)
        alpha = 2.0
        kappa = 2.0 * math.sqrt(c)
    else:
        if standardisation.bounds is None:
            raise ValueError(
                "the standardisation was built without bounds, so its scatter round does not "
                "clip and has no finite sensitivity."
            )
        m = np.abs(standardisation.feature_mean - bounds.feature_centre) / bounds.feature_half
        beta = float(np.linalg.norm(1.0 + np.minimum(m, 1.0)))
        m_age = abs(standardisation.age_mean - bounds.age_centre) / bounds.age_half
        alpha = 1.0 + min(m_age, 1.0)
        m_conf = np.abs(standardisation.confound_mean - bounds.confound_centre)
        m_conf /= bounds.confound_half
        kappa = float(np.linalg.norm(1.0 + np.minimum(m_conf, 1.0)))
    out = {
        "n": 1.0,
        "sum_x": beta,
        "sum_xx": beta**2,
        "sum_xy": beta * alpha,
        "sum_xy2": beta * alpha**2,
        "sum_y": alpha,
        "sum_y2": alpha**2,
        "sum_y3": alpha**3,
        "sum_y4": alpha**4,
    }
    if c:
        out |= {
            "sum_c": kappa,
            "sum_cc": kappa**2,
            "sum_xc": beta * kappa,
            "sum_yc": alpha * kappa,
            "sum_y2c": alpha**2 * kappa,
        }
    return out


def round_sensitivity(
    round_name: str, bounds: Bounds, standardisation: Standardisation | None = None
) -> float:
    """L2 sensitivity of all of a round's tensors taken together."""
    return math.sqrt(sum(v * v for v in sensitivity(round_name, bounds, standardisation).values()))
