"""The brain-age plan as the session runner sees it: rounds, tensors, sensitivities, model.

The runner knows nothing of brain age; it asks this adapter for each round's
tensors (``node.deltab.plan.round_tensors``: sums over the node's subjects
after clipping to the public bounds and pre-scaling to [-1, 1]), their L2
sensitivities (``node.deltab.stats.sensitivity``, with how each was derived),
the local clipped counts for the audit record, and hands back each round's
aggregate (``node.deltab.plan.receive``). After the last round it writes the
global model and predicts this node's own subjects.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from node.cohort import LocalCohort
from node.deltab import plan as deltab_plan
from node.deltab.persist import save_model
from node.deltab.stats import MOMENTS, SCATTER, sensitivity
from node.plans.deltab import plan_settings
from node.release import TensorSensitivity
from proto.federation import FederationConfig

__all__ = ["ModelPlan"]

# One sentence per tensor, completing "one subject changes this tensor by at most …".
_DERIVATIONS = {
    MOMENTS: {
        "n": "1 (its own count)",
        "count_x": "√P (one observed-value indicator per feature)",
        "sum_x": "√P (pre-scaled features lie in [-1, 1])",
        "sum_x2": "√P (squares of values in [-1, 1])",
        "sum_y": "1 (pre-scaled age in [-1, 1])",
        "sum_y2": "1 (square of the pre-scaled age)",
        "sum_c": "√C (pre-scaled confounds in [-1, 1])",
        "sum_c2": "√C (squares of pre-scaled confounds)",
    },
    SCATTER: {
        "n": "1 (its own count)",
        "sum_x": "‖β‖, β_j = 1 + |m_j| bounding each centred feature (m: the public means)",
        "sum_xx": "‖β‖² (Frobenius norm of c cᵀ bounds its packed triangle)",
        "sum_xy": "‖β‖·α, α = 1 + |m_age| bounding the centred age",
        "sum_xy2": "‖β‖·α²",
        "sum_y": "α",
        "sum_y2": "α²",
        "sum_y3": "α³",
        "sum_y4": "α⁴",
        "sum_c": "‖κ‖, κ_l = 1 + |m_l| bounding each centred confound",
        "sum_cc": "‖κ‖²",
        "sum_xc": "‖β‖·‖κ‖",
        "sum_yc": "α·‖κ‖",
        "sum_y2c": "α²·‖κ‖",
    },
}


class ModelPlan:
    """One node's side of the federated brain-age fit (exact plan: moments, scatter)."""

    round_names: tuple[str, ...] = tuple(deltab_plan.ROUNDS)

    def __init__(self, config: FederationConfig, cohort: LocalCohort) -> None:
        self.settings = plan_settings(config)
        self.state = deltab_plan.NodeState(settings=self.settings)
        self.cohort = cohort
        self._tensors: dict[str, dict[str, NDArray[np.float64]]] = {}
        self._received: set[str] = set()

    @property
    def complete(self) -> bool:
        return set(self.round_names) <= self._received

    def tensors(self, round_name: str) -> dict[str, NDArray[np.float64]]:
        """This node's contribution to ``round_name`` (computed once, then reused)."""
        if round_name not in self._tensors:
            computed = deltab_plan.round_tensors(
                round_name, self.cohort.features, self.cohort.age, self.state
            )
            self._tensors[round_name] = {
                name: np.asarray(value, dtype=np.float64) for name, value in computed.items()
            }
        return self._tensors[round_name]

    def sensitivities(self, round_name: str) -> list[TensorSensitivity]:
        """Each tensor's L2 sensitivity (add or remove one subject), in tensor order."""
        bounds = self.settings.bounds
        assert bounds is not None
        figures = sensitivity(round_name, bounds, self.state.standardisation)
        notes = _DERIVATIONS.get(round_name, {})
        out = []
        for name in self.tensors(round_name):
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

    def receive(self, round_name: str, aggregate: dict[str, NDArray[np.float64]]) -> None:
        deltab_plan.receive(round_name, aggregate, self.state)
        self._received.add(round_name)

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

    def n_used(self) -> int:
        """Subjects contributing (nan_policy "mean" keeps every subject with an age)."""
        return self.cohort.n_subjects

    def residual_dof(self, round_name: str) -> int | None:
        """N − P − 1 for the scatter round (regression of age on P features and an intercept)."""
        if round_name != SCATTER:
            return None
        return self.n_used() - len(self.cohort.feature_names) - 1

    def sdc_notes(self, round_name: str) -> tuple[str, ...]:
        notes = [
            "Every released value is a sum over at least N subjects with calibrated Gaussian "
            "noise; no subject-level value is released."
        ]
        if round_name == SCATTER:
            notes.append(
                "Residual degrees of freedom: N − P − 1 for a regression of age on the P "
                "features with an intercept."
            )
        return tuple(notes)

    # -- the result -----------------------------------------------------

    def save_model(self, path: Path) -> None:
        if self.state.model is None:
            raise RuntimeError("the model is not fitted: the scatter round has not been received")
        save_model(self.state.model, path)

    def predict(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(brain age, delta) in years for this node's own subjects."""
        model = self.state.model
        if model is None:
            raise RuntimeError("the model is not fitted: the scatter round has not been received")
        delta = np.asarray(model.predict_delta(self.cohort.features, self.cohort.age))
        return self.cohort.age + delta, delta
