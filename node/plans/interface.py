"""What a plan is: the computation a federation runs, round by round, over zero-sum noise.

The federation config fixes the plan by name, version and code digest, with
its public rounds (each round's name and tensor layout) and its own settings
tables (``[plan.*]``). A plan, as installed in a TRE, is a
:class:`PlanDefinition` — found by name (``node.plans.registry``) — that

* derives the rounds and every tensor's sensitivity from the config alone
  (``rounds``, ``public_sensitivities``: no data, so the coordinator, the
  reviewer and ``federation init`` agree with the nodes);
* opens a node's side of the computation on its local data (``open``), a
  :class:`ModelPlan`: it computes the node's tensors for a round from its
  data and the aggregates it has received so far, takes in each aggregate,
  and writes the model and the node's own predictions at the end.

The session code (``node.session``) sees only these two; deltab
(``node.plans.deltab.plan``) and the federated logistic regression
(``node.plans.logreg``) are two plans among any others a TRE installs.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from node.egress.release import TensorSensitivity
from node.preflight import CohortPreflight
from proto.federation import FederationConfig, PlanSpec

__all__ = ["ModelPlan", "PlanDefinition", "code_digest"]


class ModelPlan(Protocol):
    """One node's side of a plan, bound to its local data."""

    round_names: tuple[str, ...]
    # After write_outputs: a sentence on subjects predicted from clipped values, if any.
    prediction_note: str | None

    @property
    def complete(self) -> bool:
        """True once every round's aggregate has been received."""
        ...

    @property
    def n_subjects(self) -> int:
        """Subjects in the local data file."""
        ...

    def tensors(self, round_name: str) -> dict[str, NDArray[np.float64]]:
        """This node's tensors of ``round_name``, in the round's public layout order."""
        ...

    def sensitivities(self, round_name: str) -> list[TensorSensitivity]:
        """Each tensor's L2 sensitivity (add or remove one subject), from public bounds."""
        ...

    def receive(self, round_name: str, aggregate: dict[str, NDArray[np.float64]]) -> None:
        """Take in the round's aggregate (rounds arrive in order)."""
        ...

    def clipped(self, round_name: str) -> dict[str, int]:
        """Values clipped to the public bounds in the round (stays in the TRE)."""
        ...

    def n_used(self) -> int:
        """Subjects that contribute to the release (the SDC evidence)."""
        ...

    def preflight(self) -> CohortPreflight:
        """The local data against the public bounds and the minimum, before joining."""
        ...

    def residual_dof(self, round_name: str) -> int | None:
        """Residual degrees of freedom of the round's statistics, when they have any."""
        ...

    def sdc_notes(self, round_name: str) -> tuple[str, ...]:
        """Sentences for the output checker on what the round's release is."""
        ...

    def write_outputs(self, out: Path) -> tuple[Path, Path]:
        """Write the model and this node's predictions; (model path, predictions path)."""
        ...


def code_digest(modules: Sequence[str]) -> str:
    """SHA-256 over the source of ``modules`` (sorted by name): what governance approves.

    Each module contributes its dotted name, a NUL, its source bytes and a NUL,
    so renaming or moving code changes the digest as surely as editing it.
    """
    digest = hashlib.sha256()
    for name in sorted(set(modules)):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            raise ValueError(f"module {name!r} of the plan has no Python source to digest")
        digest.update(name.encode() + b"\0" + Path(spec.origin).read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class PlanDefinition:
    """A plan as installed: name, version, the code its digest covers, and its entry points.

    ``modules`` lists every module whose source decides what the node computes
    and releases (the plan and the model code under it).
    """

    name: str
    version: str
    modules: tuple[str, ...]
    summary: str
    open: Callable[[FederationConfig, Path], ModelPlan]
    public_sensitivities: Callable[[FederationConfig, str], list[TensorSensitivity]]
    check_spec: Callable[[FederationConfig], None]

    def digest(self) -> str:
        return code_digest(self.modules)

    def pins(self, spec: PlanSpec) -> PlanSpec:
        """``spec`` with this installation's version and digest (for ``federation init``)."""
        from dataclasses import replace

        return replace(spec, version=self.version, digest=self.digest())
