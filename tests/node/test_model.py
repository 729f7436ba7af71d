"""BrainAgeModel: the maths of Smith et al. (2019), the estimator protocol, input handling."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from node.deltab import MODELS, BrainAgeModel, DeltabWarning, NotFittedError
from tests.support.cohorts import Cohort, CohortFactory, correlation

FloatArray = NDArray[np.float64]


def reference_deltas(
    X: FloatArray, age: FloatArray, k: int, confounds: FloatArray | None = None
) -> dict[str, FloatArray]:
    """The paper's recipe written out plainly (full SVD, pseudo-inverses)."""
    z = (X - X.mean(axis=0)) / X.std(axis=0)
    y = age - age.mean()
    a = y**2
    if confounds is not None:
        w = np.column_stack([np.ones(len(age)), confounds])
        hat = w @ np.linalg.pinv(w)
        z, y, a = z - hat @ z, y - hat @ y, a - hat @ a
    else:
        a = a - a.mean()
    q = a - y * (y @ a) / (y @ y)
    u = np.linalg.svd(z, full_matrices=False)[0][:, :k]
    delta1 = u @ (np.linalg.pinv(u) @ y) - y
    y1 = y[:, np.newaxis]
    y2 = np.column_stack([y, q])
    lam1 = np.linalg.pinv(y1) @ u
    lam2 = np.linalg.pinv(y2) @ u
    return {
        "simple": delta1,
        "unbiased": delta1 - y1 @ (np.linalg.pinv(y1) @ delta1),
        "unbiased_quadratic": delta1 - y2 @ (np.linalg.pinv(y2) @ delta1),
        "alternate": (u - y1 @ lam1) @ np.linalg.pinv(lam1[:1]).ravel(),
        "alternate_quadratic": (u - y2 @ lam2) @ np.linalg.pinv(lam2[:1]).ravel(),
    }


# -- the maths ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(250, 20), (60, 150)])  # P ≤ N and P > N routes
def test_every_model_matches_the_plain_recipe(
    cohort_factory: CohortFactory, shape: tuple[int, int]
) -> None:
    data = cohort_factory(3, n=shape[0], p=shape[1])
    expected = reference_deltas(data.X, data.age, 7)
    for name in MODELS:
        model = BrainAgeModel(name, n_components=7).fit(data.X, data.age)
        np.testing.assert_allclose(
            model.predict_delta(data.X, data.age), expected[name], rtol=1e-8, atol=1e-8
        )


def test_confounds_match_the_plain_recipe(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(4, n=300, p=25, n_confounds=2)
    expected = reference_deltas(data.X, data.age, 6, data.confounds)
    for name in MODELS:
        model = BrainAgeModel(name, n_components=6).fit(data.X, data.age, data.confounds)
        np.testing.assert_allclose(
            model.predict_delta(data.X, data.age, data.confounds),
            expected[name],
            rtol=1e-8,
            atol=1e-8,
        )


def test_confound_adjusted_delta_is_orthogonal_to_confounds_and_age(
    cohort_factory: CohortFactory,
) -> None:
    data = cohort_factory(5, n=400, p=25, n_confounds=2)
    assert data.confounds is not None
    model = BrainAgeModel("unbiased_quadratic", n_components=6).fit(
        data.X, data.age, data.confounds
    )
    delta = model.predict_delta(data.X, data.age, data.confounds)
    for column in (data.age, data.age**2, *data.confounds.T):
        assert abs(correlation(delta, column)) < 1e-9


def test_simple_model_with_every_component_is_ordinary_least_squares(cohort: Cohort) -> None:
    from sklearn.linear_model import LinearRegression

    model = BrainAgeModel("simple").fit(cohort.X, cohort.age)
    assert model.n_components_ == cohort.X.shape[1]
    ols = LinearRegression().fit(cohort.X, cohort.age).predict(cohort.X)
    np.testing.assert_allclose(model.predict_age(cohort.X, cohort.age), ols, rtol=1e-9)


def test_simple_delta_is_biased_and_unbiased_delta_is_not(cohort: Cohort) -> None:
    """Section 2 of the paper: δ₁ regresses towards the mean age; δ₂ does not."""
    simple = BrainAgeModel("simple", n_components=6).fit(cohort.X, cohort.age)
    unbiased = BrainAgeModel("unbiased", n_components=6).fit(cohort.X, cohort.age)
    assert correlation(simple.predict_delta(cohort.X, cohort.age), cohort.age) < -0.2
    assert abs(correlation(unbiased.predict_delta(cohort.X, cohort.age), cohort.age)) < 1e-9


def test_unbiased_delta_tracks_the_true_delta(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(6, n=800, p=30, noise=0.2, delta_sd=6.0)
    train, test = data.subset(np.arange(600)), data.subset(np.arange(600, 800))
    model = BrainAgeModel("unbiased_quadratic", n_components=6).fit(train.X, train.age)
    assert correlation(model.predict_delta(test.X, test.age), test.delta) > 0.6


def test_predict_age_is_age_plus_delta(cohort: Cohort) -> None:
    model = BrainAgeModel("unbiased_quadratic", n_components=5).fit(cohort.X, cohort.age)
    delta = model.predict_delta(cohort.X, cohort.age)
    np.testing.assert_array_equal(model.predict_age(cohort.X, cohort.age), cohort.age + delta)
    np.testing.assert_array_equal(
        model.predict(cohort.X, cohort.age), model.predict_age(cohort.X, cohort.age)
    )


def test_switching_model_after_fit_needs_no_refit(cohort: Cohort) -> None:
    fitted = BrainAgeModel("simple", n_components=5).fit(cohort.X, cohort.age)
    for name in MODELS:
        direct = BrainAgeModel(name, n_components=5).fit(cohort.X, cohort.age)
        fitted.set_params(model=name)
        np.testing.assert_array_equal(
            fitted.predict_delta(cohort.X, cohort.age), direct.predict_delta(cohort.X, cohort.age)
        )


# -- reduction options ----------------------------------------------------------------


def _eigenvalues(X: FloatArray) -> FloatArray:
    return np.sort(np.linalg.eigvalsh(np.corrcoef(X, rowvar=False)))[::-1]


def test_reduction_options_choose_the_expected_number_of_components(cohort: Cohort) -> None:
    X, age = cohort.X, cohort.age
    p = X.shape[1]
    eig = _eigenvalues(X)
    ratio = np.cumsum(eig) / eig.sum()

    assert BrainAgeModel(n_components=4).fit(X, age).n_components_ == 4
    assert BrainAgeModel(feature_proportion=0.25).fit(X, age).n_components_ == p // 4
    assert BrainAgeModel(feature_proportion=0.01).fit(X, age).n_components_ == 1
    for fraction in (0.5, 0.9, 0.99):
        expected = int(np.searchsorted(ratio, fraction)) + 1
        assert BrainAgeModel(variance_explained=fraction).fit(X, age).n_components_ == expected
    kaiser = BrainAgeModel(kaiser_guttman=True).fit(X, age)
    assert kaiser.n_components_ == int(np.count_nonzero(eig > 1.0))
    assert BrainAgeModel().fit(X, age).n_components_ == p
    np.testing.assert_allclose(kaiser.explained_variance_, eig[: kaiser.n_components_], rtol=1e-9)
    np.testing.assert_allclose(kaiser.explained_variance_ratio_, eig[: kaiser.n_components_] / p)


def test_without_reduction_wide_data_keep_every_component_up_to_rank(
    cohort_factory: CohortFactory,
) -> None:
    data = cohort_factory(8, n=40, p=100)
    model = BrainAgeModel().fit(data.X, data.age)
    assert model.n_components_ == 39  # centring removes one dimension


def test_more_components_than_subjects_is_refused(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(9, n=30, p=100)
    with pytest.raises(ValueError, match=r"needs at least 41 subjects.*only 30"):
        BrainAgeModel(n_components=40).fit(data.X, data.age)
    with pytest.raises(ValueError, match="subjects"):
        BrainAgeModel(feature_proportion=0.5).fit(data.X, data.age)


def test_more_components_than_rank_is_refused(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(10, n=200, p=6)
    X = np.column_stack([data.X, data.X[:, :3] * 2.0 + 1.0])
    with pytest.raises(ValueError, match="numerical rank 6"):
        BrainAgeModel(n_components=8).fit(X, data.age)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"model": "quadratic"}, "model must be one of"),
        ({"n_components": 3, "kaiser_guttman": True}, "at most one"),
        ({"n_components": 2, "variance_explained": 0.5}, "at most one"),
        ({"n_components": 0}, "n_components must be at least 1"),
        ({"n_components": 2.5}, "n_components must be a positive integer"),
        ({"n_components": True}, "n_components must be a positive integer"),
        ({"feature_proportion": 1.5}, r"feature_proportion must be in \(0, 1\]"),
        ({"variance_explained": 0.0}, r"variance_explained must be in \(0, 1\]"),
        ({"kaiser_guttman": "yes"}, "kaiser_guttman must be True or False"),
        ({"nan_policy": "zero"}, "nan_policy must be one of"),
    ],
)
def test_bad_parameters_are_refused_at_fit(
    cohort: Cohort, params: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        BrainAgeModel().set_params(**params).fit(cohort.X, cohort.age)


# -- estimator protocol ---------------------------------------------------------------


def test_estimator_protocol(cohort: Cohort) -> None:
    model = BrainAgeModel("alternate", n_components=3, nan_policy="drop")
    assert vars(model) == model.get_params()  # __init__ stores parameters only
    assert model.fit(cohort.X, cohort.age) is model
    learned = [name for name in vars(model) if name not in model.get_params()]
    assert learned and all(name.endswith("_") for name in learned)
    assert repr(model) == "BrainAgeModel(model='alternate', n_components=3, nan_policy='drop')"
    assert model.set_params(n_components=4) is model
    assert model.get_params()["n_components"] == 4


def test_set_params_refuses_unknown_names_without_changing_anything() -> None:
    model = BrainAgeModel(n_components=3)
    with pytest.raises(ValueError, match="no parameter"):
        model.set_params(n_components=5, components=2)
    assert model.n_components == 3


def test_scikit_learn_can_clone_it(cohort: Cohort) -> None:
    from sklearn.base import clone

    fitted = BrainAgeModel("unbiased_quadratic", n_components=4).fit(cohort.X, cohort.age)
    copy = clone(fitted)
    assert copy.get_params() == fitted.get_params()
    assert not hasattr(copy, "b1_")


def test_unfitted_model_refuses_to_predict(cohort: Cohort) -> None:
    with pytest.raises(NotFittedError, match="not fitted"):
        BrainAgeModel().predict_delta(cohort.X, cohort.age)


# -- input handling -------------------------------------------------------------------


def test_constant_feature_is_dropped_with_a_warning(cohort: Cohort) -> None:
    X = np.insert(cohort.X, 3, 42.125, axis=1)
    X = np.insert(X, 0, 0.0, axis=1)
    with pytest.warns(DeltabWarning, match=r"2 feature\(s\) have no variance.*0, 4"):
        model = BrainAgeModel("unbiased_quadratic", n_components=5).fit(X, cohort.age)
    assert model.support_.sum() == cohort.X.shape[1]
    plain = BrainAgeModel("unbiased_quadratic", n_components=5).fit(cohort.X, cohort.age)
    delta = model.predict_delta(X, cohort.age)
    assert np.isfinite(delta).all()
    np.testing.assert_allclose(delta, plain.predict_delta(cohort.X, cohort.age), atol=1e-10)


def test_all_missing_feature_is_refused_by_index(cohort: Cohort) -> None:
    X = cohort.X.copy()
    X[:, 5] = np.nan
    for policy in ("median", "mean", "drop"):
        with pytest.raises(ValueError, match="feature 5 of X is missing"):
            BrainAgeModel(nan_policy=policy).fit(X, cohort.age)


def test_median_policy_learns_medians_and_reuses_them(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(12, n=300, p=12, nan_fraction=0.05)
    X_before = data.X.copy()
    model = BrainAgeModel("unbiased", n_components=4).fit(data.X, data.age)
    np.testing.assert_array_equal(data.X, X_before)  # the caller's data are not modified
    np.testing.assert_array_equal(model.feature_fill_, np.nanmedian(data.X, axis=0))
    filled = np.where(np.isnan(data.X), model.feature_fill_, data.X)
    np.testing.assert_array_equal(
        model.predict_delta(data.X, data.age), model.predict_delta(filled, data.age)
    )
    refit = BrainAgeModel("unbiased", n_components=4).fit(filled, data.age)
    np.testing.assert_allclose(
        refit.predict_delta(filled, data.age), model.predict_delta(filled, data.age), atol=1e-10
    )


def test_mean_policy_imputes_training_means(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(13, n=300, p=12, nan_fraction=0.05)
    model = BrainAgeModel("unbiased", n_components=4, nan_policy="mean").fit(data.X, data.age)
    np.testing.assert_allclose(model.feature_fill_, np.nanmean(data.X, axis=0), rtol=1e-12)
    filled = np.where(np.isnan(data.X), np.nanmean(data.X, axis=0), data.X)
    refit = BrainAgeModel("unbiased", n_components=4).fit(filled, data.age)
    np.testing.assert_allclose(
        model.predict_delta(data.X, data.age), refit.predict_delta(filled, data.age), atol=1e-9
    )


def test_drop_policy_trains_on_complete_subjects_and_leaves_others_blank(
    cohort_factory: CohortFactory,
) -> None:
    data = cohort_factory(14, n=300, p=12, nan_fraction=0.01)
    age = data.age.copy()
    age[7] = np.nan
    complete = ~np.isnan(data.X).any(axis=1) & ~np.isnan(age)
    model = BrainAgeModel(n_components=4, nan_policy="drop").fit(data.X, age)
    assert model.n_subjects_ == complete.sum()
    reference = BrainAgeModel(n_components=4).fit(data.X[complete], age[complete])
    with pytest.warns(DeltabWarning, match="get no estimate"):
        delta = model.predict_delta(data.X, age)
    assert np.isnan(delta[~complete]).all()
    np.testing.assert_allclose(
        delta[complete], reference.predict_delta(data.X[complete], age[complete]), atol=1e-10
    )


def test_missing_age_is_refused_when_imputing(cohort: Cohort) -> None:
    age = cohort.age.copy()
    age[4] = np.nan
    with pytest.raises(ValueError, match=r"age\[4\] is missing"):
        BrainAgeModel().fit(cohort.X, age)
    model = BrainAgeModel(n_components=3).fit(cohort.X, cohort.age)
    with pytest.raises(ValueError, match=r"age\[4\] is missing"):
        model.predict_delta(cohort.X, age)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda X, age: (X[0], age), "2-D"),
        (lambda X, age: (X, age[:-1]), "must match row for row"),
        (lambda X, age: (np.where(X[2, 1] == X, np.inf, X), age), r"X\[2, 1\] is infinite"),
        (lambda X, age: (X, np.where(age == age[3], -np.inf, age)), r"age\[3\] is infinite"),
        (lambda X, age: (X[:, :0], age), "at least one subject and one feature"),
    ],
)
def test_malformed_input_is_refused(cohort: Cohort, mutate: object, message: str) -> None:
    X, age = mutate(cohort.X, cohort.age)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        BrainAgeModel().fit(X, age)


def test_prediction_checks_features_and_confounds(cohort_factory: CohortFactory) -> None:
    data = cohort_factory(15, n=200, p=10, n_confounds=2)
    model = BrainAgeModel(n_components=3).fit(data.X, data.age, data.confounds)
    with pytest.raises(ValueError, match="X has 9 features but the model was fitted with 10"):
        model.predict_delta(data.X[:, 1:], data.age, data.confounds)
    with pytest.raises(ValueError, match="pass the same confounds"):
        model.predict_delta(data.X, data.age)
    assert data.confounds is not None
    with pytest.raises(ValueError, match="confounds has 1 column"):
        model.predict_delta(data.X, data.age, data.confounds[:, :1])


def test_constant_and_collinear_confounds_are_refused(cohort: Cohort) -> None:
    n = cohort.age.size
    with pytest.raises(ValueError, match="confound 0 is constant"):
        BrainAgeModel(n_components=3).fit(cohort.X, cohort.age, np.full((n, 1), 3.0))
    c = np.random.default_rng(0).normal(size=n)
    with pytest.raises(ValueError, match="collinear"):
        BrainAgeModel(n_components=3).fit(cohort.X, cohort.age, np.column_stack([c, 2 * c + 1]))


def test_constant_age_is_refused(cohort: Cohort) -> None:
    with pytest.raises(ValueError, match="age does not vary"):
        BrainAgeModel(n_components=3).fit(cohort.X, np.full(cohort.age.size, 60.0))


def test_two_distinct_ages_leave_out_the_quadratic_term_with_a_warning(cohort: Cohort) -> None:
    age = np.where(cohort.age > np.median(cohort.age), 70.0, 50.0)
    with pytest.warns(DeltabWarning, match="quadratic term is left out"):
        model = BrainAgeModel("unbiased_quadratic", n_components=3).fit(cohort.X, age)
    assert model.b2sq_[1] == 0.0
    assert np.isfinite(model.predict_delta(cohort.X, age)).all()


def test_failed_refit_leaves_the_fitted_model_intact(cohort: Cohort) -> None:
    model = BrainAgeModel(n_components=3).fit(cohort.X, cohort.age)
    before = model.predict_delta(cohort.X, cohort.age)
    with pytest.raises(ValueError):
        model.fit(cohort.X[:2], cohort.age[:2])
    np.testing.assert_array_equal(model.predict_delta(cohort.X, cohort.age), before)
