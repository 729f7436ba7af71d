"""The federated brain-age fit as a plan of rounds, for the session to drive.

Exact plan, ``ROUNDS = ("moments", "scatter")``:

1. every node sends ``round_tensors("moments", X, age, state)``; the
   coordinator sums them; every node calls ``receive("moments", aggregate,
   state)``, which derives the global standardisation;
2. every node sends ``round_tensors("scatter", X, age, state)``; after the sum,
   ``finish(aggregates, settings)`` (or ``receive("scatter", ...)`` at a node)
   solves for the model, which equals the pooled fit on the concatenated data.

Comparison plan, ``SEED_LITERAL_ROUNDS`` — the seed documents' FedAvg of
locally fitted coefficients in the shared basis (see ``fedavg``): after the
scatter round every node sends ``round_tensors("coefficients", ...)`` and
``finish_seed_literal`` averages them.

Everything a node needs between rounds lives in its :class:`NodeState`; the
clip counts of each round stay there (they never enter the tensors).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numpy.typing import ArrayLike

from node.deltab._checks import check_nan_policy
from node.deltab._params import Reduction, check_model
from node.deltab.fedavg import COEFFICIENTS, local_coefficients, model_from_coefficients
from node.deltab.model import BrainAgeModel
from node.deltab.scaling import Bounds, ClipCounts, Standardisation
from node.deltab.stats import (
    FEDERATED_NAN_POLICIES,
    MOMENTS,
    SCATTER,
    Tensors,
    combine,
    count_clipped,
    local_moments,
    local_scatter,
    model_from_scatter,
    standardisation_from_moments,
)

__all__ = [
    "ROUNDS",
    "SEED_LITERAL_ROUNDS",
    "NodeState",
    "PlanSettings",
    "finish",
    "finish_seed_literal",
    "receive",
    "round_tensors",
    "run_in_process",
]

ROUNDS = (MOMENTS, SCATTER)
SEED_LITERAL_ROUNDS = (MOMENTS, SCATTER, COEFFICIENTS)


@dataclass(frozen=True)
class PlanSettings:
    """What every node and the coordinator agree on before the first round."""

    model: str = "unbiased"
    n_components: int | None = None
    feature_proportion: float | None = None
    variance_explained: float | None = None
    kaiser_guttman: bool = False
    nan_policy: str = "mean"
    bounds: Bounds | None = None

    def __post_init__(self) -> None:
        check_model(self.model)
        check_nan_policy(self.nan_policy, FEDERATED_NAN_POLICIES)
        Reduction.from_params(
            self.n_components, self.feature_proportion, self.variance_explained, self.kaiser_guttman
        )

    def model_params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "n_components": self.n_components,
            "feature_proportion": self.feature_proportion,
            "variance_explained": self.variance_explained,
            "kaiser_guttman": self.kaiser_guttman,
            "nan_policy": self.nan_policy,
        }


@dataclass
class NodeState:
    """One node's memory between rounds (confounds are the node's own data)."""

    settings: PlanSettings = field(default_factory=PlanSettings)
    confounds: ArrayLike | None = None
    standardisation: Standardisation | None = None
    model: BrainAgeModel | None = None
    clipped: dict[str, ClipCounts] = field(default_factory=dict)


def round_tensors(round_name: str, X: ArrayLike, age: ArrayLike, state: NodeState) -> Tensors:
    """This node's contribution to ``round_name`` (see ``stats.expected_shapes``)."""
    settings = state.settings
    bounds = settings.bounds
    if bounds is not None:
        state.clipped[round_name] = count_clipped(
            X, age, bounds, confounds=state.confounds, nan_policy=settings.nan_policy
        )
    if round_name == MOMENTS:
        return local_moments(
            X, age, confounds=state.confounds, bounds=bounds, nan_policy=settings.nan_policy
        )
    if round_name == SCATTER:
        if state.standardisation is None:
            raise ValueError(
                "the scatter round needs the global standardisation; call receive('moments', "
                "aggregate, state) first."
            )
        return local_scatter(
            X, age, state.standardisation, confounds=state.confounds, nan_policy=settings.nan_policy
        )
    if round_name == COEFFICIENTS:
        if state.model is None:
            raise ValueError(
                "the coefficients round needs the shared basis; call receive('scatter', "
                "aggregate, state) first."
            )
        return local_coefficients(X, age, state.model, confounds=state.confounds, bounds=bounds)
    raise ValueError(f"round_name must be one of {SEED_LITERAL_ROUNDS}; got {round_name!r}.")


def receive(round_name: str, aggregate: Mapping[str, ArrayLike], state: NodeState) -> None:
    """Take in a round's aggregate: the standardisation after moments, the model after scatter."""
    settings = state.settings
    if round_name == MOMENTS:
        state.standardisation = standardisation_from_moments(aggregate, settings.bounds)
    elif round_name == SCATTER:
        if state.standardisation is None:
            raise ValueError("receive('moments', ...) must come before receive('scatter', ...).")
        state.model = model_from_scatter(
            aggregate, state.standardisation, **settings.model_params()
        )
    elif round_name != COEFFICIENTS:
        raise ValueError(f"round_name must be one of {SEED_LITERAL_ROUNDS}; got {round_name!r}.")


def finish(
    aggregates: Mapping[str, Mapping[str, ArrayLike]], settings: PlanSettings | None = None
) -> BrainAgeModel:
    """The exact federated model from the aggregated moments and scatter tensors."""
    settings = PlanSettings() if settings is None else settings
    standardisation = standardisation_from_moments(aggregates[MOMENTS], settings.bounds)
    return model_from_scatter(aggregates[SCATTER], standardisation, **settings.model_params())


def finish_seed_literal(
    aggregates: Mapping[str, Mapping[str, ArrayLike]], settings: PlanSettings | None = None
) -> BrainAgeModel:
    """The comparison model: exact basis, N-weighted average of per-site coefficients."""
    basis = finish(aggregates, settings)
    return model_from_coefficients(aggregates[COEFFICIENTS], basis)


def run_in_process(
    cohorts: Sequence[tuple[ArrayLike, ArrayLike] | tuple[ArrayLike, ArrayLike, ArrayLike | None]],
    settings: PlanSettings | None = None,
    *,
    seed_literal: bool = False,
) -> BrainAgeModel:
    """Run the whole plan over ``(X, age[, confounds])`` cohorts in one process, without noise.

    For tests and simulations: the aggregate is the plain sum that secure
    aggregation would deliver.
    """
    settings = PlanSettings() if settings is None else settings
    states = [
        NodeState(settings=settings, confounds=cohort[2] if len(cohort) > 2 else None)
        for cohort in cohorts
    ]
    rounds = SEED_LITERAL_ROUNDS if seed_literal else ROUNDS
    aggregates: dict[str, Tensors] = {}
    for round_name in rounds:
        contributions = [
            round_tensors(round_name, cohort[0], cohort[1], state)
            for cohort, state in zip(cohorts, states, strict=True)
        ]
        aggregates[round_name] = combine(contributions)
        if round_name == MOMENTS:
            for state in states:
                receive(MOMENTS, aggregates[MOMENTS], state)
        elif round_name == SCATTER and seed_literal:
            shared = finish(aggregates, settings)
            for state in states:
                state.model = shared
    if seed_literal:
        return finish_seed_literal(aggregates, settings)
    return finish(aggregates, settings)
