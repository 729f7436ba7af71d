"""JSON persistence of fitted models: exact round trips, and refusal of anything malformed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from node.deltab import (
    MODELS,
    BrainAgeModel,
    DeltabWarning,
    ModelFileError,
    NotFittedError,
    load_model,
    save_model,
)
from node.deltab.persist import (
    FORMAT,
    FORMAT_VERSION,
    dumps,
    feature_names_of,
    loads,
    model_to_dict,
    set_feature_names,
)
from tests.support.cohorts import Cohort, CohortFactory


@pytest.fixture(scope="module")
def fitted(cohort_factory: CohortFactory) -> tuple[BrainAgeModel, Cohort]:
    data = cohort_factory(71, n=200, p=12, n_confounds=1, nan_fraction=0.02)
    X = np.insert(data.X, 2, 7.5, axis=1)  # a constant feature, left out of the model
    data = Cohort(X=X, age=data.age, delta=data.delta, confounds=data.confounds)
    with pytest.warns(DeltabWarning):
        model = BrainAgeModel("unbiased_quadratic", kaiser_guttman=True).fit(
            data.X, data.age, data.confounds
        )
    return model, data


def test_round_trip_predicts_identically_for_every_model(
    fitted: tuple[BrainAgeModel, Cohort], tmp_path: Path
) -> None:
    model, data = fitted
    path = tmp_path / "model.json"
    save_model(model, path)
    loaded = load_model(path)
    assert loaded.get_params() == model.get_params()
    for name, value in vars(model).items():
        if name.endswith("_"):
            np.testing.assert_array_equal(getattr(loaded, name), value, err_msg=name)
    for name in MODELS:
        model.set_params(model=name)
        loaded.set_params(model=name)
        np.testing.assert_array_equal(
            loaded.predict_delta(data.X, data.age, data.confounds),
            model.predict_delta(data.X, data.age, data.confounds),
        )
    model.set_params(model="unbiased_quadratic")


def test_file_is_plain_json_with_format_and_version(
    fitted: tuple[BrainAgeModel, Cohort], tmp_path: Path
) -> None:
    path = tmp_path / "model.json"
    save_model(fitted[0], path)
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["format"] == FORMAT == "zerosum-deltab"
    assert document["format_version"] == FORMAT_VERSION == 1
    assert document["params"]["model"] == "unbiased_quadratic"
    assert 2 not in document["arrays"]["support"]
    assert [p.name for p in tmp_path.iterdir()] == ["model.json"]  # no temporary left behind


def test_unfitted_model_cannot_be_saved(tmp_path: Path) -> None:
    with pytest.raises(NotFittedError):
        save_model(BrainAgeModel(), tmp_path / "model.json")


def _broken(document: dict[str, Any], path: tuple[str, ...], value: object) -> str:
    changed = copy.deepcopy(document)
    target = changed
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(changed)


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("format",), "deltab-pickle", "not a zerosum-deltab model file"),
        (("format_version",), 2, "format_version 2 is not supported"),
        (("format_version",), True, "format_version True is not supported"),
        (("extra",), 1, "unexpected field"),
        (("params", "model"), "quadratic", "invalid parameter.*model must be one of"),
        (("params", "n_components"), 5, "invalid parameter.*at most one"),
        (("params", "verbose"), True, "'params' must hold exactly"),
        (("n_features_in",), "13", "'n_features_in' must be an integer"),
        (("age_scale",), -1.0, "must be positive"),
        (("age_mean",), None, "'age_mean' must be a finite number"),
        (("arrays", "b1"), _DELETE, "no array 'b1'"),
        (("arrays", "b2sq"), [1.0, 2.0, 3.0], r"'b2sq' has shape \(3,\); expected \(2,\)"),
        (("arrays", "b2"), ["0.5"], "must hold numbers only"),
        (("arrays", "b2"), [True], "must hold numbers only"),
        (("arrays", "gamma"), [[1.0], [1.0, 2.0]], "ragged"),
        (("arrays", "feature_scale"), [0.0] * 13, "'feature_scale' must be strictly positive"),
        (("arrays", "support"), [0, 1, 99], "increasing feature indices between 0 and 12"),
        (("arrays", "support"), [1, 0], "increasing feature indices"),
        (("arrays", "support"), [], "non-empty list"),
        (("arrays", "code"), "import os", "unexpected array"),
    ],
)
def test_malformed_files_are_refused(
    fitted: tuple[BrainAgeModel, Cohort], path: tuple[str, ...], value: object, message: str
) -> None:
    document = model_to_dict(fitted[0])
    with pytest.raises(ModelFileError, match=message):
        loads(_broken(document, path, value))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object at the top level"),
        ('{"format": "zerosum-deltab", "x": NaN}', "NaN, which is not a number JSON allows"),
    ],
)
def test_non_model_text_is_refused(text: str, message: str) -> None:
    with pytest.raises(ModelFileError, match=message):
        loads(text)
    assert issubclass(ModelFileError, ValueError)


def test_non_text_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.pkl"
    path.write_bytes(b"\x80\x04\x95\xff\xfe")
    with pytest.raises(ModelFileError, match="not UTF-8 text"):
        load_model(path)


def test_dumps_and_loads_are_inverse(fitted: tuple[BrainAgeModel, Cohort]) -> None:
    text = dumps(fitted[0])
    assert dumps(loads(text)) == text


def test_feature_names_are_saved_loaded_and_optional(
    fitted: tuple[BrainAgeModel, Cohort], tmp_path: Path
) -> None:
    model = copy.copy(fitted[0])
    names = tuple(f"idp_{j}" for j in range(13))
    # A file without names (every file written before they were saved) loads as before.
    plain = dumps(model)
    assert "feature_names" not in json.loads(plain)
    assert feature_names_of(loads(plain)) is None
    set_feature_names(model, names)
    text = dumps(model)
    assert json.loads(text)["feature_names"] == list(names)
    loaded = loads(text)
    assert feature_names_of(loaded) == names
    assert dumps(loaded) == text
    path = tmp_path / "named.json"
    save_model(loaded, path)
    assert feature_names_of(load_model(path)) == names
    with pytest.raises(ValueError, match="'feature_names' has 2 names but the model has 13"):
        set_feature_names(model, ("a", "b"))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["a"] * 13, "'feature_names' names 'a' twice"),
        ([f"f{j}" for j in range(12)], "'feature_names' has 12 names but the model has 13"),
        ([*[f"f{j}" for j in range(12)], 3], "must be a list of non-empty strings"),
        ([*[f"f{j}" for j in range(12)], ""], "must be a list of non-empty strings"),
        ("f0,f1", "must be a list of non-empty strings"),
    ],
)
def test_malformed_feature_names_are_refused(
    fitted: tuple[BrainAgeModel, Cohort], value: object, message: str
) -> None:
    document = model_to_dict(fitted[0])
    document["feature_names"] = value
    with pytest.raises(ModelFileError, match=message):
        loads(json.dumps(document))
