"""Reading the subjects of ``zerosum deltab``: features and true ages, lined up and checked.

:func:`load_subjects` reads a feature table and the true ages (from a separate
file or the table's ``age`` column), checks that they describe the same
subjects, refuses an all-empty column, and applies the missing-value policy
(``remove`` leaves out every subject with a missing age or feature;
``median`` leaves missing features to the model and refuses a missing age).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from node.deltab.io import (
    AgeColumn,
    DeltabInputError,
    Table,
    check_same_subjects,
    no_age_column,
    read_ages,
    read_table,
)
from zerosum.commands._deltab_report import describe_table

__all__ = ["Subjects", "load_subjects"]


def _note(prog: str, message: str) -> None:
    print(f"{prog}: note: {message}", file=sys.stderr)


@dataclass(frozen=True)
class Subjects:
    """Ages and features of one set of subjects, after the missing-value policy."""

    features: NDArray[np.float64]
    age: NDArray[np.float64]
    ids: tuple[str, ...] | None
    source: Path
    feature_names: tuple[str, ...]
    named: bool = False  # the feature names come from a header, not positions


def _ages_for(
    table: Table, ages_path: str | None, flag: str
) -> tuple[AgeColumn | None, NDArray[np.float64]]:
    """The true ages of ``table``'s subjects, from ``ages_path`` or the table's 'age' column."""
    if ages_path is None:
        if table.age is None:
            raise DeltabInputError(
                no_age_column(
                    table, f"give the true ages with {flag} or add a header with an 'age' column."
                )
            )
        return None, table.age
    ages = read_ages(ages_path)
    check_same_subjects(ages, table)
    if table.age is not None and not np.allclose(
        ages.values, table.age, equal_nan=True, rtol=0.0, atol=1e-6
    ):
        k = int(np.flatnonzero(~np.isclose(ages.values, table.age, equal_nan=True, atol=1e-6))[0])
        raise DeltabInputError(
            f"the 'age' column of {table.path} (line {table.lines[k]}: {table.age[k]:g}) "
            f"disagrees with {ages.path} (line {ages.lines[k]}: {ages.values[k]:g}); "
            "give the ages once."
        )
    return ages, ages.values


def load_subjects(
    prog: str,
    features_path: str,
    ages_path: str | None,
    flag: str,
    nan_policy: str,
    *,
    debug: Callable[[str], None] | None = None,
) -> Subjects:
    """Read features and ages, check they line up, and apply the missing-value policy.

    Under ``remove``/``drop`` every subject with a missing age or feature is
    left out here (so the ids and true ages written out stay aligned); under
    ``median`` a missing age is an error — an age cannot be imputed — and
    missing features are left for the model, which imputes training medians.
    """
    table = read_table(features_path)
    if debug is not None:
        debug(describe_table(table))
    ages_column, age = _ages_for(table, ages_path, flag)
    age_source = ages_column.path if ages_column is not None else table.path
    age_lines = ages_column.lines if ages_column is not None else table.lines
    empty = np.flatnonzero(np.isnan(table.features).all(axis=0))
    if empty.size:
        name = table.feature_names[int(empty[0])]
        raise DeltabInputError(
            f"{table.path}: column {name!r} has no values (every cell is missing); remove it."
        )
    features = table.features
    ids = table.ids if table.ids is not None else (ages_column.ids if ages_column else None)
    if nan_policy == "median":
        missing_age = np.flatnonzero(np.isnan(age))
        if missing_age.size:
            k = int(missing_age[0])
            raise DeltabInputError(
                f"{age_source}: line {age_lines[k]}: the age is missing; ages cannot be "
                "imputed, so remove that subject or use --feature-nans remove."
            )
    else:
        keep = ~np.isnan(age) & ~np.isnan(features).any(axis=1)
        dropped = int(keep.size - keep.sum())
        if not keep.any():
            raise DeltabInputError(
                f"every subject in {table.path} has a missing age or feature, so "
                "--feature-nans remove leaves none."
            )
        if dropped:
            _note(
                prog,
                f"left out {dropped} of {keep.size} subjects in {table.path} with a missing "
                "age or feature (--feature-nans remove).",
            )
            features, age = features[keep], age[keep]
            ids = tuple(i for i, k in zip(ids, keep, strict=True) if k) if ids else None
    return Subjects(
        features=features,
        age=age,
        ids=ids,
        source=table.path,
        feature_names=table.feature_names,
        named=table.has_header,
    )
