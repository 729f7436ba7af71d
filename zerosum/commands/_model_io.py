"""A saved model meets a table: loading the model file and lining up the table's columns.

Shared by ``zerosum deltab --load`` and ``zerosum predict``. A model saved
from a table with a header carries its feature names (node.deltab.persist),
so a table with a header is matched to it by name: the same columns in
another order are reordered, with a note on stderr; other columns are refused
with their names. A model or table without names is matched by position, and
only the number of columns is checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from node.deltab.exceptions import ModelFileError
from node.deltab.io import DeltabInputError, select_features
from node.deltab.model import BrainAgeModel
from node.deltab.persist import feature_names_of, load_model

__all__ = ["check_feature_count", "features_for_model", "load_model_file"]


def load_model_file(path: str | Path) -> BrainAgeModel:
    """Load a saved model, turning file problems into one sentence that names the file."""
    try:
        return load_model(path)
    except ModelFileError as exc:
        raise DeltabInputError(f"cannot load the model {path}: {exc}") from None
    except FileNotFoundError:
        raise DeltabInputError(f"cannot read {path}: there is no such file.") from None
    except OSError as exc:
        raise DeltabInputError(f"cannot read {path}: {exc.strerror or exc}.") from None


def check_feature_count(model: object, table_path: Path, n_features: int) -> None:
    """Refuse a table whose feature count differs from the model's, naming the file."""
    expected = getattr(model, "n_features_in_", None)
    if expected is not None and expected != n_features:
        raise DeltabInputError(
            f"{table_path} has {n_features} feature columns but the model was trained on "
            f"{expected}; give the same features in the same order."
        )


def features_for_model(
    prog: str,
    model: BrainAgeModel,
    source: Path,
    columns: tuple[str, ...],
    features: NDArray[np.float64],
    *,
    named: bool,
) -> NDArray[np.float64]:
    """``features`` (columns named ``columns``) in the model's column order.

    ``named`` says whether ``columns`` come from a header; without one (or
    when the model has no names) the columns are taken by position.
    """
    names = feature_names_of(model)
    if names is None or not named:
        check_feature_count(model, source, features.shape[1])
        return features
    matched, reordered = select_features(source, columns, features, names)
    if reordered:
        print(
            f"{prog}: note: the feature columns of {source} are in another order than the "
            "model's; they were matched to the model by name.",
            file=sys.stderr,
        )
    return matched
