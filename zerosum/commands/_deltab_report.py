"""What `zerosum deltab` tells its user: a run summary, a degenerate fit, the model as text.

The public ``deltab`` tool logs what it does on stderr and writes its model
as a pickle; here a successful run prints a few summary lines on stdout,
``--debug`` adds detail on stderr, a fit that can only interpolate the
training ages raises a :class:`~node.deltab.exceptions.DeltabWarning`, and
``--save-text FOLDER`` writes the fitted model as plain text that any program
(or person) can read: ``summary.txt`` says in words and formulas how the
numbers predict, and every array is a ``.txt`` file of numbers, one row per
line. The training data themselves are never written: a model may leave a TRE,
its subjects may not.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from node.deltab.exceptions import DeltabWarning
from node.deltab.io import DeltabInputError, Table
from node.deltab.model import BrainAgeModel
from node.deltab.persist import model_to_dict

__all__ = [
    "SUMMARY_NAME",
    "check_interpolation",
    "check_text_folder",
    "describe_model",
    "describe_table",
    "fit_naming_columns",
    "write_model_text",
]

SUMMARY_NAME = "summary.txt"
# Training deltas this small (in years) are rounding error: the fit reproduced every age.
_ZERO_DELTA_YEARS = 1e-6

_ARRAY_MEANINGS = {
    "feature_fill": "value that replaces a missing feature (training median or mean), per feature",
    "feature_mean": "training mean of each feature",
    "feature_scale": "training spread of each feature (standardisation divisor)",
    "support": "0-based indices of the features in the model (the others did not vary)",
    "confound_mean": "training mean of each confound (none on the command line)",
    "confound_scale": "training spread of each confound",
    "feature_adjust": "[1 + confounds] x features: intercept (and confound) terms removed from z",
    "age_adjust": "[1 + confounds]: intercept (and confound) terms removed from y",
    "agesq_adjust": "[1 + confounds]: intercept (and confound) terms removed from y squared",
    "components": "features x k: principal directions V of the standardised features",
    "singular_values": "k: singular values S (u = z V / S)",
    "explained_variance": "k: variance of the standardised features along each component",
    "b1": "k: coefficients of age on the components (Smith et al. beta_1)",
    "b2": "1: linear age bias of the simple delta (beta_2)",
    "b2sq": "2: linear and quadratic age bias of the simple delta (beta_2, quadratic model)",
    "gamma": "1 x k: components regressed on age (alternate model, lambda)",
    "gammasq": "2 x k: components regressed on age and age squared (alternate_quadratic)",
}

_FORMULAS = """\
How the numbers predict (Smith et al. 2019, NeuroImage 200:528-539), for one
subject with features x (missing values replaced by feature_fill) and true age a,
on the command line without confounds:

  z  = (x[support] - feature_mean[support]) / feature_scale[support]
  u  = (z - feature_adjust[0]) @ components / singular_values
  y  = (a - age_mean) / age_scale - age_adjust[0]
  q  = ((a - age_mean) / age_scale)^2 - agesq_adjust[0] - agesq_orth * y

  simple              delta = (u @ b1 - y) * age_scale
  unbiased            delta = (u @ b1 - y - b2[0] * y) * age_scale
  unbiased_quadratic  delta = (u @ b1 - y - b2sq[0] * y - b2sq[1] * q) * age_scale
  alternate           delta = ((u - y * L) @ L / (L @ L)) * age_scale,  L = gamma[0]
  alternate_quadratic delta = ((u - y * L - q * gammasq[1]) @ L / (L @ L)) * age_scale,
                              L = gammasq[0]

  brain age = a + delta
"""


def describe_model(model: BrainAgeModel) -> str:
    """``5 principal components, 61.2 % of the feature variance``."""
    k = int(model.n_components_)
    share = float(np.sum(model.explained_variance_ratio_))
    plural = "component" if k == 1 else "components"
    return f"{k} principal {plural}, {100 * share:.1f} % of the feature variance"


def describe_table(table: Table) -> str:
    """How a table was read: delimiter, header, id and age columns, size, missing cells."""
    layout = {"\t": "tab-separated", ",": "comma-separated", None: "whitespace-separated"}
    parts = [
        layout.get(table.delimiter, repr(table.delimiter)),
        "with a header" if table.has_header else "without a header",
        "ids" if table.ids is not None else "no ids",
        "an 'age' column" if table.age is not None else "no 'age' column",
        f"{table.n_subjects} subjects x {table.n_features} features",
        f"{int(np.isnan(table.features).sum())} missing feature cells",
    ]
    return f"read {table.path}: " + ", ".join(parts)


def fit_naming_columns(
    model: BrainAgeModel,
    features: NDArray[np.float64],
    age: NDArray[np.float64],
    *,
    feature_names: Sequence[str],
    source: Path,
) -> None:
    """Fit, re-issuing the estimator's warnings; constant features are named by column."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(features, age)
    left_out = np.flatnonzero(~model.support_)
    for item in caught:
        if left_out.size and "no variance" in str(item.message):
            shown = ", ".join(repr(feature_names[j]) for j in left_out[:10])
            more = "" if left_out.size <= 10 else f" and {left_out.size - 10} more"
            warnings.warn(
                f"{left_out.size} feature(s) of {source} do not vary across the "
                f"training subjects and are left out of the model: {shown}{more}.",
                item.category,
                stacklevel=2,
            )
        else:
            warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)


def check_interpolation(
    model: BrainAgeModel, features: NDArray[np.float64], age: NDArray[np.float64], source: Path
) -> None:
    """Warn (DeltabWarning) when the fit reproduces the training ages exactly.

    Age is regressed on k components of N centred subjects: with k ≥ N − 1 the
    regression has no residual degrees of freedom, so every training delta is
    0 up to rounding and the model has learnt nothing it can check. The same
    happens, whatever k, when the features determine the ages exactly; both
    are detected by the training deltas of the simple model.
    """
    n = int(model.n_subjects_)
    p = int(model.n_features_in_)
    k = int(model.n_components_)
    simple = copy.copy(model).set_params(model="simple")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeltabWarning)
        delta = simple.predict_delta(features, age)
    largest = float(np.nanmax(np.abs(delta))) if delta.size else 0.0
    if k < n - 1 and largest >= _ZERO_DELTA_YEARS:
        return
    if k >= n - 1:
        why = (
            f"{n} subjects and {p} features: the model's {k} principal components and the mean "
            f"fit the {n} training ages exactly"
        )
        remedy = (
            "train on more subjects than features, or keep fewer components (--feature-num, "
            "--feature-proportion)"
        )
    else:
        why = (
            f"the features of {n} subjects determine their ages exactly ({p} features, {k} "
            "components)"
        )
        remedy = "check that no feature column is the age itself or a function of it"
    warnings.warn(
        f"{source}: {why}, so every training delta is 0 up to rounding (largest "
        f"{largest:.1e} years) and the model is degenerate: it cannot estimate brain age. "
        f"{remedy[0].upper()}{remedy[1:]}.",
        DeltabWarning,
        stacklevel=2,
    )


def check_text_folder(folder: str | Path, *, overwrite: bool) -> Path:
    """Where --save-text writes: a new folder in an existing one, or one it may overwrite."""
    target = Path(folder)
    if target.exists() and not target.is_dir():
        raise DeltabInputError(f"--save-text {target}: it is a file; give a folder.")
    if not target.parent.is_dir():
        raise DeltabInputError(f"--save-text {target}: the folder {target.parent} does not exist.")
    if (target / SUMMARY_NAME).exists() and not overwrite:
        raise DeltabInputError(
            f"{target} already holds a model saved as text; pass --overwrite to replace it or "
            "choose another folder."
        )
    return target


def _number(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else "nan"


def _array_lines(values: NDArray[np.float64] | list[object]) -> list[str]:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        return [_number(v) for v in array]
    return [" ".join(_number(v) for v in row) for row in array]


def write_model_text(
    model: BrainAgeModel,
    folder: Path,
    *,
    feature_names: Sequence[str] | None,
    trained_on: str,
) -> list[Path]:
    """Write ``summary.txt`` and one ``<array>.txt`` per fitted array; return the paths."""
    document = model_to_dict(model)
    arrays: dict[str, list[object]] = document["arrays"]
    folder.mkdir(exist_ok=True)
    written: list[Path] = []
    index_lines = []
    for name, values in arrays.items():
        path = folder / f"{name}.txt"
        lines = [str(v) for v in values] if name == "support" else _array_lines(values)
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        written.append(path)
        shape = "x".join(str(d) for d in np.asarray(values, dtype=np.float64).shape)
        index_lines.append(f"  {name + '.txt':<24} [{shape}] {_ARRAY_MEANINGS.get(name, '')}")
    if feature_names is not None:
        path = folder / "feature_names.txt"
        path.write_text("".join(f"{n}\n" for n in feature_names), encoding="utf-8")
        written.append(path)
        index_lines.append(
            f"  {'feature_names.txt':<24} [{len(feature_names)}] training column of each feature"
        )
    params = document["params"]
    chosen = {k: v for k, v in params.items() if k != "model" and v not in (None, False)}
    reduction = ", ".join(f"{k}={v}" for k, v in chosen.items()) or "none"
    summary = [
        "zerosum brain-age model, saved as text (zerosum deltab --save-text)",
        "",
        f"trained on:      {trained_on}",
        f"model:           {model.model} (other kinds predict from the same numbers)",
        f"subjects:        {int(document['n_subjects'])}",
        f"features:        {document['n_features_in']} "
        f"({int(np.sum(model.support_))} in the model)",
        f"components:      {describe_model(model)}",
        f"parameters:      {reduction}",
        f"age_mean:        {_number(document['age_mean'])}",
        f"age_scale:       {_number(document['age_scale'])}",
        f"agesq_orth:      {_number(document['agesq_orth'])}",
        f"total_variance:  {_number(document['total_variance'])}",
        "",
        "files (numbers separated by spaces, one row per line; shapes in brackets):",
        *index_lines,
        "",
        _FORMULAS,
        "This folder is for reading. zerosum loads models from the JSON file of --save.",
    ]
    path = folder / SUMMARY_NAME
    path.write_text("\n".join(summary).rstrip("\n") + "\n", encoding="utf-8")
    written.append(path)
    return written
