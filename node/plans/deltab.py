"""The brain-age plan's public side: its name, version and rounds from its settings alone.

Every party derives the same rounds from ``[plan.model]`` and
``[plan.clipping]`` (``DeltabSettings``): their names and the names and shapes
of their tensors (``node.deltab.stats.expected_shapes``), in payload order.
``zerosum federation init`` writes them into the config; a node checks that
the config's rounds are exactly these before it contacts anyone.
"""

from __future__ import annotations

from typing import Final

from node.deltab import plan as deltab_plan
from node.deltab.plan import PlanSettings
from node.deltab.stats import expected_shapes
from node.plans.deltab_settings import DeltabSettings
from noise.layout import Layout
from proto.federation import FederationConfig, PlanSpec, RoundSpec

__all__ = ["PLAN_NAME", "PLAN_VERSION", "deltab_plan_spec", "deltab_rounds", "plan_settings"]

PLAN_NAME: Final = "deltab"
PLAN_VERSION: Final = "1"


def deltab_rounds(settings: DeltabSettings) -> tuple[RoundSpec, ...]:
    """The plan's rounds and their public layouts, from the settings alone."""
    return tuple(
        RoundSpec(name, Layout.of(expected_shapes(name, settings.n_features)))
        for name in deltab_plan.ROUNDS
    )


def deltab_plan_spec(settings: DeltabSettings) -> PlanSpec:
    """The ``[plan]`` of a federation that runs the brain-age fit with ``settings``."""
    return PlanSpec(
        name=PLAN_NAME,
        version=PLAN_VERSION,
        rounds=deltab_rounds(settings),
        settings=settings.to_tables(),
    )


def plan_settings(config: FederationConfig) -> PlanSettings:
    """The brain-age fit every node runs, from the federation's plan tables."""
    settings = DeltabSettings.from_tables(config.plan.settings)
    return PlanSettings(
        model=settings.kind,
        n_components=settings.n_components,
        nan_policy="mean",
        bounds=settings.clipping.bounds(),
    )
