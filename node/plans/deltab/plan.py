"""The brain-age plan: its public rounds from the settings, and one node's side of each round.

*Public side.* Every party derives the same rounds from ``[plan.model]`` and
``[plan.clipping]`` (``DeltabSettings``): with complete data, or
``nan_policy = "drop"``, one round ``sums`` of uncentred pre-scaled sums; with
``nan_policy = "mean"`` a round ``means`` first (the global means that impute
missing values), then ``sums`` over the imputed data
(``node.deltab.sums``). ``zerosum federation init`` writes them into the
config; a node checks that the config's rounds are exactly these.

*One node's side* (:class:`DeltabPlan`). For each round it gives the node's
tensors (sums over its subjects after clipping to the public bounds and
pre-scaling to [-1, 1]), their L2 sensitivities from the public bounds alone
with how each was derived, the clipped counts for the audit record and the SDC
evidence, and takes in each aggregate. After the last round it writes the
global model and predicts this node's own subjects. Centring, standardisation
and the principal components are computed after aggregation, so the noise
scale never depends on data.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray

from node.deltab import plan as deltab_plan
from node.deltab.cells import spreadsheet_safe
from node.deltab.out_of_range import fit_to_training_bounds
from node.deltab.persist import save_model, set_feature_names, set_training_bounds
from node.deltab.plan import PlanSettings
from node.deltab.sums import DERIVATIONS, MEANS, SUMS, plan_shapes, sensitivity
from node.errors import LocalDataError, ModelFitError
from node.plans.deltab.cohort import LocalCohort, load_cohort
from node.plans.deltab.settings import DeltabSettings
from node.plans.deltab.summary_release import DeltaSummaryRelease
from node.plans.deltab.units import MEANINGS, unit_decoder
from node.plans.interface import (
    ClippedColumns,
    PlanDefinition,
    TensorSensitivity,
    package_modules,
)
from node.preflight import ClipShare, CohortPreflight
from node.records.atomic import atomic_write_text
from noise.fixed_point import FixedPointCodec
from noise.layout import Layout
from proto.federation import ConfigError, FederationConfig, PlanSpec, RoundSpec

__all__ = [
    "PLAN",
    "PLAN_NAME",
    "PLAN_VERSION",
    "DeltabPlan",
    "check_rounds",
    "deltab_plan_spec",
    "deltab_rounds",
    "plan_settings",
    "public_sensitivities",
]

PLAN_NAME: Final = "deltab"
PLAN_VERSION: Final = "3"


def deltab_rounds(settings: DeltabSettings) -> tuple[RoundSpec, ...]:
    """The plan's rounds and their public layouts, from the settings alone."""
    shapes = plan_shapes(settings.n_features, 0, settings.nan_policy)
    return tuple(RoundSpec(name, Layout.of(tensors)) for name, tensors in shapes.items())


def deltab_plan_spec(settings: DeltabSettings) -> PlanSpec:
    """The ``[plan]`` of a federation that runs the brain-age fit with ``settings``."""
    return PlanSpec(
        name=PLAN_NAME,
        version=PLAN_VERSION,
        rounds=deltab_rounds(settings),
        settings=settings.to_tables(),
    )


def check_rounds(config: FederationConfig) -> DeltabSettings:
    """The plan's settings, once the config's plan is this one with exactly its rounds."""
    plan = config.plan
    if (plan.name, plan.version) != (PLAN_NAME, PLAN_VERSION):
        raise ConfigError(
            "plan",
            f"{plan.name} {plan.version}",
            f"this node runs plan {PLAN_NAME} version {PLAN_VERSION}",
        )
    settings = DeltabSettings.from_tables(plan.settings)
    expected = deltab_rounds(settings)
    mine = [(r.name, r.layout) for r in expected]
    theirs = [(r.name, r.layout) for r in plan.rounds]
    if theirs != mine:  # the pinned noise scales are the config's, not the plan's
        raise ConfigError(
            "plan.rounds",
            [name for name, _ in theirs],
            f"the federation's rounds {theirs} are not those plan {PLAN_NAME} derives from its "
            f"settings: {mine}",
        )
    return settings


def plan_settings(config: FederationConfig) -> PlanSettings:
    """The brain-age fit every node runs, from the federation's plan tables."""
    settings = DeltabSettings.from_tables(config.plan.settings)
    return PlanSettings(
        model=settings.kind,
        n_components=settings.n_components,
        nan_policy=settings.nan_policy,
        bounds=settings.clipping.bounds(),
    )


def public_sensitivities(config: FederationConfig, round_name: str) -> list[TensorSensitivity]:
    """Each tensor's L2 sensitivity in ``round_name`` (add or remove one subject).

    From the public clipping bounds and the round's public layout alone, so
    any party can compute it before the round, without data (``node.egress.budget``
    adds up a session's cost with it; ``zerosum federation init`` checks the
    budget with it).
    """
    bounds = plan_settings(config).bounds
    assert bounds is not None
    layouts = {r.name: r.layout for r in config.plan.rounds}
    if round_name not in layouts:
        raise KeyError(f"the plan has no round {round_name!r}; its rounds are {list(layouts)}")
    figures = sensitivity(round_name, bounds)
    notes = DERIVATIONS.get(round_name, {})
    out = []
    for name in layouts[round_name].names:
        value = figures[name]
        how = notes.get(name, "the largest L2 norm of one subject's term")
        out.append(
            TensorSensitivity(
                name,
                value,
                f"one subject changes {name} by at most {how} = {value:.6g} after clipping "
                "to the public bounds and pre-scaling to [-1, 1]",
            )
        )
    return out


class DeltabPlan:
    """One node's side of the federated brain-age fit (see the module docstring)."""

    def __init__(self, config: FederationConfig, cohort: LocalCohort) -> None:
        declared = check_rounds(config)
        # [plan.delta_summary], when present and enabled (node.plans.deltab.delta_summary).
        summary = declared.delta_summary
        self.delta_summary = summary if summary is not None and summary.enabled else None
        self.config = config
        self.settings = plan_settings(config)
        self.cohort = cohort
        self.round_names: tuple[str, ...] = config.plan.round_names
        self.state = deltab_plan.NodeMemory(settings=self.settings)
        self._tensors: dict[str, dict[str, NDArray[np.float64]]] = {}
        self._received: set[str] = set()
        # After predict(): a sentence on subjects outside the training bounds, if any.
        self.prediction_note: str | None = None
        self._aggregates: dict[str, dict[str, NDArray[np.float64]]] = {}

    @property
    def complete(self) -> bool:
        return set(self.round_names) <= self._received

    @property
    def n_subjects(self) -> int:
        return self.cohort.n_subjects

    def preflight(self) -> CohortPreflight:
        """The cohort against the bounds and the minimum (``node.preflight``; stays local)."""
        clipping = DeltabSettings.from_tables(self.config.plan.settings).clipping
        features = self.cohort.features
        used: NDArray[np.bool_] = np.ones(features.shape[0], dtype=bool)
        if self.settings.nan_policy == "drop":
            used = np.asarray(~np.isnan(features).any(axis=1))
        n_used = int(used.sum())

        def share(name: str, values: NDArray[np.float64], low: float, high: float) -> ClipShare:
            kept = values[used]
            with np.errstate(invalid="ignore"):
                below, above = int(np.sum(kept < low)), int(np.sum(kept > high))
            return ClipShare(name, low, high, below, above, n_used)

        columns = [share("age", self.cohort.age, clipping.age_low, clipping.age_high)]
        for j, name in enumerate(self.cohort.feature_names):
            low, high = clipping.feature_low[j], clipping.feature_high[j]
            columns.append(share(name, features[:, j], low, high))
        return CohortPreflight(
            source=str(self.cohort.path),
            n_read=self.cohort.n_subjects,
            n_used=n_used,
            nan_policy=self.settings.nan_policy,
            min_cohort_size=self.config.min_cohort_size,
            columns=tuple(columns),
            max_clipped_fraction=clipping.max_clipped_fraction,
        )

    def tensors(self, round_name: str) -> dict[str, NDArray[np.float64]]:
        """This node's contribution to ``round_name`` (computed once, then reused)."""
        used = self.n_used()
        if used < self.config.min_cohort_size:
            # The pre-flight refuses this before joining; never release a smaller cohort.
            raise LocalDataError(
                f"{self.cohort.path}: only {used} of {self.cohort.n_subjects} subjects are used "
                f"under plan.model.nan_policy = {self.settings.nan_policy!r}; the federation "
                f"requires at least {self.config.min_cohort_size} per node (min_cohort_size)"
            )
        if round_name not in self._tensors:
            computed = deltab_plan.round_tensors(
                round_name, self.cohort.features, self.cohort.age, self.state
            )
            self._tensors[round_name] = {
                name: np.asarray(value, dtype=np.float64) for name, value in computed.items()
            }
        return self._tensors[round_name]

    def sensitivities(self, round_name: str) -> list[TensorSensitivity]:
        """Each tensor's L2 sensitivity (add or remove one subject), in tensor order.

        The round's public layout fixes the tensor order (the config's rounds
        are checked to be exactly this plan's), so no data are needed.
        """
        return public_sensitivities(self.config, round_name)

    def receive(self, round_name: str, aggregate: dict[str, NDArray[np.float64]]) -> None:
        noisy = self.config.privacy.residual_dp
        try:
            deltab_plan.receive(round_name, aggregate, self.state, noisy=noisy)
        except ValueError as error:
            # The aggregate passed every check, so this is the data (or, with
            # residual DP, the noise on them) not supporting the configured model.
            raise ModelFitError(
                f"the aggregate of round {round_name!r} cannot fit the configured model: "
                f"{error}" + (" (the aggregate carries residual DP noise)" if noisy else "")
            ) from error
        self._received.add(round_name)
        self._aggregates[round_name] = {
            k: np.asarray(v, dtype=np.float64) for k, v in aggregate.items()
        }

    # -- local facts for the audit record and the SDC evidence ---------

    def clipped(self, round_name: str) -> dict[str, int]:
        """Values clipped to the public bounds in this round (stays in the TRE)."""
        counts = self.state.clipped.get(round_name)
        if counts is None:
            return {}
        out = {"total": counts.total, "age": int(counts.age)}
        for name, n in zip(self.cohort.feature_names, counts.features, strict=True):
            if n:
                out[f"feature:{name}"] = int(n)
        return out

    def post_model_release(self) -> DeltaSummaryRelease | None:
        """The delta summary, when ``[plan.delta_summary]`` enables it (``summary_release``)."""
        if self.delta_summary is None:
            return None
        return DeltaSummaryRelease(self.delta_summary, self.summary_deltas)

    def n_used(self) -> int:
        """Subjects contributing: those without a missing value under nan_policy "drop"."""
        if self.settings.nan_policy == "drop":
            return int(np.sum(~np.isnan(self.cohort.features).any(axis=1)))
        return self.cohort.n_subjects

    def residual_dof(self, round_name: str) -> int | None:
        """N − P − 1 for the sums round (regression of age on P features and an intercept)."""
        if round_name != SUMS:
            return None
        return self.n_used() - len(self.cohort.feature_names) - 1

    def sdc_notes(self, round_name: str) -> tuple[str, ...]:
        notes = [
            "Every released value is a sum over at least N subjects with calibrated Gaussian "
            "noise; no subject-level value is released."
        ]
        if round_name == SUMS:
            notes.append(
                "Residual degrees of freedom: N − P − 1 for a regression of age on the P "
                "features with an intercept."
            )
            if MEANS in self.round_names:
                notes.append(
                    "Missing feature values count as 0 in these sums; the global means of round "
                    "'means' fill them in after aggregation, so no value here depends on another "
                    "node's data."
                )
        return tuple(notes)

    # -- the result -----------------------------------------------------

    def save_model(self, path: Path) -> None:
        if self.state.model is None:
            raise RuntimeError("the model is not fitted: the sums round has not been received")
        # Every node's columns are the same features in the same order; keep this
        # node's names so that predicting from its tables matches columns by name,
        # and the public bounds, outside which the model has seen no value.
        model = set_feature_names(self.state.model, self.cohort.feature_names)
        bounds = self.settings.bounds
        assert bounds is not None
        save_model(set_training_bounds(model, bounds.feature_lo, bounds.feature_hi), path)

    def write_outputs(self, out: Path) -> tuple[Path, Path]:
        """``OUT/model.json`` and ``OUT/predictions.csv`` (id, age, brain_age, delta)."""
        model_path = out / "model.json"
        self.save_model(model_path)
        brain_age, delta = self.predict()
        predictions = out / "predictions.csv"
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["id", "age", "brain_age", "delta"])
        rows = zip(self.cohort.ids, self.cohort.age, brain_age, delta, strict=True)
        for subject, age, predicted, gap in rows:
            # Ids come from the cohort file: never write one back as a live formula.
            writer.writerow([spreadsheet_safe(subject), _cell(age), _cell(predicted), _cell(gap)])
        atomic_write_text(predictions, buffer.getvalue())
        return model_path, predictions

    def predict(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(brain age, delta) in years for this node's own subjects.

        Features are clipped to the public bounds first, as they were for the
        fit (``node.deltab.out_of_range``); ``prediction_note`` says how many
        subjects and features that touched.
        """
        model = self.state.model
        if model is None:
            raise RuntimeError("the model is not fitted: the sums round has not been received")
        bounds = self.settings.bounds
        assert bounds is not None
        features, outside = fit_to_training_bounds(
            self.cohort.features,
            (bounds.feature_lo, bounds.feature_hi),
            self.cohort.feature_names,
        )
        self.prediction_note = (
            outside.sentence(
                str(self.cohort.path),
                "predictions.csv predicts them from values clipped to the bounds, as the fit "
                "did (without the clipping the model extrapolates).",
            )
            if outside.any
            else None
        )
        delta = np.asarray(model.predict_delta(features, self.cohort.age))
        return self.cohort.age + delta, delta

    def summary_deltas(self) -> NDArray[np.float64]:
        """This node's deltas (years) under the model fitted *without* its own subjects.

        The delta summary (docs/design.md §8) scores this node's subjects with
        the model of the others: each round's aggregate less this node's own
        fixed-point contribution q(x_k). Both are integers times 2^-F decoded
        exactly in float64 (well inside 2^53), so the difference is exactly
        Σ_{j≠k} q(x_j) (plus the residual noise, if any), which does not depend
        on this node's subjects: one of them added or removed changes its own
        delta only. Under nan_policy "mean" the others' zero-filled sums are
        completed with the others' own means (from their ``means`` round),
        so that holds there too.
        """
        codec = FixedPointCodec(self.config.fixed_point_bits)
        layouts = {r.name: r.layout for r in self.config.plan.rounds}
        state = deltab_plan.NodeMemory(settings=self.settings)
        for name in self.round_names:
            aggregate = self._aggregates.get(name)
            if aggregate is None:
                raise RuntimeError(f"the model is not fitted: round {name!r} has not been received")
            own = layouts[name].decode(layouts[name].encode(self.tensors(name), codec), codec)
            others = {key: aggregate[key] - own[key] for key in aggregate}
            try:
                deltab_plan.receive(name, others, state, noisy=self.config.privacy.residual_dp)
            except ValueError as error:
                raise ModelFitError(
                    "the other nodes' sums cannot fit the configured model for the delta "
                    f"summary: {error}"
                ) from error
        assert state.model is not None
        return np.asarray(
            state.model.predict_delta(self.cohort.features, self.cohort.age), dtype=np.float64
        )


def _cell(value: float) -> str:
    return "" if not np.isfinite(value) else repr(float(value))


def _check_spec(config: FederationConfig) -> None:
    check_rounds(config)


def _open(config: FederationConfig, data: Path) -> DeltabPlan:
    return DeltabPlan(config, load_cohort(data, config))


def clipped_columns(config: FederationConfig) -> ClippedColumns:
    """Age and each feature, as :meth:`DeltabPlan.clipped` counts them, and the threshold."""
    clipping = DeltabSettings.from_tables(config.plan.settings).clipping
    return ClippedColumns(
        names=("age", *clipping.feature_names),
        keys=("age", *(f"feature:{name}" for name in clipping.feature_names)),
        max_fraction=clipping.max_clipped_fraction,
        in_words="age and every feature",
    )


def _modules() -> tuple[str, ...]:
    """The code the digest covers: every module of this folder, and the brain-age library.

    The plan's folder (``node.plans.deltab``) holds all the plan's own code:
    its rounds, cohort reading, settings, the delta summary and its bundle,
    and the reviewer's reading. The tensors it releases are computed by the
    library ``node.deltab`` (``sums``, ``plan``, ``scaling``: clipping,
    pre-scaling, the sums and the model fitted from the aggregates), which
    stays its own package because ``zerosum deltab`` uses it alone; a change
    there changes what leaves the TRE as surely as one here, so its modules are
    in the digest too. Both are walked file by file, so a module added to
    either is covered without being listed.
    """
    return (*package_modules("node.plans.deltab"), *package_modules("node.deltab"))


PLAN: Final = PlanDefinition(
    name=PLAN_NAME,
    version=PLAN_VERSION,
    modules=_modules(),
    summary="brain-age delta (Smith et al. 2019) from one release of uncentred sums",
    open=_open,
    public_sensitivities=public_sensitivities,
    check_spec=_check_spec,
    unit_decoder=unit_decoder,
    clipped_columns=clipped_columns,
    tensor_meanings=MEANINGS,
)
