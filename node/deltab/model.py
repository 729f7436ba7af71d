"""Brain-age delta estimation (Smith et al. 2019) as a scikit-learn-style estimator.

Smith, Vidaurre, Alfaro-Almagro, Nichols & Miller (2019), "Estimation of brain
age delta from brain imaging", NeuroImage 200:528-539. The maths, and how it
reduces to sums over subjects, is in ``_solve``; this module handles the
data: validation, missing values, the choice between the two exact eigen
routes, and prediction.

Points where this implementation departs from the public ``deltab`` tool, each
a correction of its maths:

* Y²ₒ is Y² (demeaned) minus its projection on Y, a - y(yᵀa)/(yᵀy); the tool
  subtracts the scalar (y/‖y‖)ᵀa instead, which leaves Y²ₒ correlated with Y.
* Prediction uses the training set's statistics (mean of Y², the projection
  coefficient, the confound adjustments), so one subject's delta does not
  depend on which other subjects are predicted alongside it; the tool
  recomputes them from the prediction batch (a lone subject gets NaN).
* The features are replaced by the unit-norm eigenvectors U = Z V S⁻¹ as the
  paper prescribes, not by the PCA scores Z V = U S; the alternate models are
  not invariant to that scaling.
* The decomposition is an exact symmetric eigensolver with fixed signs, so the
  same data always give the same model bit for bit.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from node.deltab._checks import (
    BoolArray,
    FloatArray,
    as_age,
    as_confounds,
    as_features,
    check_all_nan_features,
    check_nan_policy,
    complete_rows,
    first_missing_age,
)
from node.deltab._params import ALTERNATE_MODELS, QUADRATIC_MODELS, Reduction, check_model
from node.deltab._solve import CentredSums, ExplicitData, Solution, solve
from node.deltab.exceptions import DeltabWarning, NotFittedError
from node.deltab.scaling import Standardisation
from node.deltab.stats import (
    centred_data,
    local_moments,
    scatter_sums,
    standardisation_from_moments,
)

__all__ = ["BrainAgeModel"]

_PARAM_NAMES = (
    "model",
    "n_components",
    "feature_proportion",
    "variance_explained",
    "kaiser_guttman",
    "nan_policy",
)
_DEFAULTS: dict[str, Any] = {
    "model": "unbiased",
    "n_components": None,
    "feature_proportion": None,
    "variance_explained": None,
    "kaiser_guttman": False,
    "nan_policy": "median",
}

# Attributes a fitted model carries (all learned attributes end in "_").
FITTED_ARRAYS = (
    "feature_fill_",
    "feature_mean_",
    "feature_scale_",
    "support_",
    "confound_mean_",
    "confound_scale_",
    "feature_adjust_",
    "age_adjust_",
    "agesq_adjust_",
    "components_",
    "singular_values_",
    "explained_variance_",
    "b1_",
    "b2_",
    "b2sq_",
    "gamma_",
    "gammasq_",
)
FITTED_SCALARS = (
    "n_features_in_",
    "n_confounds_",
    "n_components_",
    "n_subjects_",
    "age_mean_",
    "age_scale_",
    "agesq_orth_",
    "total_variance_",
)


class BrainAgeModel:
    """Brain age and brain-age delta from imaging features (Smith et al. 2019).

    Parameters
    ----------
    model:
        Which delta to report: ``"simple"`` (δ₁ = Uβ₁ - Y, biased towards the
        mean age), ``"unbiased"`` (δ₂ = δ₁ - Yβ₂), ``"unbiased_quadratic"``
        (δ₂q = δ₁ - [Y Y²ₒ]β₂), ``"alternate"`` and ``"alternate_quadratic"``
        (age predicts the features; δ₃ = (U - Y₂Λ)λ₁⁺). Every model is fitted
        at once, so ``set_params(model=...)`` switches without refitting.
    n_components, feature_proportion, variance_explained, kaiser_guttman:
        At most one: keep this many principal components; ``floor(p · P)`` of
        them (at least 1); the fewest that explain this fraction of the
        variance; or those with above-average eigenvalue (Kaiser-Guttman).
        With none, every component up to the numerical rank is kept.
    nan_policy:
        ``"median"`` (impute a missing feature value with that feature's
        training median, learned at fit and reused at prediction), ``"mean"``
        (likewise with the mean; the rule the federated fit can reproduce) or
        ``"drop"`` (leave out subjects with any missing value; at prediction
        they get NaN).

    Confounds, an optional (N, C) array passed to ``fit`` and ``predict_*``,
    are regressed out of the standardised features and of the age terms with
    coefficients learned at fit (see ``_solve``).
    """

    def __init__(
        self,
        model: str = "unbiased",
        *,
        n_components: int | None = None,
        feature_proportion: float | None = None,
        variance_explained: float | None = None,
        kaiser_guttman: bool = False,
        nan_policy: str = "median",
    ) -> None:
        self.model = model
        self.n_components = n_components
        self.feature_proportion = feature_proportion
        self.variance_explained = variance_explained
        self.kaiser_guttman = kaiser_guttman
        self.nan_policy = nan_policy

    # -- scikit-learn estimator protocol -------------------------------------------------

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor parameters (``deep`` is accepted for scikit-learn compatibility)."""
        return {name: getattr(self, name) for name in _PARAM_NAMES}

    def set_params(self, **params: Any) -> BrainAgeModel:
        """Change parameters; unknown names are refused before anything is changed."""
        unknown = sorted(set(params) - set(_PARAM_NAMES))
        if unknown:
            raise ValueError(
                f"BrainAgeModel has no parameter(s) {unknown}; valid parameters are "
                f"{list(_PARAM_NAMES)}."
            )
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        changed = [
            f"{name}={getattr(self, name)!r}"
            for name in _PARAM_NAMES
            if getattr(self, name) != _DEFAULTS[name]
        ]
        return f"BrainAgeModel({', '.join(changed)})"

    def _reduction(self) -> Reduction:
        return Reduction.from_params(
            self.n_components, self.feature_proportion, self.variance_explained, self.kaiser_guttman
        )

    # -- fitting -------------------------------------------------------------------------

    def fit(
        self, X: ArrayLike, age: ArrayLike, confounds: ArrayLike | None = None
    ) -> BrainAgeModel:
        """Fit to features ``X`` (N, P), ages (N,) and optional confounds (N, C)."""
        check_model(self.model)
        nan_policy = check_nan_policy(self.nan_policy)
        self._reduction()
        features = as_features(X)
        ages = as_age(age, features.shape[0])
        conf = as_confounds(confounds, features.shape[0])
        check_all_nan_features(features)

        fill: FloatArray | None = None
        if nan_policy == "drop":
            keep = complete_rows(features, ages)
            if not keep.any():
                raise ValueError(
                    "every subject has a missing feature value or age, so nan_policy='drop' "
                    "leaves no one to train on."
                )
            if not keep.all():
                features, ages, conf = features[keep], ages[keep], conf[keep]
        else:
            missing = first_missing_age(ages)
            if missing is not None:
                raise ValueError(
                    f"age[{missing}] is missing (NaN); ages cannot be imputed — remove that "
                    "subject or use nan_policy='drop'."
                )
            if nan_policy == "median":
                fill = np.nanmedian(features, axis=0)
                if np.isnan(features).any():
                    features = np.where(np.isnan(features), fill, features)

        # The pooled fit is the one-site case of the federated fit: the same moments,
        # the same centring, the same solve.
        moments = local_moments(features, ages, confounds=conf, nan_policy="mean")
        standardisation = standardisation_from_moments(moments)
        centred, y, k = centred_data(features, ages, conf, standardisation)
        n, p = centred.shape
        if p > n:
            sums = scatter_sums(centred, y, k, with_xx=False)
            nuisance = np.column_stack([np.ones(n), k])
            explicit: ExplicitData | None = ExplicitData(centred, nuisance)
        else:
            sums = scatter_sums(centred, y, k, with_xx=True)
            explicit = None
        del centred
        return self._fit_from_sums(sums, standardisation, explicit=explicit, fill=fill)

    def _fit_from_sums(
        self,
        sums: CentredSums,
        standardisation: Standardisation,
        *,
        explicit: ExplicitData | None = None,
        fill: FloatArray | None = None,
        noisy: bool = False,
    ) -> BrainAgeModel:
        check_model(self.model)
        check_nan_policy(self.nan_policy)
        reduction = self._reduction()
        if noisy:
            reduction = dataclasses.replace(reduction, at_most_supported=True)
        solution = solve(sums, standardisation.feature_location, reduction, explicit)
        self._check_usable(solution.quadratic_degenerate, solution.gamma, solution.gammasq)
        self._adopt(
            solution, standardisation, standardisation.feature_mean if fill is None else fill
        )
        return self

    def _adopt(self, solution: Solution, s: Standardisation, fill: FloatArray) -> None:
        self.n_features_in_ = s.n_features
        self.n_confounds_ = s.n_confounds
        self.n_subjects_ = solution.n
        self.feature_fill_ = np.asarray(fill, dtype=np.float64).copy()
        self.feature_mean_ = s.feature_mean.copy()
        self.feature_scale_ = solution.feature_std * s.feature_half
        self.support_ = solution.support.copy()
        self.age_mean_ = float(s.age_mean)
        self.age_scale_ = float(s.age_half)
        self.confound_mean_ = s.confound_mean.copy()
        self.confound_scale_ = s.confound_half.copy()
        self.feature_adjust_ = solution.feature_adjust
        self.age_adjust_ = solution.age_adjust
        self.agesq_adjust_ = solution.agesq_adjust
        self.agesq_orth_ = float(solution.agesq_orth)
        self.components_ = solution.components
        self.singular_values_ = solution.singular_values
        self.n_components_ = int(solution.singular_values.size)
        self.explained_variance_ = solution.explained_variance
        self.total_variance_ = float(solution.total_variance)
        self.b1_ = solution.b1
        self.b2_ = solution.b2
        self.b2sq_ = solution.b2sq
        self.gamma_ = solution.gamma
        self.gammasq_ = solution.gammasq

    def _check_usable(
        self, quadratic_degenerate: bool, gamma: FloatArray, gammasq: FloatArray
    ) -> None:
        if self.model in QUADRATIC_MODELS and quadratic_degenerate:
            warnings.warn(
                "age squared is (almost) a linear function of age in the training data (too few "
                "distinct ages), so the quadratic term is left out of the "
                f"{self.model!r} model.",
                DeltabWarning,
                stacklevel=4,
            )
        if self.model in ALTERNATE_MODELS:
            row = gamma[0] if self.model == "alternate" else gammasq[0]
            if not float(row @ row) > 0.0:
                raise ValueError(
                    f"the {self.model!r} model is undefined: none of the retained components "
                    "varies with age in the training data."
                )

    # -- prediction ----------------------------------------------------------------------

    @property
    def explained_variance_ratio_(self) -> FloatArray:
        self._check_fitted()
        ratio: FloatArray = self.explained_variance_ / self.total_variance_
        return ratio

    def _check_fitted(self) -> None:
        if not hasattr(self, "b1_"):
            raise NotFittedError(
                "this BrainAgeModel is not fitted yet; call fit(X, age) or load a saved model."
            )

    def _inputs(
        self, X: ArrayLike, age: ArrayLike | None, confounds: ArrayLike | None
    ) -> tuple[FloatArray, FloatArray | None, FloatArray, BoolArray]:
        """Checked features (missing values filled), ages, confounds, and rows left blank."""
        self._check_fitted()
        nan_policy = check_nan_policy(self.nan_policy)
        features = as_features(X)
        if features.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {features.shape[1]} features but the model was fitted with "
                f"{self.n_features_in_}."
            )
        n = features.shape[0]
        ages = None if age is None else as_age(age, n)
        if self.n_confounds_ and confounds is None:
            raise ValueError(
                f"the model was fitted with {self.n_confounds_} confound(s); pass the same "
                "confounds for the subjects being predicted."
            )
        conf = as_confounds(confounds, n)
        if conf.shape[1] != self.n_confounds_:
            raise ValueError(
                f"confounds has {conf.shape[1]} column(s) but the model was fitted with "
                f"{self.n_confounds_}."
            )
        missing_x = np.isnan(features).any(axis=1)
        missing_age = np.zeros(n, dtype=bool) if ages is None else np.isnan(ages)
        blank = np.zeros(n, dtype=bool)
        if nan_policy == "drop":
            blank = missing_x | missing_age
            if blank.any():
                warnings.warn(
                    f"{int(blank.sum())} subject(s) have missing values and get no estimate "
                    "(nan_policy='drop').",
                    DeltabWarning,
                    stacklevel=3,
                )
        elif missing_age.any():
            index = int(np.flatnonzero(missing_age)[0])
            raise ValueError(f"age[{index}] is missing (NaN); a delta needs the subject's age.")
        if missing_x.any():
            features = np.where(np.isnan(features), self.feature_fill_, features)
        if ages is not None and blank.any():
            ages = np.where(blank, self.age_mean_, ages)
        return features, ages, conf, blank

    def _nuisance(self, conf: FloatArray) -> FloatArray:
        scaled = (conf - self.confound_mean_) / self.confound_scale_
        return np.column_stack([np.ones(conf.shape[0]), scaled])

    def _reduce(self, features: FloatArray, nuisance: FloatArray) -> FloatArray:
        support = self.support_
        if not support.all():
            features = features[:, support]
        z = features - self.feature_mean_[support]
        z /= self.feature_scale_[support]
        projection = self.components_ / self.singular_values_
        reduced: FloatArray = z @ projection - nuisance @ (self.feature_adjust_ @ projection)
        return reduced

    def transform(self, X: ArrayLike, confounds: ArrayLike | None = None) -> FloatArray:
        """The reduced features ũ = z̃ V S⁻¹ (N, n_components_): on the training data, U itself."""
        features, _, conf, blank = self._inputs(X, None, confounds)
        reduced = self._reduce(features, self._nuisance(conf))
        reduced[blank] = np.nan
        return reduced

    def _age_terms(self, ages: FloatArray, nuisance: FloatArray) -> tuple[FloatArray, FloatArray]:
        """ỹ and Y²ₒ for given ages, with the training set's adjustments (model units)."""
        y = (ages - self.age_mean_) / self.age_scale_
        y_adj = y - nuisance @ self.age_adjust_
        q = (y * y - nuisance @ self.agesq_adjust_) - self.agesq_orth_ * y_adj
        return y_adj, q

    def predict_delta(
        self, X: ArrayLike, age: ArrayLike, confounds: ArrayLike | None = None
    ) -> FloatArray:
        """Brain-age delta in years (brain age minus age) of the chosen ``model``."""
        model = check_model(self.model)
        features, ages, conf, blank = self._inputs(X, age, confounds)
        assert ages is not None
        nuisance = self._nuisance(conf)
        u = self._reduce(features, nuisance)
        y, q = self._age_terms(ages, nuisance)
        if model in ALTERNATE_MODELS:
            if model == "alternate":
                lam = self.gamma_[0]
                residual = u - np.outer(y, lam)
            else:
                lam = self.gammasq_[0]
                residual = u - np.outer(y, lam) - np.outer(q, self.gammasq_[1])
            delta = residual @ lam / float(lam @ lam)
        else:
            delta = u @ self.b1_ - y
            if model == "unbiased":
                delta -= y * self.b2_[0]
            elif model == "unbiased_quadratic":
                delta -= y * self.b2sq_[0] + q * self.b2sq_[1]
        years: FloatArray = delta * self.age_scale_
        years[blank] = np.nan
        return years

    def predict_age(
        self, X: ArrayLike, age: ArrayLike, confounds: ArrayLike | None = None
    ) -> FloatArray:
        """Brain age in years: age plus the chosen ``model``'s delta."""
        delta = self.predict_delta(X, age, confounds)
        brain_age: FloatArray = np.asarray(age, dtype=np.float64) + delta
        return brain_age

    def predict(
        self, X: ArrayLike, age: ArrayLike, confounds: ArrayLike | None = None
    ) -> FloatArray:
        """Same as :meth:`predict_age`."""
        return self.predict_age(X, age, confounds)
