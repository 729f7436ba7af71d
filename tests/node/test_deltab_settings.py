"""The brain-age plan's tables, [plan.model] and [plan.clipping]: validated with named fields."""

from __future__ import annotations

from typing import Any

import pytest

from node.deltab import MODELS
from node.plans.deltab.plan import deltab_plan_spec, deltab_rounds, plan_settings
from node.plans.deltab.settings import ClippingBounds, DeltabSettings
from noise.layout import Layout
from proto.federation import (
    ConfigError,
    FederationConfig,
    NodeEntry,
    PrivacyPolicy,
    parse_federation,
)
from proto.federation.writing import dump_federation


def tables(**changes: Any) -> dict[str, dict[str, Any]]:
    model: dict[str, Any] = {"kind": "unbiased_quadratic", "n_features": 4, "n_components": 2}
    clipping: dict[str, Any] = {
        "age_low": 45.0,
        "age_high": 85.0,
        "feature_names": ["f1", "f2", "f3", "f4"],
        "feature_low": -5.0,
        "feature_high": [5.0, 6.0, 7.0, 8.5],
    }
    for key, value in changes.items():
        table, _, name = key.partition("__")
        target = model if table == "model" else clipping
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    return {"model": model, "clipping": clipping}


def test_settings_round_trip_through_tables() -> None:
    settings = DeltabSettings.from_tables(tables())
    assert (settings.kind, settings.n_features, settings.n_components) == (
        "unbiased_quadratic",
        4,
        2,
    )
    assert settings.nan_policy == "drop"
    assert settings.clipping.feature_low == (-5.0,) * 4
    assert settings.clipping.feature_high == (5.0, 6.0, 7.0, 8.5)
    again = DeltabSettings.from_tables(settings.to_tables())
    assert again == settings
    assert settings.to_tables()["clipping"]["feature_low"] == -5.0  # shared bounds stay one number
    bounds = settings.clipping.bounds()
    assert bounds.n_features == 4 and bounds.age_hi == 85.0


BAD: list[tuple[dict[str, Any], str, str]] = [
    (tables(model__kind="linear"), "plan.model.kind", "one of 'simple'"),
    (tables(model__n_features=0), "plan.model.n_features", "at least 1"),
    (tables(model__n_components=5), "plan.model.n_components", "n_features = 4"),
    (tables(model__n_components=2.0), "plan.model.n_components", "whole number"),
    (tables(model__n_features=None), "plan.model.n_features", "is missing"),
    (tables(model__nan_policy="median"), "plan.model.nan_policy", "'drop', 'mean'"),
    (tables(model__depth=3), "plan.model.depth", "unknown setting"),
    (tables(clipping__age_high=45.0), "plan.clipping.age_high", "must exceed"),
    (tables(clipping__age_low=None), "plan.clipping.age_low", "is missing"),
    (
        tables(clipping__feature_high=[5.0, 6.0, 7.0]),
        "plan.clipping.feature_high",
        "lists 3 bounds for 4 features",
    ),
    (
        tables(clipping__feature_high=[5.0, -6.0, 7.0, 8.5]),
        "plan.clipping.feature_high[1]",
        "must exceed the lower bound -5.0",
    ),
    (tables(clipping__feature_high=[]), "plan.clipping.feature_high", "non-empty list"),
    (
        tables(clipping__feature_high=[5.0, "6", 7.0, 8.5]),
        "plan.clipping.feature_high[1]",
        "must be a number",
    ),
    (
        tables(clipping__feature_low=6.0, clipping__feature_high=5.0),
        "plan.clipping.feature_high",
        "lower bound 6.0",
    ),
    ({"model": tables()["model"]}, "plan.clipping", "needs a [plan.clipping] table"),
    ({"clipping": tables()["clipping"]}, "plan.model", "needs a [plan.model] table"),
    ({**tables(), "extra": {}}, "plan.extra", "unknown table"),
]


@pytest.mark.parametrize(("given", "field", "reason"), BAD)
def test_every_bad_setting_names_its_field(
    given: dict[str, dict[str, Any]], field: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        DeltabSettings.from_tables(given)
    assert caught.value.field == field, str(caught.value)
    assert reason in str(caught.value)


def test_model_kinds_are_listed_once() -> None:
    for kind in MODELS:
        assert DeltabSettings.from_tables(tables(model__kind=kind)).kind == kind
    assert DeltabSettings.comments()["plan.model.kind"] == ", ".join(MODELS)


def test_the_plan_spec_declares_every_round_and_layout_from_the_settings() -> None:
    settings = DeltabSettings.from_tables(tables())
    spec = deltab_plan_spec(settings)
    assert spec.name == "deltab"
    assert spec.rounds == deltab_rounds(settings)
    for round_spec in spec.rounds:
        assert isinstance(round_spec.layout, Layout)
        assert round_spec.layout.slot("sum_x").shape == (4,)
    config = FederationConfig(
        federation_id="f",
        coordinator_address="localhost:1",
        ca_certificate="ca.pem",
        nodes=(NodeEntry("a", b"\x01" * 32), NodeEntry("b", b"\x02" * 32)),
        plan=spec,
        privacy=PrivacyPolicy(collusion_threshold=0),
    )
    again = parse_federation(dump_federation(config, comments=DeltabSettings.comments()))
    assert again == config
    assert DeltabSettings.from_tables(again.plan.settings) == settings
    assert plan_settings(again).bounds is not None


def test_clipping_bounds_built_in_code_match_the_table_form() -> None:
    built = ClippingBounds(40.0, 90.0, (-1.0, -2.0), (1.0, 2.0), ("a", "b"), 0.1)
    assert ClippingBounds.from_table(built.to_table(), 2) == built
