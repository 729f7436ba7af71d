"""The federated brain-age fit as a plan of rounds, for the session to drive.

One-release plan (the default), ``rounds_for(settings.nan_policy)``:

* ``nan_policy="drop"`` (and complete data): one round, ``("sums",)``. Every
  node sends ``round_tensors("sums", X, age, state)`` — uncentred sums of its
  clipped, pre-scaled values (``uncentred.local_sums``); the coordinator sums
  them; ``finish(aggregates, settings)`` (or ``receive("sums", ...)`` at a
  node) centres the total exactly and solves for the model, which equals the
  pooled fit on the concatenated data. Noise scales follow from the public
  bounds alone (``sums.sensitivity``).
* ``nan_policy="mean"``: ``("means", "sums")``. The ``means`` round gives
  the counts and sums of the observed values and the missingness cross-sums,
  the ``sums`` round the sums of the zero-filled data; neither depends on the
  other. ``receive("sums", ...)`` fills the gaps in the aggregated sums with
  the global means (``uncentred.complete_sums``), so no node's release depends
  on another node's data.

Centred two-round plan, ``ROUNDS = ("moments", "scatter")``: the global
means first, then sums of values centred by them (``stats``). Its centring and
its scatter-round sensitivity depend on the released means; it is kept while
the session still runs it.

Comparison plan — the seed documents' FedAvg of locally fitted coefficients in
the shared basis (see ``fedavg``): after the model round every node sends
``round_tensors("coefficients", ...)`` and ``finish_seed_literal`` averages
them (``run_in_process(..., seed_literal=True)``).

Everything a node needs between rounds lives in its :class:`NodeMemory`; the
clip counts of each round stay there (they never enter the tensors).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numpy.typing import ArrayLike

from node.deltab._checks import FloatArray, check_nan_policy
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
from node.deltab.sums import MEANS, SUMS, rounds_for
from node.deltab.uncentred import (
    complete_sums,
    imputation_values,
    local_means,
    local_sums,
    model_from_sums,
)

__all__ = [
    "KNOWN_ROUNDS",
    "ROUNDS",
    "SEED_LITERAL_ROUNDS",
    "NodeMemory",
    "PlanSettings",
    "finish",
    "finish_seed_literal",
    "receive",
    "round_tensors",
    "rounds_for",
    "run_in_process",
]

# The centred two-round plan and its seed-literal extension.
ROUNDS = (MOMENTS, SCATTER)
SEED_LITERAL_ROUNDS = (MOMENTS, SCATTER, COEFFICIENTS)
KNOWN_ROUNDS = (MEANS, SUMS, MOMENTS, SCATTER, COEFFICIENTS)


@dataclass(frozen=True)
class PlanSettings:
    """What every node and the coordinator agree on before the first round."""

    model: str = "unbiased"
    n_components: int | None = None
    feature_proportion: float | None = None
    variance_explained: float | None = None
    kaiser_guttman: bool = False
    nan_policy: str = "drop"
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

    @property
    def rounds(self) -> tuple[str, ...]:
        """The one-release plan's rounds for this ``nan_policy``."""
        return rounds_for(self.nan_policy)


@dataclass
class NodeMemory:
    """One node's memory between rounds (confounds are the node's own data).

    ``fill`` is the pre-scaled imputation of missing feature values and
    ``means`` the aggregate it came from (after the ``means`` round; the sums
    round's aggregate is completed with both); ``standardisation`` the global
    means of the centred plan (after ``moments``); ``model`` the fitted model
    (after ``sums`` or ``scatter``).
    """

    settings: PlanSettings = field(default_factory=PlanSettings)
    confounds: ArrayLike | None = None
    standardisation: Standardisation | None = None
    model: BrainAgeModel | None = None
    clipped: dict[str, ClipCounts] = field(default_factory=dict)
    fill: FloatArray | None = None
    means: dict[str, ArrayLike] | None = None


def _unknown(round_name: str) -> ValueError:
    return ValueError(f"round_name must be one of {KNOWN_ROUNDS}; got {round_name!r}.")


def round_tensors(round_name: str, X: ArrayLike, age: ArrayLike, state: NodeMemory) -> Tensors:
    """This node's contribution to ``round_name`` (see ``stats.expected_shapes``)."""
    settings = state.settings
    bounds = settings.bounds
    policy = settings.nan_policy
    if round_name not in KNOWN_ROUNDS:
        raise _unknown(round_name)
    if bounds is not None:
        state.clipped[round_name] = count_clipped(
            X, age, bounds, confounds=state.confounds, nan_policy=policy
        )
    if round_name == SUMS:
        # Under "mean" the zero-filled sums: the imputation follows aggregation.
        return local_sums(X, age, confounds=state.confounds, bounds=bounds, nan_policy=policy)
    if round_name == MEANS:
        if policy != "mean":
            raise ValueError(
                f"the means round belongs to nan_policy='mean'; this plan has {policy!r}, whose "
                f"rounds are {rounds_for(policy)}."
            )
        return local_means(X, age, confounds=state.confounds, bounds=bounds)
    if round_name == MOMENTS:
        return local_moments(X, age, confounds=state.confounds, bounds=bounds, nan_policy=policy)
    if round_name == SCATTER:
        if state.standardisation is None:
            raise ValueError(
                "the scatter round needs the global standardisation; call receive('moments', "
                "aggregate, state) first."
            )
        return local_scatter(
            X, age, state.standardisation, confounds=state.confounds, nan_policy=policy
        )
    if state.model is None:
        raise ValueError(
            "the coefficients round needs the shared basis; call receive('sums', aggregate, "
            "state) first."
        )
    return local_coefficients(X, age, state.model, confounds=state.confounds, bounds=bounds)


def receive(
    round_name: str,
    aggregate: Mapping[str, ArrayLike],
    state: NodeMemory,
    *,
    noisy: bool = False,
) -> None:
    """Take in a round's aggregate: the imputation after means, the model after sums.

    (For the centred plan: the standardisation after moments, the model after
    scatter.) ``noisy``: the aggregate carries residual DP noise (see
    :func:`~node.deltab.uncentred.model_from_sums`).
    """
    settings = state.settings
    if round_name == MEANS:
        state.fill = imputation_values(aggregate, settings.bounds)
        state.means = dict(aggregate)
    elif round_name == SUMS:
        if settings.nan_policy == "mean":
            if state.fill is None or state.means is None:
                raise ValueError(
                    "the sums round under nan_policy='mean' is completed with the global "
                    "means; call receive('means', aggregate, state) first."
                )
            aggregate = complete_sums(aggregate, state.means, state.fill)
        state.model = model_from_sums(
            aggregate, settings.bounds, fill=state.fill, noisy=noisy, **settings.model_params()
        )
    elif round_name == MOMENTS:
        state.standardisation = standardisation_from_moments(aggregate, settings.bounds)
    elif round_name == SCATTER:
        if state.standardisation is None:
            raise ValueError("receive('moments', ...) must come before receive('scatter', ...).")
        state.model = model_from_scatter(
            aggregate, state.standardisation, **settings.model_params()
        )
    elif round_name != COEFFICIENTS:
        raise _unknown(round_name)


def finish(
    aggregates: Mapping[str, Mapping[str, ArrayLike]], settings: PlanSettings | None = None
) -> BrainAgeModel:
    """The exact federated model from the aggregates, by round name.

    With a ``sums`` aggregate (and, under ``nan_policy="mean"``, the ``means``
    aggregate whose imputation the nodes used) the one-release plan's model;
    otherwise the centred plan's, from ``moments`` and ``scatter``.
    """
    settings = PlanSettings() if settings is None else settings
    if SUMS in aggregates:
        fill = None
        sums = aggregates[SUMS]
        if MEANS in aggregates:
            fill = imputation_values(aggregates[MEANS], settings.bounds)
            sums = complete_sums(sums, aggregates[MEANS], fill)
        return model_from_sums(sums, settings.bounds, fill=fill, **settings.model_params())
    if MOMENTS in aggregates and SCATTER in aggregates:
        standardisation = standardisation_from_moments(aggregates[MOMENTS], settings.bounds)
        return model_from_scatter(aggregates[SCATTER], standardisation, **settings.model_params())
    raise ValueError(
        f"finish needs the aggregate of round {SUMS!r} (or of {MOMENTS!r} and {SCATTER!r}); "
        f"got rounds {sorted(aggregates)}."
    )


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
    rounds: Sequence[str] | None = None,
) -> BrainAgeModel:
    """Run the whole plan over ``(X, age[, confounds])`` cohorts in one process, without noise.

    For tests and simulations: the aggregate is the plain sum that secure
    aggregation would deliver. The rounds are the one-release plan's for the
    settings' ``nan_policy`` unless ``rounds`` names others (``ROUNDS`` for
    the centred plan); ``seed_literal`` appends the coefficients round.
    """
    settings = PlanSettings() if settings is None else settings
    states = [
        NodeMemory(settings=settings, confounds=cohort[2] if len(cohort) > 2 else None)
        for cohort in cohorts
    ]
    plan = tuple(settings.rounds if rounds is None else rounds)
    if seed_literal:
        plan += (COEFFICIENTS,)
    aggregates: dict[str, Tensors] = {}
    for round_name in plan:
        contributions = [
            round_tensors(round_name, cohort[0], cohort[1], state)
            for cohort, state in zip(cohorts, states, strict=True)
        ]
        aggregates[round_name] = combine(contributions)
        if round_name in (MEANS, MOMENTS):
            for state in states:
                receive(round_name, aggregates[round_name], state)
        elif round_name in (SUMS, SCATTER) and seed_literal:
            shared = finish(aggregates, settings)
            for state in states:
                state.model = shared
    if seed_literal:
        return finish_seed_literal(aggregates, settings)
    return finish(aggregates, settings)
