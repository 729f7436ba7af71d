"""Federated logistic regression: T rounds of gradient descent over zero-sum masked sums.

*Public side.* ``[plan.model]`` (``kind = "logistic"``, ``n_features`` P,
``rounds`` T, ``learning_rate`` η, ``clip_norm`` C, ``l2`` λ) and
``[plan.clipping]`` (``feature_low``/``feature_high``: one number or one per
feature) fix the rounds: ``count`` (the number of subjects, sensitivity 1),
then ``step-1`` … ``step-T``, each one tensor ``grad`` of P + 1 entries.

*One node's side.* Each feature is clipped to its public bounds and pre-scaled
to [-1, 1]; with θ = (w, b) the model's weights and intercept, subject i's
gradient of the log loss is gᵢ = (σ(θ·x̃ᵢ) − yᵢ) x̃ᵢ, x̃ᵢ = (xᵢ, 1). Before summing,
each gᵢ is scaled down to L2 norm at most C (Abadi et al. 2016, CCS, the
per-example clipping of DP-SGD), so adding or removing one subject changes
the round's sum by at most C: the sensitivity, from public settings alone.
Every round the node masks its sum with fresh zero-sum noise (the round index
keys new streams), the aggregate is exact, and every node takes the same
step θ ← θ − η (G/N + λθ) with G the aggregated sum and N the aggregated
count, so all nodes hold the same θ bit for bit — the θ of non-private FedAvg
of the clipped gradients (McMahan et al. 2017, one local step per round).

The T + 1 releases compose in the node's ledger as μ = √(Σ μ_t²) (Dong, Roth
& Su 2022); ``federation init`` keeps only as many steps as the ε budget
admits (early stop) and each release is checked against it again.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from node.errors import LocalDataError
from node.plans.interface import PlanDefinition, TensorSensitivity
from node.preflight import ClipShare, CohortPreflight
from node.records.atomic import atomic_write_json, atomic_write_text
from noise.layout import Layout
from proto.federation import ConfigError, FederationConfig, PlanSpec, RoundSpec
from proto.federation.checks import MISSING, finite, positive, whole

__all__ = ["PLAN", "LogregPlan", "LogregSettings", "logreg_plan_spec", "read_labelled"]

PLAN_NAME: Final = "logreg"
PLAN_VERSION: Final = "1"
COUNT: Final = "count"
_MODEL_KEYS: Final = ("kind", "n_features", "rounds", "learning_rate", "clip_norm", "l2")
FloatArray = NDArray[np.float64]


def step_name(t: int) -> str:
    return f"step-{t}"


@dataclass(frozen=True)
class LogregSettings:
    """The plan's validated settings (see the module docstring)."""

    n_features: int
    rounds: int
    learning_rate: float
    clip_norm: float
    l2: float
    feature_low: tuple[float, ...]
    feature_high: tuple[float, ...]

    @classmethod
    def from_tables(cls, tables: Mapping[str, Mapping[str, Any]]) -> LogregSettings:
        for key in tables:
            if key not in ("model", "clipping"):
                raise ConfigError(
                    f"plan.{key}", tables[key], "unknown table; logreg reads [plan.model] and "
                    "[plan.clipping]"
                )  # fmt: skip
        model = tables.get("model")
        clipping = tables.get("clipping")
        if model is None or clipping is None:
            missing = "plan.model" if model is None else "plan.clipping"
            raise ConfigError(missing, MISSING, "the logreg plan needs this table")
        for key, value in model.items():
            if key not in _MODEL_KEYS:
                raise ConfigError(f"plan.model.{key}", value, "unknown setting")
        if model.get("kind", "logistic") != "logistic":
            raise ConfigError("plan.model.kind", model.get("kind"), 'must be "logistic"')
        p = whole("plan.model.n_features", model.get("n_features", MISSING), 1, 10_000)
        rounds = whole("plan.model.rounds", model.get("rounds", MISSING), 1, 1000)
        rate = positive("plan.model.learning_rate", model.get("learning_rate", 1.0))
        clip = positive("plan.model.clip_norm", model.get("clip_norm", 1.0))
        l2 = finite("plan.model.l2", model.get("l2", 0.0))
        if l2 < 0:
            raise ConfigError("plan.model.l2", l2, "must be >= 0")
        lows = _bounds("plan.clipping.feature_low", clipping.get("feature_low", MISSING), p)
        highs = _bounds("plan.clipping.feature_high", clipping.get("feature_high", MISSING), p)
        for j, (lo, hi) in enumerate(zip(lows, highs, strict=True)):
            if not hi > lo:
                raise ConfigError(f"plan.clipping.feature_high[{j}]", hi, f"must exceed {lo!r}")
        return cls(p, rounds, rate, clip, l2, lows, highs)

    def to_tables(self) -> dict[str, dict[str, Any]]:
        def compact(values: tuple[float, ...]) -> float | list[float]:
            return values[0] if len(set(values)) == 1 else list(values)

        return {
            "model": {
                "kind": "logistic",
                "n_features": self.n_features,
                "rounds": self.rounds,
                "learning_rate": self.learning_rate,
                "clip_norm": self.clip_norm,
                "l2": self.l2,
            },
            "clipping": {
                "feature_low": compact(self.feature_low),
                "feature_high": compact(self.feature_high),
            },
        }

    def round_specs(self) -> tuple[RoundSpec, ...]:
        steps = tuple(
            RoundSpec(step_name(t), Layout.of({"grad": (self.n_features + 1,)}))
            for t in range(1, self.rounds + 1)
        )
        return (RoundSpec(COUNT, Layout.of({"n": ()})), *steps)

    def prescale(self, features: FloatArray) -> FloatArray:
        """Features clipped to the public bounds and mapped to [-1, 1], with a 1 appended."""
        low, high = np.asarray(self.feature_low), np.asarray(self.feature_high)
        clipped = np.clip(features, low, high)
        scaled = (2.0 * clipped - (low + high)) / (high - low)
        return np.hstack([scaled, np.ones((features.shape[0], 1))])


def _bounds(name: str, value: object, p: int) -> tuple[float, ...]:
    if value is MISSING:
        raise ConfigError(name, MISSING, "is required")
    if isinstance(value, list | tuple):
        if len(value) != p:
            raise ConfigError(name, value, f"lists {len(value)} bounds for {p} features")
        return tuple(finite(f"{name}[{j}]", v) for j, v in enumerate(value))
    return (finite(name, value),) * p


def logreg_plan_spec(settings: LogregSettings) -> PlanSpec:
    return PlanSpec(
        name=PLAN_NAME,
        version=PLAN_VERSION,
        rounds=settings.round_specs(),
        settings=settings.to_tables(),
    )


def check_spec(config: FederationConfig) -> LogregSettings:
    settings = LogregSettings.from_tables(config.plan.settings)
    if [(r.name, r.layout) for r in config.plan.rounds] != [
        (r.name, r.layout) for r in settings.round_specs()
    ]:
        raise ConfigError(
            "plan.rounds",
            list(config.plan.round_names),
            f"are not the rounds logreg derives from its settings (count, then "
            f"{step_name(1)} … {step_name(settings.rounds)})",
        )
    return settings


def public_sensitivities(config: FederationConfig, round_name: str) -> list[TensorSensitivity]:
    settings = LogregSettings.from_tables(config.plan.settings)
    if round_name == COUNT:
        return [TensorSensitivity("n", 1.0, "one subject changes the count by 1")]
    if round_name not in config.plan.round_names:
        raise KeyError(f"the plan has no round {round_name!r}")
    c = settings.clip_norm
    return [
        TensorSensitivity(
            "grad",
            c,
            f"each subject's gradient is scaled to L2 norm at most clip_norm = {c:g} before the "
            "sum, so one subject changes it by at most that",
        )
    ]


@dataclass(frozen=True)
class LabelledTable:
    path: Path
    ids: tuple[str, ...]
    labels: FloatArray
    features: FloatArray
    feature_names: tuple[str, ...]


def read_labelled(path: Path, n_features: int, *, limit: int = 512 * 1024 * 1024) -> LabelledTable:
    """A CSV with header ``id,label,<features>``; labels 0 or 1; refuses anything else."""
    from bounded.files import LocalFileError, read_limited_text

    try:
        text = read_limited_text(path, limit, what="data file")
    except LocalFileError as error:
        raise LocalDataError(str(error)) from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [h.strip().lower() for h in rows[0][:2]] != ["id", "label"]:
        raise LocalDataError(f"{path}: the header must begin with id,label")
    names = tuple(h.strip() for h in rows[0][2:])
    if len(names) != n_features:
        raise LocalDataError(
            f"{path} has {len(names)} feature columns; the plan declares {n_features}"
        )
    ids, labels, values = [], [], []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(rows[0]):
            raise LocalDataError(
                f"{path} line {number}: {len(row)} fields, expected {len(rows[0])}"
            )
        try:
            label = float(row[1])
            values.append([float(v) for v in row[2:]])
        except ValueError:
            raise LocalDataError(f"{path} line {number}: a value is not a number") from None
        if label not in (0.0, 1.0):
            raise LocalDataError(f"{path} line {number}: label {row[1]!r} is not 0 or 1")
        ids.append(row[0])
        labels.append(label)
    if len(set(ids)) != len(ids):
        raise LocalDataError(f"{path}: subject ids repeat")
    features = np.asarray(values, dtype=np.float64).reshape(len(ids), n_features)
    if not np.isfinite(features).all():
        raise LocalDataError(f"{path}: every feature value must be finite")
    return LabelledTable(path, tuple(ids), np.asarray(labels), features, names)


def sigmoid(z: FloatArray) -> FloatArray:
    out: FloatArray = 0.5 * (1.0 + np.tanh(0.5 * z))
    return out


def clipped_gradient_sum(
    x: FloatArray, y: FloatArray, theta: FloatArray, clip: float
) -> tuple[FloatArray, int]:
    """Σᵢ gᵢ·min(1, C/‖gᵢ‖) and how many gᵢ were scaled down."""
    g = (sigmoid(x @ theta) - y)[:, np.newaxis] * x
    norms = np.linalg.norm(g, axis=1)
    scale = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    total: FloatArray = (g * scale[:, np.newaxis]).sum(axis=0)
    return total, int(np.count_nonzero(norms > clip))


class LogregPlan:
    """One node's side of the federated logistic regression."""

    def __init__(self, config: FederationConfig, table: LabelledTable) -> None:
        self.settings = check_spec(config)
        self.config = config
        self.table = table
        if table.features.shape[0] < config.min_cohort_size:
            raise LocalDataError(
                f"{table.path}: {table.features.shape[0]} subjects; the federation requires at "
                f"least {config.min_cohort_size} per node (min_cohort_size)"
            )
        self.round_names: tuple[str, ...] = config.plan.round_names
        self.prediction_note: str | None = None
        self._x = self.settings.prescale(table.features)
        self.theta = np.zeros(self.settings.n_features + 1)
        self.n_total: float | None = None
        self._received: list[str] = []
        self._clipped: dict[str, int] = {}
        self.history: list[FloatArray] = []

    @property
    def complete(self) -> bool:
        return len(self._received) == len(self.round_names)

    @property
    def n_subjects(self) -> int:
        return int(self._x.shape[0])

    def _expect(self, round_name: str) -> None:
        position = len(self._received)
        if position >= len(self.round_names) or self.round_names[position] != round_name:
            raise ValueError(
                f"round {round_name!r} out of order: this node has received "
                f"{self._received[-1:] or 'nothing'} and expects "
                f"{self.round_names[position] if position < len(self.round_names) else 'none'}"
            )

    def tensors(self, round_name: str) -> dict[str, FloatArray]:
        self._expect(round_name)
        if round_name == COUNT:
            clipped = int(
                np.count_nonzero(
                    (self.table.features < np.asarray(self.settings.feature_low))
                    | (self.table.features > np.asarray(self.settings.feature_high))
                )
            )
            self._clipped[round_name] = clipped
            return {"n": np.asarray(float(self.n_subjects))}
        total, scaled = clipped_gradient_sum(
            self._x, self.table.labels, self.theta, self.settings.clip_norm
        )
        self._clipped[round_name] = scaled
        return {"grad": total}

    def sensitivities(self, round_name: str) -> list[TensorSensitivity]:
        return public_sensitivities(self.config, round_name)

    def receive(self, round_name: str, aggregate: dict[str, FloatArray]) -> None:
        self._expect(round_name)
        s = self.settings
        if round_name == COUNT:
            self.n_total = max(float(aggregate["n"]), 1.0)
        else:
            assert self.n_total is not None
            grad = np.asarray(aggregate["grad"], dtype=np.float64)
            self.theta = self.theta - s.learning_rate * (grad / self.n_total + s.l2 * self.theta)
            self.history.append(self.theta.copy())
        self._received.append(round_name)

    def clipped(self, round_name: str) -> dict[str, int]:
        n = self._clipped.get(round_name, 0)
        key = "feature_values" if round_name == COUNT else "gradients_scaled_to_clip_norm"
        return {"total": n, key: n}

    def n_used(self) -> int:
        return self.n_subjects

    def preflight(self) -> CohortPreflight:
        """Subjects read and the share clipped per feature (reported; this plan does not refuse).

        The size check is made when the plan is opened; the shares are shown
        for the operator, without a threshold of the plan's own.
        """
        features, n = self.table.features, self.n_subjects
        names = self.table.feature_names
        columns = []
        for j in range(self.settings.n_features):
            low, high = self.settings.feature_low[j], self.settings.feature_high[j]
            below = int(np.sum(features[:, j] < low))
            above = int(np.sum(features[:, j] > high))
            name = names[j] if j < len(names) else f"feature {j + 1}"
            columns.append(ClipShare(name, low, high, below, above, n))
        return CohortPreflight(
            source=str(self.table.path),
            n_read=n,
            n_used=n,
            nan_policy="none",
            min_cohort_size=self.config.min_cohort_size,
            columns=tuple(columns),
            max_clipped_fraction=None,
        )

    def residual_dof(self, round_name: str) -> int | None:
        return None

    def sdc_notes(self, round_name: str) -> tuple[str, ...]:
        if round_name == COUNT:
            return ("The number of subjects with calibrated Gaussian noise.",)
        return (
            "A sum over at least N subjects of per-subject gradients, each scaled to L2 norm at "
            f"most {self.settings.clip_norm:g}, with calibrated Gaussian noise; no "
            "subject-level value is released.",
        )

    def post_model_release(self) -> None:
        """The rounds are all this plan releases."""
        return None

    def probabilities(self, features: FloatArray) -> FloatArray:
        return sigmoid(self.settings.prescale(features) @ self.theta)

    def write_outputs(self, out: Path) -> tuple[Path, Path]:
        model_path = out / "model.json"
        atomic_write_json(
            model_path,
            {
                "format": "zerosum-logreg",
                "version": 1,
                "feature_names": list(self.table.feature_names),
                "weights": [float(v) for v in self.theta[:-1]],
                "intercept": float(self.theta[-1]),
                "settings": self.settings.to_tables(),
                "steps": len(self.history),
            },
        )
        probability = self.probabilities(self.table.features)
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["id", "label", "probability", "predicted"])
        for subject, label, p in zip(self.table.ids, self.table.labels, probability, strict=True):
            writer.writerow([subject, int(label), repr(float(p)), int(p >= 0.5)])
        predictions = out / "predictions.csv"
        atomic_write_text(predictions, buffer.getvalue())
        return model_path, predictions


def load_weights(path: Path) -> tuple[FloatArray, LogregSettings]:
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    settings = LogregSettings.from_tables(document["settings"])
    theta = np.asarray([*document["weights"], document["intercept"]], dtype=np.float64)
    return theta, settings


def _check(config: FederationConfig) -> None:
    check_spec(config)


def _open(config: FederationConfig, data: Path) -> LogregPlan:
    settings = LogregSettings.from_tables(config.plan.settings)
    return LogregPlan(config, read_labelled(data, settings.n_features))


PLAN: Final = PlanDefinition(
    name=PLAN_NAME,
    version=PLAN_VERSION,
    modules=("node.plans.logreg",),
    summary="logistic regression by T rounds of federated gradient descent (clipped gradients)",
    open=_open,
    public_sensitivities=public_sensitivities,
    check_spec=_check,
)
