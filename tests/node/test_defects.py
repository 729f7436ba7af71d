"""Behaviours the public ``deltab`` tool gets wrong and this estimator must get right.

B1  Y²ₒ must be Y² minus its projection on Y (a - y(yᵀa)/(yᵀy)); subtracting the
    scalar (y/‖y‖)ᵀa leaves the unbiased-quadratic delta correlated with age².
B2  Prediction must use training statistics for the quadratic term, so a
    subject's delta does not depend on the batch it is predicted in.
B3  The features must be replaced by unit-norm eigenvectors U = Z V S⁻¹, not by
    PCA scores; the alternate models depend on that scaling.
B4  The fit must be deterministic, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from node.deltab import MODELS, BrainAgeModel
from tests.support.cohorts import Cohort, CohortFactory, correlation


@pytest.fixture(scope="module")
def skewed(cohort_factory: CohortFactory) -> Cohort:
    # Strong quadratic ageing effect on a right-skewed age distribution.
    return cohort_factory(11, n=600, p=30, quadratic=1.5, noise=0.4)


# -- B1 -------------------------------------------------------------------------------


def test_unbiased_quadratic_delta_is_uncorrelated_with_age_and_age_squared(skewed: Cohort) -> None:
    model = BrainAgeModel("unbiased_quadratic", n_components=8).fit(skewed.X, skewed.age)
    delta = model.predict_delta(skewed.X, skewed.age)
    assert abs(correlation(delta, skewed.age)) < 0.01
    assert abs(correlation(delta, skewed.age**2)) < 0.01
    # Exactly, not just approximately: δ₂q is orthogonal to span{1, Y, Y²} by construction.
    assert abs(correlation(delta, skewed.age)) < 1e-9
    assert abs(correlation(delta, skewed.age**2)) < 1e-9


def test_orthogonalised_age_squared_is_orthogonal_to_age(skewed: Cohort) -> None:
    model = BrainAgeModel("unbiased_quadratic", n_components=8).fit(skewed.X, skewed.age)
    nuisance = model._nuisance(np.zeros((skewed.age.size, 0)))
    y, q = model._age_terms(skewed.age, nuisance)
    assert abs(float(q @ y)) < 1e-9 * float(np.linalg.norm(q) * np.linalg.norm(y))
    assert abs(float(q.sum())) < 1e-9 * float(np.linalg.norm(q)) * np.sqrt(q.size)


def test_scalar_shift_orthogonalisation_fails_the_same_criteria(skewed: Cohort) -> None:
    """The B1 criteria have teeth: the defective Y²ₒ is correlated with age, and the
    delta corrected with it keeps a dependence on age²."""
    model = BrainAgeModel("simple", n_components=8).fit(skewed.X, skewed.age)
    u = model.transform(skewed.X)
    y = skewed.age - skewed.age.mean()
    delta1 = u @ model.b1_ - y
    a = y**2 - np.mean(y**2)
    defective = a - float((y / np.linalg.norm(y)) @ a)
    assert abs(correlation(defective, skewed.age)) > 0.3
    design = np.column_stack([y, defective])
    delta = delta1 - design @ np.linalg.lstsq(design, delta1, rcond=None)[0]
    assert abs(correlation(delta, skewed.age**2)) > 1e-6


# -- B2 -------------------------------------------------------------------------------


@pytest.mark.parametrize("model_name", MODELS)
def test_delta_of_a_subject_does_not_depend_on_the_batch(
    cohort_factory: CohortFactory, model_name: str
) -> None:
    everyone = cohort_factory(21, n=2400, p=15)
    train, batch = everyone.subset(np.arange(400)), everyone.subset(np.arange(400, 2400))
    model = BrainAgeModel(model_name, n_components=5).fit(train.X, train.age)
    together = model.predict_delta(batch.X, batch.age)
    for index in (0, 1, 777, 1999):
        alone = model.predict_delta(batch.X[index : index + 1], batch.age[index : index + 1])
        assert abs(alone[0] - together[index]) < 1e-12
    shuffled = np.random.default_rng(0).permutation(2000)
    again = model.predict_delta(batch.X[shuffled], batch.age[shuffled])
    np.testing.assert_allclose(again, together[shuffled], rtol=0, atol=1e-12)


@pytest.mark.parametrize("model_name", MODELS)
def test_lone_subject_at_the_training_mean_age_gets_a_finite_delta(
    cohort: Cohort, model_name: str
) -> None:
    model = BrainAgeModel(model_name, n_components=5).fit(cohort.X, cohort.age)
    x = cohort.X[:1]
    age = np.array([model.age_mean_])
    assert age[0] == pytest.approx(cohort.age.mean(), abs=1e-9)
    delta = model.predict_delta(x, age)
    assert np.isfinite(delta).all()
    assert np.isfinite(model.predict_age(x, age)).all()


# -- B3 -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(300, 20), (80, 200)])  # scatter route, Gram route
def test_training_eigenvectors_are_orthonormal(
    cohort_factory: CohortFactory, shape: tuple[int, int]
) -> None:
    data = cohort_factory(31, n=shape[0], p=shape[1])
    model = BrainAgeModel(n_components=12).fit(data.X, data.age)
    u = model.transform(data.X)
    assert u.shape == (shape[0], 12)
    np.testing.assert_allclose(u.T @ u, np.eye(12), rtol=0, atol=1e-10)
    np.testing.assert_allclose(u.sum(axis=0), 0.0, atol=1e-10)


def test_alternate_delta_is_the_unbiased_delta_over_r_squared(cohort: Cohort) -> None:
    """With unit-norm U the alternate model's δ₃ = δ₂ / R² in the training set.

    β₁ = Uᵀy, λ = yᵀU/‖y‖², so δ₃ = (U - yλ)λᵀ/‖λ‖² = (Uβ₁ - y R²)/R² = δ₂/R²
    with R² = ‖β₁‖²/‖y‖². With PCA scores U S in place of U the identity fails.
    """
    unbiased = BrainAgeModel("unbiased", n_components=6).fit(cohort.X, cohort.age)
    alternate = BrainAgeModel("alternate", n_components=6).fit(cohort.X, cohort.age)
    y = cohort.age - cohort.age.mean()
    r_squared = float(unbiased.b1_ @ unbiased.b1_) / float(y @ y)
    np.testing.assert_allclose(
        alternate.predict_delta(cohort.X, cohort.age),
        unbiased.predict_delta(cohort.X, cohort.age) / r_squared,
        rtol=1e-10,
        atol=1e-10,
    )
    scores = unbiased.transform(cohort.X) * unbiased.singular_values_
    lam = (y @ scores) / (y @ y)
    with_scores = (scores - np.outer(y, lam)) @ lam / (lam @ lam)
    assert np.max(np.abs(with_scores - alternate.predict_delta(cohort.X, cohort.age))) > 0.1


# -- B4 -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(300, 20), (80, 200)])
def test_same_input_gives_bitwise_identical_models(
    cohort_factory: CohortFactory, shape: tuple[int, int]
) -> None:
    data = cohort_factory(41, n=shape[0], p=shape[1], nan_fraction=0.01)
    first = BrainAgeModel("alternate_quadratic", variance_explained=0.9).fit(data.X, data.age)
    second = BrainAgeModel("alternate_quadratic", variance_explained=0.9).fit(
        data.X.copy(order="F"), data.age.copy()
    )
    for name, value in vars(first).items():
        if name.endswith("_"):
            np.testing.assert_array_equal(value, getattr(second, name), err_msg=name)
    assert np.array_equal(
        first.predict_delta(data.X, data.age), second.predict_delta(data.X, data.age)
    )


def test_eigenvector_signs_follow_the_largest_entry(cohort: Cohort) -> None:
    model = BrainAgeModel(n_components=6).fit(cohort.X, cohort.age)
    v = model.components_
    pivots = np.argmax(np.abs(v), axis=0)
    assert (v[pivots, np.arange(v.shape[1])] > 0).all()
