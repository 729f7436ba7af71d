"""The brain-age delta fit from sums over subjects (Smith et al. 2019).

Smith, Vidaurre, Alfaro-Almagro, Nichols & Miller (2019), "Estimation of brain
age delta from brain imaging", NeuroImage 200:528-539, section 2 and the
recipe in their appendix:

1. Y is age, X the subjects-by-features imaging matrix; both are demeaned and
   the features standardised (here: with the pooled means and standard
   deviations, population form).
2. X is replaced by its top eigenvectors U (unit-norm columns, X = U S Vᵀ).
3. Y² is demeaned and orthogonalised with respect to Y, giving Y²ₒ; Y₂ = [Y Y²ₒ].
4. Simple model: β₁ = U⁺Y, δ₁ = Uβ₁ - Y.
5. Unbiased model: δ₁ = Y₂β₂ + δ₂ (or [Y]β₂ for the linear form), so
   δ₂ = δ₁ - Y₂β₂ no longer depends on age in the training set.
6. Alternate model: age predicts the imaging, U = Y₂Λ + E, and the delta is the
   age shift that best explains a subject's features: δ₃ = (U - Y₂Λ) λ₁⁺ with
   λ₁ the first (linear) row of Λ.

Confounds enter as nuisance regressors: together with the intercept they are
regressed out of the standardised features (before the PCA) and out of the age
terms Y and Y² (before Y² is orthogonalised against Y). Removing them from both
sides keeps the training-set delta orthogonal to the confounds as well as to
age; without confounds the nuisance set is the intercept alone and the steps
reduce exactly to the recipe above.

Every quantity above is a function of a handful of sums over subjects — N, Σc,
Σc cᵀ, Σc y, Σc y², Σyᵏ (k ≤ 4) and the confound cross-products — because the
regressions only need inner products: with orthonormal U, β₁ = Uᵀy = S⁻¹VᵀZᵀy.
This module computes the fit from those sums, so that a model built from sums
aggregated across sites equals the model fitted to the pooled data.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from node.deltab._checks import BoolArray, FloatArray
from node.deltab._linalg import (
    eigh_descending,
    fix_signs,
    numerical_rank,
    right_vectors_from_gram,
    symmetrise,
)
from node.deltab._params import Reduction
from node.deltab.exceptions import DeltabWarning

# A centred feature whose spread is below this fraction of its own magnitude is
# rounding noise around a constant.
CONSTANT_RTOL = 1e-12
# The orthogonalised Y² is taken as absent when (almost) all of Y² is explained
# by Y — e.g. a cohort with only two distinct ages.
QUADRATIC_RTOL = 1e-10
# Rows of a P × P matrix updated at a time (a few MB of temporaries).
_BLOCK = 256


@dataclass(frozen=True, eq=False)
class CentredSums:
    """Sums over subjects of products of centred, pre-scaled variables.

    c = (x - mean) / half per feature, y = (age - mean) / half, k likewise per
    confound (see ``scaling``). ``sum_xx`` may be omitted when the spectrum is
    computed from the data themselves (``ExplicitData``); its diagonal is always
    needed for the feature standard deviations. ``solve`` overwrites ``sum_xx``
    (it turns it into the scatter of the standardised, residualised features in
    place), so a caller hands over sums it does not use afterwards.
    """

    n: float
    sum_x: FloatArray
    diag_xx: FloatArray
    sum_xx: FloatArray | None
    sum_xy: FloatArray
    sum_xy2: FloatArray
    sum_y: float
    sum_y2: float
    sum_y3: float
    sum_y4: float
    sum_c: FloatArray
    sum_cc: FloatArray
    sum_xc: FloatArray
    sum_yc: FloatArray
    sum_y2c: FloatArray


@dataclass(frozen=True, eq=False)
class ExplicitData:
    """The centred features (N, P) and nuisance regressors [1, k] (N, 1 + C) of one cohort.

    ``solve`` overwrites ``features`` (it residualises and scales them in place).
    """

    features: FloatArray
    nuisance: FloatArray


@dataclass(frozen=True, eq=False)
class Solution:
    """Everything a fitted model needs, in pre-scaled (model) units.

    Prediction for a subject with centred, pre-scaled features c, age term y and
    nuisance row w = [1, k]:
      z = c[support] / feature_std;  ũ = (z - w·feature_adjust) V / S
      ỹ = y - w·age_adjust;  q = (y² - w·agesq_adjust) - agesq_orth·ỹ
    and then the chosen model's delta from b1, b2, b2sq, gamma, gammasq.
    """

    n: float
    support: BoolArray
    feature_std: FloatArray
    feature_adjust: FloatArray
    age_adjust: FloatArray
    agesq_adjust: FloatArray
    agesq_orth: float
    components: FloatArray
    singular_values: FloatArray
    explained_variance: FloatArray
    total_variance: float
    b1: FloatArray
    b2: FloatArray
    b2sq: FloatArray
    gamma: FloatArray
    gammasq: FloatArray
    quadratic_degenerate: bool


def _nuisance_gram(sums: CentredSums) -> FloatArray:
    c = sums.sum_c.size
    g00 = np.empty((1 + c, 1 + c))
    g00[0, 0] = sums.n
    g00[0, 1:] = sums.sum_c
    g00[1:, 0] = sums.sum_c
    g00[1:, 1:] = sums.sum_cc
    return g00


def _check_nuisance(g00: FloatArray) -> None:
    """Refuse confounds that are constant or linear combinations of one another."""
    n = g00[0, 0]
    if not n >= 2:
        raise ValueError(f"at least 2 subjects are needed to fit the model; got {n:g}.")
    centred = g00[1:, 1:] - np.outer(g00[0, 1:], g00[0, 1:]) / n
    variances = np.diag(centred)
    scale = np.maximum(np.diag(g00[1:, 1:]) / n, 1e-300)
    flat = np.flatnonzero(variances / n <= 1e-12 * scale)
    if flat.size:
        raise ValueError(
            f"confound {int(flat[0])} is constant across the training subjects; "
            "remove it (the model already has an intercept)."
        )
    if centred.shape[0] > 1:
        d = np.sqrt(variances)
        smallest = np.linalg.eigvalsh(centred / np.outer(d, d))[0]
        if smallest <= 1e-10:
            raise ValueError(
                "the confounds are collinear (one is a linear combination of the others); "
                "remove the redundant columns."
            )


def _feature_support(sums: CentredSums, location: FloatArray) -> tuple[BoolArray, FloatArray]:
    n = sums.n
    variance = (sums.diag_xx - sums.sum_x**2 / n) / n
    std = np.sqrt(np.maximum(variance, 0.0))
    support: BoolArray = (variance > 0.0) & (std > CONSTANT_RTOL * location)
    if not support.any():
        raise ValueError("no feature varies across the training subjects; nothing to model.")
    dropped = np.flatnonzero(~support)
    if dropped.size:
        shown = ", ".join(str(int(i)) for i in dropped[:10])
        more = "" if dropped.size <= 10 else f" and {dropped.size - 10} more"
        warnings.warn(
            f"{dropped.size} feature(s) have no variance in the training data and are left out "
            f"of the model (feature indices {shown}{more}).",
            DeltabWarning,
            stacklevel=5,  # the caller of fit / model_from_sums / model_from_scatter
        )
    return support, std


def _age_terms(r_aa: FloatArray, sum_y2: float) -> tuple[float, float, float, bool]:
    """From the residualised 2 × 2 Gram of (age, age²): age's sum of squares, the share of
    age in age², the sum of squares of age² orthogonal to age, whether that is degenerate."""
    yy = float(r_aa[0, 0])
    if not yy > 1e-12 * max(sum_y2, 1e-300):
        raise ValueError(
            "age does not vary across the training subjects (after removing the confounds); "
            "a brain-age model needs a range of ages."
        )
    orth = float(r_aa[0, 1]) / yy
    qq = float(r_aa[1, 1]) - orth * float(r_aa[0, 1])
    return yy, orth, qq, not qq > QUADRATIC_RTOL * max(float(r_aa[1, 1]), 1e-300)


def _scatter_eigh(
    sums: CentredSums,
    support: BoolArray,
    std: FloatArray,
    coef_c: FloatArray,
    gc0: FloatArray,
) -> tuple[FloatArray, FloatArray, float]:
    """Eigenvalues (descending), eigenvectors and trace of the residualised, scaled scatter."""
    if sums.sum_xx is None:
        raise ValueError("the scatter sum_xx is required when the data are not given.")
    # The scatter is worked out inside sums.sum_xx (scratch space of the caller,
    # like ExplicitData.features), a block of rows at a time: the P × P scatter
    # is the only matrix of that size besides what eigh needs.
    scatter = sums.sum_xx if support.all() else sums.sum_xx[np.ix_(support, support)]
    adjust = coef_c[:, support]
    for i in range(0, int(support.sum()), _BLOCK):
        rows = slice(i, i + _BLOCK)
        scatter[rows] -= gc0[rows] @ adjust
    scatter /= std[:, np.newaxis]
    scatter /= std[np.newaxis, :]
    symmetrise(scatter)  # exact symmetry: (s_ij + s_ji) / 2 on both sides
    total = float(np.trace(scatter))
    eigenvalues, eigenvectors = eigh_descending(scatter)
    return eigenvalues, eigenvectors, total


def _gram_eigh(
    explicit: ExplicitData, support: BoolArray, std: FloatArray, coef_c: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, float]:
    """The residualised, scaled features (in place), and the eigenvalues (descending),
    eigenvectors and trace of their N × N Gram matrix."""
    # The features are scratch space owned by the caller: work in place.
    z = explicit.features if support.all() else explicit.features[:, support]
    if coef_c.shape[0] == 1:
        z -= coef_c[0, support]
    else:
        z -= explicit.nuisance @ coef_c[:, support]
    z /= std
    gram = z @ z.T
    total = float(np.trace(gram))
    eigenvalues, eigenvectors = eigh_descending(gram)
    return z, eigenvalues, eigenvectors, total


def solve(
    sums: CentredSums,
    location: FloatArray,
    reduction: Reduction,
    explicit: ExplicitData | None = None,
) -> Solution:
    """Fit every delta model at once from the sums (and the data, if given).

    ``location`` is |feature mean| in pre-scaled units, the yardstick for
    spotting constant features. With ``explicit`` the eigenvectors come from the
    N×N Gram matrix of the residualised features (fast when P > N); otherwise
    from the P×P scatter in ``sums.sum_xx``.
    """
    p = sums.sum_x.size
    g00 = _nuisance_gram(sums)
    _check_nuisance(g00)
    m0 = g00.shape[0]
    n = sums.n

    g0c = np.vstack([sums.sum_x[np.newaxis, :], sums.sum_xc.T])
    g0a = np.column_stack([np.r_[sums.sum_y, sums.sum_yc], np.r_[sums.sum_y2, sums.sum_y2c]])
    coef = np.linalg.solve(g00, np.hstack([g0c, g0a]))
    coef_c, coef_a = coef[:, :p], coef[:, p:]

    support, std_all = _feature_support(sums, location)
    std = std_all[support]
    feature_adjust = coef_c[:, support] / std
    gc0 = g0c.T[support]
    gca = np.column_stack([sums.sum_xy[support], sums.sum_xy2[support]])
    cross = (gca - gc0 @ coef_a) / std[:, np.newaxis]

    gaa = np.array([[sums.sum_y2, sums.sum_y3], [sums.sum_y3, sums.sum_y4]])
    yy, orth, qq, quadratic_degenerate = _age_terms(gaa - g0a.T @ coef_a, sums.sum_y2)
    cross_y = cross[:, 0]
    cross_q = cross[:, 1] - orth * cross[:, 0]

    p_kept = int(support.sum())
    if explicit is None:
        eigenvalues, eigenvectors, total = _scatter_eigh(sums, support, std, coef_c, gc0)
        z = None
    else:
        z, eigenvalues, eigenvectors, total = _gram_eigh(explicit, support, std, coef_c)

    rank = numerical_rank(eigenvalues)
    k = reduction.choose(
        eigenvalues,
        total=total,
        n_features=p_kept,
        rank=rank,
        n_subjects=n,
        n_nuisance=m0,
    )
    if z is None:
        components = eigenvectors[:, :k]
    else:
        components = right_vectors_from_gram(z, eigenvalues, eigenvectors, k)
    components = fix_signs(np.ascontiguousarray(components))
    singular = np.sqrt(eigenvalues[:k])

    proj_y = (components.T @ cross_y) / singular
    proj_q = (components.T @ cross_q) / singular
    # U is orthonormal by construction, so U⁺ = Uᵀ and ỹᵀU = β₁ᵀ.
    b1 = proj_y
    y_delta = float(b1 @ b1) - yy
    q_delta = float(proj_q @ b1)
    b2 = np.array([y_delta / yy])
    quad = 0.0 if quadratic_degenerate else q_delta / qq
    b2sq = np.array([y_delta / yy, quad])
    gamma = (proj_y / yy)[np.newaxis, :]
    quad_row = np.zeros(k) if quadratic_degenerate else proj_q / qq
    gammasq = np.vstack([proj_y / yy, quad_row])

    return Solution(
        n=float(n),
        support=support,
        feature_std=np.where(support, std_all, 1.0),
        feature_adjust=feature_adjust,
        age_adjust=coef_a[:, 0].copy(),
        agesq_adjust=coef_a[:, 1].copy(),
        agesq_orth=orth,
        components=components,
        singular_values=singular,
        explained_variance=eigenvalues[:k] / n,
        total_variance=total / n,
        b1=b1,
        b2=b2,
        b2sq=b2sq,
        gamma=gamma,
        gammasq=gammasq,
        quadratic_degenerate=quadratic_degenerate,
    )
