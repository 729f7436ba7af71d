"""The estimator's hyper-parameters: which delta model, and how many PCA components.

Smith et al. (2019, NeuroImage 200:528-539) reduce the standardised features to
their top 10-25% eigenvectors; the public ``deltab`` tool offers a fixed count,
a proportion of the features, a fraction of variance explained and the
Kaiser-Guttman rule. At most one of these may be given; with none, every
component up to the numerical rank is kept (ordinary least squares on all
features).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from node.deltab._checks import FloatArray
from node.deltab._linalg import kaiser_guttman_count, proportion_to_count, variance_count

MODELS = ("simple", "unbiased", "unbiased_quadratic", "alternate", "alternate_quadratic")
QUADRATIC_MODELS = ("unbiased_quadratic", "alternate_quadratic")
ALTERNATE_MODELS = ("alternate", "alternate_quadratic")


def check_model(model: object) -> str:
    if not isinstance(model, str) or model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}; got {model!r}.")
    return model


def _fraction(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number in (0, 1]; got {value!r}.")
    number = float(value)
    if not (math.isfinite(number) and 0.0 < number <= 1.0):
        raise ValueError(f"{name} must be in (0, 1]; got {value!r}.")
    return number


@dataclass(frozen=True)
class Reduction:
    """A validated choice of how many principal components to keep."""

    n_components: int | None = None
    feature_proportion: float | None = None
    variance_explained: float | None = None
    kaiser_guttman: bool = False
    # Sums carrying residual DP noise can lose rank (a noised scatter need not be
    # positive definite); then the count is capped at what the sums support
    # instead of refused, the same way on every node (it depends only on them).
    at_most_supported: bool = False

    @classmethod
    def from_params(
        cls,
        n_components: object,
        feature_proportion: object,
        variance_explained: object,
        kaiser_guttman: object,
    ) -> Reduction:
        if not isinstance(kaiser_guttman, bool):
            raise ValueError(f"kaiser_guttman must be True or False; got {kaiser_guttman!r}.")
        chosen = [
            name
            for name, value in (
                ("n_components", n_components),
                ("feature_proportion", feature_proportion),
                ("variance_explained", variance_explained),
            )
            if value is not None
        ] + (["kaiser_guttman"] if kaiser_guttman else [])
        if len(chosen) > 1:
            raise ValueError(
                f"give at most one way to choose the number of components; got {', '.join(chosen)}."
            )
        count: int | None = None
        if n_components is not None:
            if isinstance(n_components, bool) or not isinstance(n_components, numbers.Integral):
                raise ValueError(f"n_components must be a positive integer; got {n_components!r}.")
            count = int(n_components)
            if count < 1:
                raise ValueError(f"n_components must be at least 1; got {n_components!r}.")
        return cls(
            n_components=count,
            feature_proportion=(
                None
                if feature_proportion is None
                else _fraction(feature_proportion, "feature_proportion")
            ),
            variance_explained=(
                None
                if variance_explained is None
                else _fraction(variance_explained, "variance_explained")
            ),
            kaiser_guttman=kaiser_guttman,
        )

    def describe(self) -> str:
        if self.n_components is not None:
            return f"n_components={self.n_components}"
        if self.feature_proportion is not None:
            return f"feature_proportion={self.feature_proportion}"
        if self.variance_explained is not None:
            return f"variance_explained={self.variance_explained}"
        if self.kaiser_guttman:
            return "kaiser_guttman=True"
        return "keeping every component"

    def choose(
        self,
        eigenvalues: FloatArray,
        *,
        total: float,
        n_features: int,
        rank: int,
        n_subjects: float,
        n_nuisance: int,
    ) -> int:
        """Number of components, checked against subjects, features and rank."""
        room = math.floor(n_subjects + 1e-9) - n_nuisance
        if self.n_components is not None:
            k = self.n_components
        elif self.feature_proportion is not None:
            k = proportion_to_count(self.feature_proportion, n_features)
        elif self.variance_explained is not None:
            k = variance_count(eigenvalues, total, self.variance_explained, rank)
        elif self.kaiser_guttman:
            k = kaiser_guttman_count(eigenvalues, total, n_features, rank)
        else:
            k = min(rank, room)
        if self.at_most_supported:
            k = min(k, rank, n_features, room)
        if k > room:
            extra = "" if n_nuisance == 1 else f" and {n_nuisance - 1} confound(s)"
            raise ValueError(
                f"{self.describe()} asks for {k} principal components, which needs at least "
                f"{k + n_nuisance} subjects (one per component plus one for the mean{extra}), "
                f"but only {n_subjects:g} subjects are available."
            )
        if k > n_features:
            raise ValueError(
                f"{self.describe()} asks for {k} principal components but only {n_features} "
                "features vary in the training data."
            )
        if k > rank:
            raise ValueError(
                f"{self.describe()} asks for {k} principal components but the standardised "
                f"features have numerical rank {rank}; ask for at most {rank}."
            )
        if k < 1:
            raise ValueError("the standardised features have no variance to model.")
        return k
