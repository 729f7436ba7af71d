"""What a plan is: the computation a federation runs, round by round, over zero-sum noise.

The federation config fixes the plan by name, version and code digest, with
its public rounds (each round's name and tensor layout) and its own settings
tables (``[plan.*]``). A plan, as installed in a TRE, is a
:class:`PlanDefinition` — found by name (``node.plans.registry``) — that

* derives the rounds and every tensor's sensitivity from the config alone
  (``rounds``, ``public_sensitivities``, each a :class:`TensorSensitivity`:
  no data, so the coordinator, the reviewer and ``federation init`` agree
  with the nodes);
* opens a node's side of the computation on its local data (``open``), a
  :class:`ModelPlan`: it computes the node's tensors for a round from its
  data and the aggregates it has received so far, takes in each aggregate,
  writes the model and the node's own predictions at the end, and may make
  one release of its own after the model (``post_model_release``, a
  :class:`PostModelRelease`: the brain-age plan's delta summary);
* tells the output checker how to read its releases: each tensor in real
  units (``unit_decoder``, a :class:`UnitDecoder`), in words
  (``tensor_meanings``), and the columns it clips with the share past which
  the bounds do not fit (``clipped_columns``, :class:`ClippedColumns`);
* lists the code its digest covers (``modules``; for a plan in one folder,
  :func:`package_modules` of it).

The node's generic rooms (``node.session``, ``node.review``, ``node.egress``,
``node.records``, ``node.runner``) see only this module and the registry,
never a specific plan (``tests/house/test_import_rules.py``); the brain-age
fit (``node.plans.deltab``) and the federated logistic regression
(``node.plans.logreg``) are two plans among any others a TRE installs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

from node.preflight import CohortPreflight
from proto.federation import FederationConfig, PlanSpec

if TYPE_CHECKING:
    from node.session.context import SessionContext

__all__ = [
    "ClippedColumns",
    "ModelPlan",
    "PlanDefinition",
    "PostModelRelease",
    "TensorSensitivity",
    "UnitDecoder",
    "code_digest",
    "package_modules",
]


@dataclass(frozen=True)
class TensorSensitivity:
    """A tensor's L2 sensitivity (one subject added or removed) and how it was derived."""

    name: str
    sensitivity: float
    derivation: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sensitivity) and self.sensitivity > 0):
            raise ValueError(
                f"tensor {self.name!r} has sensitivity {self.sensitivity!r}; "
                "it must be finite and > 0"
            )


class PostModelRelease(Protocol):
    """A release a plan makes once its model is written, outside its rounds (pure ε-DP).

    The session counts ``epsilon`` in its budget before the first round
    (``node.session.egress_steps.check_session_budget``) and, after the model
    and predictions are written, calls ``release``: the plan writes the
    bundle, awaits the output checker's approval and records it in the ledger.
    """

    @property
    def label(self) -> str:
        """What the release is, in the budget's sentences (e.g. "delta summary")."""
        ...

    @property
    def epsilon(self) -> float:
        """Its ε (Laplace noise), charged to every observer class."""
        ...

    def release(self, ctx: SessionContext, model_path: Path) -> Path:
        """Write, get approved and record the release; the folder it is in."""
        ...


class UnitDecoder(Protocol):
    """A round's released tensors as a reviewer reads them (``node.review.units``)."""

    def meaning(self, name: str) -> str:
        """A sentence on what tensor ``name`` is."""
        ...

    def real(self, name: str) -> tuple[NDArray[np.float64] | None, list[str], str]:
        """Tensor ``name`` in real units, a label per entry, and the unit (None: scaled only)."""
        ...


@dataclass(frozen=True)
class ClippedColumns:
    """The columns a plan clips to public bounds, as its audit record counts them.

    ``names`` as a reviewer sees them, ``keys`` the audit record's counts of
    the same columns (``ModelPlan.clipped``), the share of subjects past
    which a column's bounds do not fit the data (``node.review.clipping``),
    and the columns in words, for "0 % for ...".
    """

    names: tuple[str, ...]
    keys: tuple[str, ...]
    max_fraction: float
    in_words: str = "every column"


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

    def post_model_release(self) -> PostModelRelease | None:
        """The release the plan makes after its model, if any (None: the rounds are all)."""
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


def package_modules(package: str) -> tuple[str, ...]:
    """Every module of ``package`` by dotted name: each ``.py`` file of its folder, at any depth.

    What a plan's digest covers when the plan keeps its code in one folder;
    a file added to the folder is covered without being listed.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package!r} is not a package with a folder to digest")
    names = []
    for location in spec.submodule_search_locations:
        root = Path(location)
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join((package, *parts)))
    return tuple(sorted(names))


@dataclass(frozen=True)
class PlanDefinition:
    """A plan as installed: name, version, the code its digest covers, and its entry points.

    ``modules`` lists every module whose source decides what the node computes
    and releases (the plan and the model code under it); a plan kept in one
    folder lists :func:`package_modules` of it.
    """

    name: str
    version: str
    modules: tuple[str, ...]
    summary: str
    open: Callable[[FederationConfig, Path], ModelPlan]
    public_sensitivities: Callable[[FederationConfig, str], list[TensorSensitivity]]
    check_spec: Callable[[FederationConfig], None]
    # For the output checker (node.review): the real-unit reading of a round's
    # tensors, and the clipped columns the audit record counts; None: the plan has none.
    unit_decoder: (
        Callable[[FederationConfig, dict[str, NDArray[np.float64]]], UnitDecoder | None] | None
    ) = None
    clipped_columns: Callable[[FederationConfig], ClippedColumns] | None = None
    # What each tensor of its rounds is, by name, in one sentence (the reviewer's words).
    tensor_meanings: Mapping[str, str] = field(default_factory=dict)

    def digest(self) -> str:
        return code_digest(self.modules)

    def pins(self, spec: PlanSpec) -> PlanSpec:
        """``spec`` with this installation's version and digest (for ``federation init``)."""
        from dataclasses import replace

        return replace(spec, version=self.version, digest=self.digest())
