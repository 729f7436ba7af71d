"""Validation of the arrays handed to the estimator and to the sufficient statistics.

Every check raises ``ValueError`` with a sentence naming the argument, so the
messages read the same whether they come from ``fit``, ``predict`` or a
federated round.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

NAN_POLICIES = ("median", "mean", "drop")


def as_features(values: ArrayLike, name: str = "X") -> FloatArray:
    """Subjects-by-features float64 matrix; NaN marks a missing value, infinities are refused.

    The result is C-contiguous (a copy only when needed): summation order, and
    so the last bit of every sum, then does not depend on the caller's layout.
    """
    try:
        array = np.ascontiguousarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric (subjects, features) array: {exc}") from None
    if array.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D (subjects, features) array; got an array with shape "
            f"{array.shape}."
        )
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(
            f"{name} has shape {array.shape}; it needs at least one subject and one feature."
        )
    if np.isinf(array).any():
        row, col = np.argwhere(np.isinf(array))[0]
        raise ValueError(
            f"{name}[{row}, {col}] is infinite; only finite values or NaN (missing) are accepted."
        )
    return array


def as_age(values: ArrayLike, n_subjects: int, name: str = "age") -> FloatArray:
    """Ages as a float64 vector with one entry per subject; infinities are refused."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric 1-D array: {exc}") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of ages; got shape {array.shape}.")
    if array.shape[0] != n_subjects:
        raise ValueError(
            f"{name} has {array.shape[0]} entries but the feature matrix has {n_subjects} "
            "subjects; they must match row for row."
        )
    if np.isinf(array).any():
        index = int(np.flatnonzero(np.isinf(array))[0])
        raise ValueError(f"{name}[{index}] is infinite; ages must be finite.")
    return array


def as_confounds(values: ArrayLike | None, n_subjects: int, name: str = "confounds") -> FloatArray:
    """Confounds as an (N, C) float64 matrix, C = 0 when none are given; NaN and inf refused."""
    if values is None:
        return np.zeros((n_subjects, 0))
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric (subjects, confounds) array: {exc}") from None
    if array.ndim == 1:
        array = array[:, np.newaxis]
    if array.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D (subjects, confounds) array; got shape {array.shape}."
        )
    if array.shape[0] != n_subjects:
        raise ValueError(
            f"{name} has {array.shape[0]} rows but the feature matrix has {n_subjects} subjects."
        )
    if not np.isfinite(array).all():
        row, col = np.argwhere(~np.isfinite(array))[0]
        raise ValueError(
            f"{name}[{row}, {col}] is {array[row, col]}; confounds must be finite "
            "(impute or drop those subjects first)."
        )
    return array


def check_nan_policy(nan_policy: object, allowed: tuple[str, ...] = NAN_POLICIES) -> str:
    if not isinstance(nan_policy, str) or nan_policy not in allowed:
        raise ValueError(f"nan_policy must be one of {allowed}; got {nan_policy!r}.")
    return nan_policy


def check_all_nan_features(X: FloatArray, name: str = "X") -> None:
    """A feature with no observed value cannot be standardised or imputed."""
    empty = np.isnan(X).all(axis=0)
    if empty.any():
        index = int(np.flatnonzero(empty)[0])
        raise ValueError(
            f"feature {index} of {name} is missing (NaN) for every subject; remove that column."
        )


def complete_rows(X: FloatArray, age: FloatArray) -> BoolArray:
    """Subjects with no missing feature and a known age (the rows ``nan_policy='drop'`` keeps)."""
    result: BoolArray = ~np.isnan(X).any(axis=1) & ~np.isnan(age)
    return result


def first_missing_age(age: FloatArray) -> int | None:
    missing = np.flatnonzero(np.isnan(age))
    return int(missing[0]) if missing.size else None
