"""The seed documents' literal federated path, kept as a comparison mode.

The deltab DP page describes federated training as: each site fits deltab on
its own cohort, and an aggregator averages b1, b2, b2sq, gamma and gammasq
weighted by N (FedAvg). Averaging regression coefficients is only meaningful
when every site expresses them in the same coordinates, so here each site fits
in the *shared* basis — the global standardisation, the PCA basis from the
aggregated sums, and the global age adjustments — and the aggregator
averages. With one site this is exactly the pooled fit; with several sites it
is not, because a least-squares solution is not the N-weighted mean of the
sites' solutions unless the sites' designs are alike (non-IID cohorts, e.g.
sites covering different age ranges, show the gap). The exact path
(``uncentred.model_from_sums``) has no such gap.

As a round, each node sends N·coefficient (so the element-wise sum divided by
the summed N is the FedAvg mean): n (), n_b1 (k,), n_b2 (1,), n_b2sq (2,),
n_gamma (1, k), n_gammasq (2, k).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
from numpy.typing import ArrayLike

from node.deltab._checks import FloatArray, as_confounds, as_features
from node.deltab.model import BrainAgeModel
from node.deltab.scaling import Bounds, clip_to_bounds
from node.deltab.stats import Tensors

__all__ = [
    "COEFFICIENTS",
    "coefficient_shapes",
    "local_coefficients",
    "model_from_coefficients",
]

COEFFICIENTS = "coefficients"
_AVERAGED = ("b1", "b2", "b2sq", "gamma", "gammasq")


def coefficient_shapes(n_components: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors of the coefficient-averaging round."""
    k = n_components
    return {
        "n": (),
        "n_b1": (k,),
        "n_b2": (1,),
        "n_b2sq": (2,),
        "n_gamma": (1, k),
        "n_gammasq": (2, k),
    }


def _lstsq(design: FloatArray, target: FloatArray) -> FloatArray:
    solution = np.linalg.lstsq(design, target, rcond=None)[0]
    return np.asarray(solution, dtype=np.float64)


def local_coefficients(
    X: ArrayLike,
    age: ArrayLike,
    basis: BrainAgeModel,
    *,
    confounds: ArrayLike | None = None,
    bounds: Bounds | None = None,
) -> Tensors:
    """One site's deltab coefficients in the shared basis, multiplied by its N.

    ``basis`` is the exact federated model (``uncentred.model_from_sums``): its
    standardisation, eigenvectors and age adjustments define the coordinates.
    The site then solves its own least-squares problems, as a stand-alone
    deltab run would: β₁ = U⁺y, δ₁ = Uβ₁ - y, β₂ = Y₂⁺δ₁, Λ = Y₂⁺U.
    """
    features = as_features(X)
    if bounds is not None:
        conf_raw = as_confounds(confounds, features.shape[0])
        features, age_clipped, conf_clipped, _ = clip_to_bounds(
            features, np.asarray(age, dtype=np.float64), conf_raw, bounds
        )
        age, confounds = age_clipped, (conf_clipped if conf_raw.shape[1] else None)
    features, ages, conf, blank = basis._inputs(features, age, confounds)
    assert ages is not None
    keep = ~blank
    nuisance = basis._nuisance(conf[keep])
    u = basis._reduce(features[keep], nuisance)
    y, q = basis._age_terms(ages[keep], nuisance)
    n = float(keep.sum())
    b1 = _lstsq(u, y)
    delta1 = u @ b1 - y
    linear = y[:, np.newaxis]
    quadratic = np.column_stack([y, q])
    return {
        "n": np.array(n),
        "n_b1": n * b1,
        "n_b2": n * _lstsq(linear, delta1),
        "n_b2sq": n * _lstsq(quadratic, delta1),
        "n_gamma": n * _lstsq(linear, u),
        "n_gammasq": n * _lstsq(quadratic, u),
    }


def model_from_coefficients(
    aggregate: Mapping[str, ArrayLike], basis: BrainAgeModel
) -> BrainAgeModel:
    """The basis model with its coefficients replaced by the N-weighted site averages."""
    basis._check_fitted()
    shapes = coefficient_shapes(basis.n_components_)
    if set(aggregate) != set(shapes):
        raise ValueError(
            f"the coefficient aggregate has tensors {sorted(aggregate)}; expected {sorted(shapes)}."
        )
    n = float(np.asarray(aggregate["n"]))
    if not n > 0:
        raise ValueError(f"the coefficient aggregate covers {n:g} subjects; at least 1 is needed.")
    averaged = copy.deepcopy(basis)
    for name in _AVERAGED:
        value = np.asarray(aggregate["n_" + name], dtype=np.float64)
        if value.shape != shapes["n_" + name]:
            raise ValueError(
                f"coefficient tensor 'n_{name}' has shape {value.shape}; expected "
                f"{shapes['n_' + name]}."
            )
        setattr(averaged, name + "_", value / n)
    return averaged
