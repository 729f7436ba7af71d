"""Post-processing of noisy aggregates so the brain-age solve stays defined.

Noise added to sums can produce aggregates no dataset could have: a negative
subject count, a feature with negative variance, a scatter matrix with negative
eigenvalues. Any function of a differentially private release is as private as
the release (post-processing; Dwork & Roth 2014, Proposition 2.1), so the
aggregator may repair it:

* means round (mean imputation): every observed-value count ← max(count, 1);
* sums round: N ← max(N, 2); with a = (x, y) the per-subject vector of
  pre-scaled features and age, the centred second-moment matrix
  C = Σ a aᵀ − (Σ a)(Σ a)ᵀ/N is computed from the released *uncentred* sums
  and projected onto the positive semi-definite cone with a floor:
  C = Q Λ Qᵀ ↦ Q max(Λ, f) Qᵀ with f = 1e-9·max(λ_max, N). The first sums
  Σa and N are left as released, and Σ a aᵀ is rebuilt from the projected C.
  (The same function repairs the centred two-round plan's scatter round,
  whose Σa is merely close to zero.) This is the nearest PSD matrix in
  Frobenius norm (Higham 1988, "Computing a nearest symmetric positive
  semidefinite matrix", Linear Algebra Appl. 103:103–118) raised to the floor,
  and it makes every feature variance, the age variance and the PCA spectrum
  positive. The squared-age sums (Σx y², Σy³, Σy⁴) are left alone: they enter
  only the quadratic models, whose solve already drops a degenerate quadratic
  term (Σy² appears in both roles, so folding y² into a would leave the two
  copies inconsistent).

Exact aggregates pass through unchanged up to rounding (the floor is far below
any real eigenvalue); the number of eigenvalues raised is reported.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from node.deltab._linalg import pack_symmetric, unpack_symmetric

__all__ = ["EIGEN_FLOOR_RTOL", "repair_means", "repair_sums"]

FloatArray = NDArray[np.float64]
Tensors = dict[str, FloatArray]

EIGEN_FLOOR_RTOL = 1e-9
MIN_SUBJECTS = 2.0


def repair_means(tensors: Mapping[str, FloatArray]) -> Tensors:
    """The means aggregate with every per-feature count ≥ 1 (and N ≥ 2 if it carries N)."""
    out = {name: np.array(value, dtype=np.float64) for name, value in tensors.items()}
    if "n" in out:
        out["n"] = np.array(max(float(out["n"]), MIN_SUBJECTS))
    out["count_x"] = np.maximum(out["count_x"], 1.0)
    return out


def repair_sums(tensors: Mapping[str, FloatArray]) -> tuple[Tensors, int]:
    """The aggregate with a PSD centred moment matrix, and how many eigenvalues were raised."""
    out = {name: np.array(value, dtype=np.float64) for name, value in tensors.items()}
    p = int(out["sum_x"].size)
    n = max(float(out["n"]), MIN_SUBJECTS)
    out["n"] = np.array(n)
    first = np.concatenate([out["sum_x"], [float(out["sum_y"])]])
    second = np.empty((p + 1, p + 1))
    second[:p, :p] = unpack_symmetric(out["sum_xx"], p)
    second[:p, p] = second[p, :p] = out["sum_xy"]
    second[p, p] = float(out["sum_y2"])
    centred = second - np.outer(first, first) / n
    centred = (centred + centred.T) / 2.0
    values, vectors = np.linalg.eigh(centred)
    floor = EIGEN_FLOOR_RTOL * max(float(values[-1]), n)
    raised = int(np.count_nonzero(values < floor))
    if raised == 0:
        return out, 0
    projected = (vectors * np.maximum(values, floor)) @ vectors.T
    rebuilt = (projected + projected.T) / 2.0 + np.outer(first, first) / n
    out["sum_xx"] = pack_symmetric(rebuilt[:p, :p])
    out["sum_xy"] = rebuilt[:p, p].copy()
    out["sum_y2"] = np.array(rebuilt[p, p])
    return out, raised
