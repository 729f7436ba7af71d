"""The released values in real units beside the scaled values sent, as the plan reads them.

A plan may send its values pre-scaled (the brain-age plan clips every value
to the public bounds and maps each range onto [-1, 1] before summing). The
installed plan the federation config names gives the reviewer a
:class:`~node.plans.interface.UnitDecoder` for a round's tensors: a sentence
on what each tensor is and, where it knows how, its entries in real units,
computed from the noised release (post-processing, no privacy cost). Without
the config, or for a plan that gives none, the values are shown scaled only,
each with the sentence of its plan (``PlanDefinition.tensor_meanings``; when
the plan is not known here, of the first installed plan that names the tensor).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from node.egress.bundle import EgressBundle
from node.plans.interface import UnitDecoder
from node.plans.registry import installed_plan, installed_plans
from proto.federation import ConfigError, FederationConfig

__all__ = ["TensorView", "ValueRow", "real_units"]

_UNKNOWN = "a tensor of the plan, noised"


@dataclass(frozen=True)
class ValueRow:
    """One released entry: where it sits, the scaled value sent, and its real-unit value."""

    label: str
    scaled: float
    real: float | None
    unit: str


@dataclass(frozen=True)
class TensorView:
    """A tensor's entries in both forms, with a sentence on what it is."""

    name: str
    meaning: str
    rows: tuple[ValueRow, ...]


def _labels(name: str, size: int) -> list[str]:
    return [name] if size == 1 else [f"{name}[{i}]" for i in range(size)]


def _meanings(config: FederationConfig | None) -> Mapping[str, str]:
    """What each tensor is, by name, in its plan's words.

    The words of the config's plan when it is installed here; otherwise (the
    plan unknown) those of the first installed plan that names the tensor.
    """
    try:
        plans = installed_plans()
    except ConfigError:
        return {}
    if config is not None and config.plan.name in plans:
        return plans[config.plan.name].tensor_meanings
    merged: dict[str, str] = {}
    for definition in plans.values():
        for name, meaning in definition.tensor_meanings.items():
            merged.setdefault(name, meaning)
    return merged


def real_units(bundle: EgressBundle, config: FederationConfig | None) -> tuple[TensorView, ...]:
    """Every tensor of ``bundle`` with its scaled and, where the plan says how, real values."""
    decoded = bundle.decoded()
    decoder: UnitDecoder | None = None
    definition = installed_plan(config) if config is not None else None
    if config is not None and definition is not None and definition.unit_decoder is not None:
        decoder = definition.unit_decoder(config, decoded)
    meanings = _meanings(config)
    views = []
    for entry in bundle.tensors:
        scaled = np.asarray(decoded[entry.name], dtype=np.float64).reshape(-1)
        real, labels, unit = (None, [], "") if decoder is None else decoder.real(entry.name)
        if real is None or len(labels) != scaled.size:
            real, labels = None, _labels(entry.name, scaled.size)
        rows = tuple(
            ValueRow(
                label=label,
                scaled=float(value),
                real=None if real is None else float(real[i]),
                unit=unit if real is not None else "",
            )
            for i, (label, value) in enumerate(zip(labels, scaled.tolist(), strict=True))
        )
        if decoder is not None:
            meaning = decoder.meaning(entry.name)
        else:
            meaning = meanings.get(entry.name, _UNKNOWN)
        views.append(TensorView(entry.name, meaning, rows))
    return tuple(views)
