"""A sample federation config (four nodes, a two-round plan) and its TOML edited in one place."""

from __future__ import annotations

from noise.layout import Layout
from proto.federation import (
    FederationConfig,
    NodeEntry,
    PlanSpec,
    RoundSpec,
    dump_federation,
)

KEYS = {name: bytes([i + 1]) * 32 for i, name in enumerate(("alpha", "beta", "gamma", "delta"))}


def make_plan(**overrides: object) -> PlanSpec:
    fields: dict[str, object] = {
        "name": "test-plan",
        "version": "3",
        "rounds": (
            RoundSpec("means", Layout.of({"n": (), "sum_x": (4,)})),
            RoundSpec("sums", Layout.of({"n": (), "sum_xx": (10,), "sum_xy": (4,)})),
        ),
        "settings": {
            "model": {"kind": "unbiased_quadratic", "n_features": 4, "n_components": 2},
            "clipping": {
                "age_low": 45.0,
                "age_high": 85.0,
                "feature_low": -5.0,
                "feature_high": [5.0, 6.0, 7.0, 8.5],
            },
        },
    }
    fields.update(overrides)
    return PlanSpec(**fields)  # type: ignore[arg-type]


def make_config(**overrides: object) -> FederationConfig:
    fields: dict[str, object] = {
        "federation_id": "trial-1",
        "coordinator_address": "coord.example.org:50051",
        "ca_certificate": "ca/ca.pem",
        "nodes": tuple(NodeEntry(n, k) for n, k in KEYS.items()),
        "plan": make_plan(),
    }
    fields.update(overrides)
    return FederationConfig(**fields)  # type: ignore[arg-type]


def edited(old: str, new: str) -> str:
    text = dump_federation(make_config())
    assert old in text, old
    return text.replace(old, new, 1)
