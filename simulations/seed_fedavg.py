"""The deltab DP page's literal path: noised local coefficients averaged by N.

The page proposes output perturbation: each site fits deltab locally and adds
Gaussian noise to b1, b2, b2sq, gamma and gammasq before egress, with the
classic Gaussian mechanism

    σ = Δ·sqrt(2 ln(1.25/δ)) / ε          (Dwork & Roth 2014, Theorem A.1),

and the sensitivity heuristic Δ(β₁) ≈ ‖X_r⁺‖₂ · (age range). The aggregator
averages the noised coefficients weighted by N (FedAvg). Here:

* the local fits are ``node.deltab.fedavg.local_coefficients`` in the shared
  basis (global standardisation and PCA from the exact federated sums), as
  the plan's seed-literal mode runs them; the basis round is taken as exact
  and is not part of this scheme's privacy figure;
* X_r is the site's reduced feature matrix U_k in that basis, so
  ‖U_k⁺‖₂ = 1/σ_min(U_k), and the age range is that of the public bounds in
  model units, (age_hi − age_lo)/age_half = 2;
* every coefficient tensor gets that σ (the page gives a sensitivity for β₁
  only and applies the same recipe to each exported parameter), the node sends
  N·(b + noise), and the page's budget is ε per tensor, composed by basic
  composition.

The heuristic Δ is not a proven bound on how much one subject moves a
least-squares coefficient, and the classic formula is only valid for ε < 1;
the simulations report the page's declared figure, not a guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from node.deltab.model import BrainAgeModel
from node.deltab.scaling import Bounds

__all__ = ["PAGE_TENSORS", "noised_coefficients", "page_sensitivity", "page_sigma"]

FloatArray = NDArray[np.float64]

PAGE_TENSORS = ("n_b1", "n_b2", "n_b2sq", "n_gamma", "n_gammasq")


def page_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """The page's σ = Δ·sqrt(2 ln(1.25/δ))/ε (classic Gaussian mechanism)."""
    if not (epsilon > 0.0 and 0.0 < delta < 1.0 and sensitivity > 0.0):
        raise ValueError(
            f"the page's σ needs ε > 0, 0 < δ < 1 and Δ > 0; got ε={epsilon}, δ={delta}, "
            f"Δ={sensitivity}"
        )
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def page_sensitivity(basis: BrainAgeModel, features: FloatArray, bounds: Bounds) -> float:
    """‖U_k⁺‖₂ · age range (model units): the page's heuristic for one site's β₁."""
    reduced = basis.transform(np.clip(features, bounds.feature_lo, bounds.feature_hi))
    singular = np.linalg.svd(reduced, compute_uv=False)
    smallest = float(singular[-1]) if singular.size else 0.0
    age_range = (bounds.age_hi - bounds.age_lo) / bounds.age_half
    if smallest <= 0.0:
        return math.inf
    return age_range / smallest


def noised_coefficients(
    tensors: Mapping[str, FloatArray], sigma: float, rng: np.random.Generator
) -> dict[str, FloatArray]:
    """N·(b + N(0, σ²)) for every coefficient tensor; N itself is sent as is."""
    n = float(tensors["n"])
    out = {name: np.array(value, dtype=np.float64) for name, value in tensors.items()}
    for name in PAGE_TENSORS:
        out[name] = out[name] + n * sigma * rng.standard_normal(out[name].shape)
    return out
