"""The node's local cohort: read, checked against the federation's rules, before any contact.

A node refuses to start — before it opens a connection — when its data could
not take part correctly: the file is unreadable or ragged, there is no age
column or an age is missing, the number of features differs from the
federation's model, the feature columns are not those the bounds name
(``plan.clipping.feature_names``: a missing, an extra or a misplaced column
is named — bounds in another order would apply to the wrong features), a
feature has no observed value at all, or the cohort is
smaller than ``min_cohort_size`` (the N ≥ 100 rule for UK TREs; δ ≤ 1/N² is
calibrated for it). Missing feature values are allowed: the plan leaves their
subjects out (``nan_policy = "drop"``, and then checks the cohort size on the
subjects left) or replaces them by the global means of the observed values
(``"mean"``). Each problem is one sentence naming the file and, where it
applies, the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from node.deltab.io import DeltabInputError, no_age_column, read_table
from node.errors import LocalDataError
from node.plans.deltab.settings import DeltabSettings
from proto.federation import FederationConfig

__all__ = ["LocalCohort", "LocalDataError", "check_columns", "load_cohort"]


@dataclass(frozen=True, eq=False)
class LocalCohort:
    """Subjects of this node: ids, true ages and features (NaN where missing)."""

    path: Path
    ids: tuple[str, ...]
    age: NDArray[np.float64]
    features: NDArray[np.float64]
    feature_names: tuple[str, ...]

    @property
    def n_subjects(self) -> int:
        return int(self.features.shape[0])


def _listed(names: list[str], shown: int = 4) -> str:
    text = ", ".join(repr(n) for n in names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")


def check_columns(path: Path, columns: tuple[str, ...], declared: tuple[str, ...]) -> None:
    """Refuse feature columns other than ``declared``, in that order, naming the difference."""
    if columns == declared:
        return
    present, wanted = set(columns), set(declared)
    missing = [n for n in declared if n not in present]
    extra = [n for n in columns if n not in wanted]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"lacks {_listed(missing)}")
        if extra:
            parts.append(f"has {_listed(extra)}, which the federation's bounds do not name")
        raise LocalDataError(
            f"{path} {' and '.join(parts)} (plan.clipping.feature_names lists {len(declared)} "
            f"features, the file has {len(columns)} feature columns); give exactly the features "
            "the federation declared bounds for."
        )
    misplaced = [(j, name) for j, name in enumerate(columns) if declared[j] != name]
    shown = ", ".join(
        f"{name!r} is feature column {j + 1} but its bounds are for column "
        f"{declared.index(name) + 1}"
        for j, name in misplaced[:3]
    )
    raise LocalDataError(
        f"{path} has the declared features in another order ({shown}"
        f"{', …' if len(misplaced) > 3 else ''}); the bounds in plan.clipping follow "
        "plan.clipping.feature_names, so put the columns in that order."
    )


def load_cohort(path: Path, config: FederationConfig) -> LocalCohort:
    """Read and check the cohort at ``path`` (raises :class:`LocalDataError`)."""
    path = Path(path)
    if not path.exists():
        raise LocalDataError(f"the data file {path} does not exist.")
    try:
        table = read_table(path)
    except DeltabInputError as error:
        raise LocalDataError(str(error)) from None
    except OSError as error:
        raise LocalDataError(f"the data file {path} cannot be read: {error.strerror}.") from None
    if table.age is None:
        raise LocalDataError(
            no_age_column(table, "a node's data needs a header with an 'age' column.")
        )
    missing_age = np.flatnonzero(np.isnan(table.age))
    if missing_age.size:
        line = int(table.lines[missing_age[0]])
        count = missing_age.size
        lacking = "1 subject lacks one" if count == 1 else f"{count} subjects lack one"
        raise LocalDataError(
            f"{path}: line {line} has no age; every subject needs an age ({lacking})."
        )
    settings = DeltabSettings.from_tables(config.plan.settings)
    check_columns(path, table.feature_names, settings.clipping.feature_names)
    expected = settings.n_features
    if table.n_features != expected:
        raise LocalDataError(
            f"{path} has {table.n_features} feature columns but the federation's model uses "
            f"{expected} (plan.model.n_features)."
        )
    empty = np.flatnonzero(np.all(np.isnan(table.features), axis=0))
    if empty.size:
        name = table.feature_names[int(empty[0])]
        raise LocalDataError(f"{path}: feature {name!r} has no observed value at all.")
    if table.n_subjects < config.min_cohort_size:
        raise LocalDataError(
            f"{path} has {table.n_subjects} subjects; the federation requires at least "
            f"{config.min_cohort_size} per node (min_cohort_size)."
        )
    ids = table.ids if table.ids is not None else tuple(str(int(n)) for n in table.lines)
    return LocalCohort(
        path=path,
        ids=tuple(ids),
        age=np.asarray(table.age, dtype=np.float64),
        features=np.asarray(table.features, dtype=np.float64),
        feature_names=table.feature_names,
    )
