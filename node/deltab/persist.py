"""Save and load a fitted brain-age model as JSON (never pickle).

A model file may come from another site, so loading executes nothing: it
parses JSON, checks the format name and version, every parameter, every array's
type and shape against the others, and refuses anything else with a
:class:`~node.deltab.exceptions.ModelFileError` (a ``ValueError``) whose message
names the offending field.

Layout (format_version 1)::

    {
      "format": "zerosum-deltab",
      "format_version": 1,
      "params": {"model": ..., "n_components": ..., "feature_proportion": ...,
                 "variance_explained": ..., "kaiser_guttman": ..., "nan_policy": ...},
      "n_features_in": P, "n_confounds": C, "n_components": k, "n_subjects": N,
      "feature_names": [P distinct column names]   (optional),
      "training_bounds": {"feature_low": [P], "feature_high": [P]}   (optional),
      "age_mean": ..., "age_scale": ..., "agesq_orth": ..., "total_variance": ...,
      "arrays": {"feature_fill": [P], "feature_mean": [P], "feature_scale": [P],
                 "support": [indices of the P' features in the model],
                 "confound_mean": [C], "confound_scale": [C],
                 "feature_adjust": [1+C][P'], "age_adjust": [1+C], "agesq_adjust": [1+C],
                 "components": [P'][k], "singular_values": [k], "explained_variance": [k],
                 "b1": [k], "b2": [1], "b2sq": [2], "gamma": [1][k], "gammasq": [2][k]}
    }

Floats are written with Python's shortest round-trip representation, so a
loaded model predicts exactly what the saved one did.

``feature_names`` (the training table's column names, in the model's order)
is written when the model carries them — :func:`set_feature_names` attaches
them as ``feature_names_in_``, the scikit-learn name — so that a prediction
can match a table's columns by name; files without it (older files, models
trained on headerless tables) load as before and are matched by position.

``training_bounds`` are the public bounds every training value was clipped to
(a federated model's ``[plan.clipping]``), attached by
:func:`set_training_bounds` as ``feature_bounds_``: the model has never seen a
value outside them, so a prediction clips to them, or refuses, and says how
many subjects and features lay outside (``node.deltab.out_of_range``). Files
without them load as before.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from bounded.files import LocalFileError, MissingFileError, read_limited_text
from bounded.nesting import NestingError, parse_json
from node.deltab._checks import FloatArray, check_nan_policy
from node.deltab._params import Reduction, check_model
from node.deltab.exceptions import ModelFileError
from node.deltab.model import BrainAgeModel

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "dumps",
    "feature_names_of",
    "load_model",
    "loads",
    "model_from_dict",
    "model_to_dict",
    "save_model",
    "set_feature_names",
    "set_training_bounds",
    "training_bounds_of",
]

FORMAT = "zerosum-deltab"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 1 << 30

_SCALARS = ("age_mean", "age_scale", "agesq_orth", "total_variance", "n_subjects")
_COUNTS = ("n_features_in", "n_confounds", "n_components")
_ARRAYS = (
    "feature_fill",
    "feature_mean",
    "feature_scale",
    "confound_mean",
    "confound_scale",
    "feature_adjust",
    "age_adjust",
    "agesq_adjust",
    "components",
    "singular_values",
    "explained_variance",
    "b1",
    "b2",
    "b2sq",
    "gamma",
    "gammasq",
)
_TOP_KEYS = {
    "format",
    "format_version",
    "params",
    "arrays",
    "feature_names",
    "training_bounds",
    *_SCALARS,
    *_COUNTS,
}
_NAMES_ATTRIBUTE = "feature_names_in_"
_BOUNDS_ATTRIBUTE = "feature_bounds_"


def _check_names(names: object, n_features: int) -> tuple[str, ...]:
    """``names`` as a tuple of ``n_features`` distinct non-empty strings, or ValueError."""
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) and n for n in names):
        raise ValueError("'feature_names' must be a list of non-empty strings.")
    if len(names) != n_features:
        raise ValueError(
            f"'feature_names' has {len(names)} names but the model has {n_features} features."
        )
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"'feature_names' names {name!r} twice.")
        seen.add(name)
    return tuple(names)


def set_feature_names(model: BrainAgeModel, names: Sequence[str]) -> BrainAgeModel:
    """Attach the training table's column names to a fitted model (saved with it)."""
    model._check_fitted()
    setattr(model, _NAMES_ATTRIBUTE, _check_names(tuple(names), int(model.n_features_in_)))
    return model


def _check_bounds(low: object, high: object, n_features: int) -> tuple[FloatArray, FloatArray]:
    """(low, high) as P finite floats each with low < high, or ValueError."""
    arrays = []
    for name, value in (("feature_low", low), ("feature_high", high)):
        if not isinstance(value, list | tuple | np.ndarray):
            raise ValueError(f"'training_bounds.{name}' must be a list of {n_features} numbers.")
        if any(isinstance(v, bool) or not isinstance(v, int | float | np.floating) for v in value):
            raise ValueError(f"'training_bounds.{name}' must hold numbers only.")
        array = np.asarray(value, dtype=np.float64)
        if array.shape != (n_features,) or not np.isfinite(array).all():
            raise ValueError(
                f"'training_bounds.{name}' must be {n_features} finite numbers; got {array.size}."
            )
        arrays.append(array)
    if not (arrays[0] < arrays[1]).all():
        j = int(np.flatnonzero(~(arrays[0] < arrays[1]))[0])
        raise ValueError(f"'training_bounds' of feature {j}: the low bound must be below the high.")
    return arrays[0], arrays[1]


def set_training_bounds(
    model: BrainAgeModel, low: Sequence[float] | FloatArray, high: Sequence[float] | FloatArray
) -> BrainAgeModel:
    """Attach the bounds every training value was clipped to (saved with the model)."""
    model._check_fitted()
    setattr(model, _BOUNDS_ATTRIBUTE, _check_bounds(list(low), list(high), model.n_features_in_))
    return model


def training_bounds_of(model: BrainAgeModel) -> tuple[FloatArray, FloatArray] | None:
    """The (low, high) feature bounds the model was trained within, if it carries them."""
    bounds = getattr(model, _BOUNDS_ATTRIBUTE, None)
    return None if bounds is None else (bounds[0], bounds[1])


def feature_names_of(model: BrainAgeModel) -> tuple[str, ...] | None:
    """The column names the model was trained on, if it carries them."""
    names = getattr(model, _NAMES_ATTRIBUTE, None)
    return None if names is None else tuple(names)


def _header(model: BrainAgeModel) -> dict[str, Any]:
    model._check_fitted()
    document: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "params": model.get_params(),
        "n_features_in": int(model.n_features_in_),
        "n_confounds": int(model.n_confounds_),
        "n_components": int(model.n_components_),
    }
    document |= {name: float(getattr(model, name + "_")) for name in _SCALARS}
    names = feature_names_of(model)
    if names is not None:
        # Checked again here: a refit with another number of features leaves stale names.
        document["feature_names"] = list(_check_names(names, int(model.n_features_in_)))
    bounds = training_bounds_of(model)
    if bounds is not None:
        low, high = _check_bounds(*bounds, int(model.n_features_in_))
        document["training_bounds"] = {"feature_low": low.tolist(), "feature_high": high.tolist()}
    return document


def _arrays(model: BrainAgeModel) -> Iterator[tuple[str, np.ndarray]]:
    for name in _ARRAYS:
        yield name, getattr(model, name + "_")
    yield "support", np.flatnonzero(model.support_)


def model_to_dict(model: BrainAgeModel) -> dict[str, Any]:
    """The JSON-ready description of a fitted model (arrays as nested lists)."""
    document = _header(model)
    document["arrays"] = {name: array.tolist() for name, array in _arrays(model)}
    return document


def _write(model: BrainAgeModel, stream: TextIO) -> None:
    """Write the document row by row, so that a large model is never held twice as text."""
    header = json.dumps(_header(model), allow_nan=False, indent=1)
    stream.write(header[: header.rindex("}")].rstrip())
    stream.write(',\n "arrays": {')
    for index, (name, array) in enumerate(_arrays(model)):
        stream.write(("," if index else "") + f"\n  {json.dumps(name)}: ")
        if array.ndim == 1:
            stream.write(json.dumps(array.tolist(), allow_nan=False))
            continue
        stream.write("[")
        for row_index, row in enumerate(array):
            prefix = "," if row_index else ""
            stream.write(f"{prefix}\n   {json.dumps(row.tolist(), allow_nan=False)}")
        stream.write("]")
    stream.write("\n }\n}\n")


def dumps(model: BrainAgeModel) -> str:
    """The JSON text :func:`save_model` writes."""
    buffer = io.StringIO()
    _write(model, buffer)
    return buffer.getvalue()


def save_model(model: BrainAgeModel, path: str | os.PathLike[str]) -> None:
    """Write the model to ``path`` atomically (a partial file is never left behind)."""
    target = Path(path)
    model._check_fitted()
    handle, temporary = tempfile.mkstemp(dir=target.parent or Path("."), prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            _write(model, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _reject_constant(token: str) -> float:
    raise ModelFileError(f"the model file contains {token}, which is not a number JSON allows.")


def loads(text: str) -> BrainAgeModel:
    """A model from its JSON text (validated; see the module docstring)."""
    try:
        document = parse_json(text, what="the model file", parse_constant=_reject_constant)
    except NestingError as exc:
        raise ModelFileError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"the model file is not valid JSON: {exc}") from None
    return model_from_dict(document)


def load_model(path: str | os.PathLike[str]) -> BrainAgeModel:
    """Read and validate a model saved by :func:`save_model`.

    The file is read with :func:`bounded.files.read_limited_text`: a FIFO, a
    device, a file over :data:`MAX_FILE_BYTES` or one that is not UTF-8 is a
    :class:`ModelFileError` naming it, before anything is parsed; a missing
    file is a FileNotFoundError.
    """
    source = Path(path)
    try:
        text = read_limited_text(source, MAX_FILE_BYTES, what="model file")
    except MissingFileError:
        raise
    except LocalFileError as exc:
        raise ModelFileError(f"{exc}; refusing to read it.") from None
    return loads(text)


def _count(document: dict[str, Any], name: str, minimum: int) -> int:
    value = document.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ModelFileError(f"{name!r} must be an integer of at least {minimum}; got {value!r}.")
    return value


def _scalar(document: dict[str, Any], name: str) -> float:
    value = document.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ModelFileError(f"{name!r} must be a finite number; got {value!r}.")
    return float(value)


def _array(arrays: dict[str, Any], name: str, shape: tuple[int, ...]) -> FloatArray:
    if name not in arrays:
        raise ModelFileError(f"the model file has no array {name!r}.")
    try:
        raw = np.array(arrays[name])
    except ValueError:
        raise ModelFileError(f"array {name!r} is ragged; expected shape {shape}.") from None
    if raw.size and raw.dtype.kind not in "iuf":
        raise ModelFileError(f"array {name!r} must hold numbers only; found {raw.dtype} values.")
    if raw.shape != shape:
        if raw.size == 0 and math.prod(shape) == 0:
            raw = raw.reshape(shape)
        else:
            raise ModelFileError(f"array {name!r} has shape {raw.shape}; expected {shape}.")
    values = raw.astype(np.float64)
    if not np.isfinite(values).all():
        raise ModelFileError(f"array {name!r} contains a non-finite value.")
    return values


def _support(arrays: dict[str, Any], n_features: int) -> np.ndarray:
    indices = arrays.get("support")
    if not isinstance(indices, list) or not indices:
        raise ModelFileError("'support' must be a non-empty list of feature indices.")
    if any(isinstance(i, bool) or not isinstance(i, int) for i in indices):
        raise ModelFileError("'support' must list integer feature indices.")
    if (
        indices[0] < 0
        or indices[-1] >= n_features
        or any(b <= a for a, b in itertools.pairwise(indices))
    ):
        raise ModelFileError(
            f"'support' must list increasing feature indices between 0 and {n_features - 1}."
        )
    mask = np.zeros(n_features, dtype=bool)
    mask[indices] = True
    return mask


def model_from_dict(document: object) -> BrainAgeModel:
    """A fitted model from the parsed JSON document, after checking all of it."""
    top = _checked_top(document)
    params = _checked_params(top)
    p = _count(top, "n_features_in", 1)
    c = _count(top, "n_confounds", 0)
    k = _count(top, "n_components", 1)
    scalars = {name: _scalar(top, name) for name in _SCALARS}
    if not scalars["age_scale"] > 0 or not scalars["total_variance"] > 0:
        raise ModelFileError("'age_scale' and 'total_variance' must be positive.")
    arrays = top.get("arrays")
    if not isinstance(arrays, dict):
        raise ModelFileError("'arrays' must be a JSON object of named arrays.")
    unknown = sorted(set(arrays) - {*_ARRAYS, "support"})
    if unknown:
        raise ModelFileError(f"the model file has unexpected array(s) {unknown}.")
    support = _support(arrays, p)
    kept = int(support.sum())
    if k > kept:
        raise ModelFileError(f"'n_components' is {k} but only {kept} features are in the model.")
    values = {name: _array(arrays, name, shape) for name, shape in _shapes(p, c, k, kept).items()}
    for name in ("feature_scale", "confound_scale", "singular_values"):
        if not (values[name] > 0).all():
            raise ModelFileError(f"array {name!r} must be strictly positive.")

    model = BrainAgeModel().set_params(**params)
    model.n_features_in_ = p
    model.n_confounds_ = c
    model.n_components_ = k
    model.n_subjects_ = scalars["n_subjects"]
    model.age_mean_ = scalars["age_mean"]
    model.age_scale_ = scalars["age_scale"]
    model.agesq_orth_ = scalars["agesq_orth"]
    model.total_variance_ = scalars["total_variance"]
    model.support_ = support
    for name, value in values.items():
        setattr(model, name + "_", value)
    _set_column_facts(model, top, p)
    return model


def _checked_top(document: object) -> dict[str, Any]:
    """The document, once its format, version and top-level fields are this version's."""
    if not isinstance(document, dict):
        raise ModelFileError("a model file must hold a JSON object at the top level.")
    if document.get("format") != FORMAT:
        raise ModelFileError(
            f"this is not a {FORMAT} model file (format is {document.get('format')!r})."
        )
    version = document.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise ModelFileError(
            f"model format_version {version!r} is not supported; this version reads "
            f"format_version {FORMAT_VERSION}."
        )
    unknown = sorted(set(document) - _TOP_KEYS)
    if unknown:
        raise ModelFileError(f"the model file has unexpected field(s) {unknown}.")
    return document


def _checked_params(document: dict[str, Any]) -> dict[str, Any]:
    """``params``: exactly the estimator's parameters, each valid."""
    params = document.get("params")
    if not isinstance(params, dict) or set(params) != set(BrainAgeModel().get_params()):
        raise ModelFileError(f"'params' must hold exactly {sorted(BrainAgeModel().get_params())}.")
    try:
        check_model(params["model"])
        check_nan_policy(params["nan_policy"])
        Reduction.from_params(
            params["n_components"],
            params["feature_proportion"],
            params["variance_explained"],
            params["kaiser_guttman"],
        )
    except ValueError as exc:
        raise ModelFileError(f"invalid parameter in the model file: {exc}") from None
    return params


def _shapes(p: int, c: int, k: int, kept: int) -> dict[str, tuple[int, ...]]:
    """The shape of every fitted array, for P features, C confounds, K components."""
    return {
        "feature_fill": (p,),
        "feature_mean": (p,),
        "feature_scale": (p,),
        "confound_mean": (c,),
        "confound_scale": (c,),
        "feature_adjust": (1 + c, kept),
        "age_adjust": (1 + c,),
        "agesq_adjust": (1 + c,),
        "components": (kept, k),
        "singular_values": (k,),
        "explained_variance": (k,),
        "b1": (k,),
        "b2": (1,),
        "b2sq": (2,),
        "gamma": (1, k),
        "gammasq": (2, k),
    }


def _set_column_facts(model: BrainAgeModel, document: dict[str, Any], p: int) -> None:
    """The optional feature names and training bounds, checked, onto ``model``."""
    if "feature_names" in document:
        try:
            names = _check_names(document["feature_names"], p)
        except ValueError as exc:
            raise ModelFileError(str(exc)) from None
        setattr(model, _NAMES_ATTRIBUTE, names)
    if "training_bounds" in document:
        bounds = document["training_bounds"]
        if not isinstance(bounds, dict) or set(bounds) != {"feature_low", "feature_high"}:
            raise ModelFileError(
                "'training_bounds' must be an object with exactly feature_low and feature_high."
            )
        try:
            checked = _check_bounds(bounds["feature_low"], bounds["feature_high"], p)
        except ValueError as exc:
            raise ModelFileError(str(exc)) from None
        setattr(model, _BOUNDS_ATTRIBUTE, checked)
