"""The public facts of one release: tensor layout, noise, DP receipt, masking, SDC.

These immutable value objects are what a node's egress manifest declares and
what a reviewer reads (docs/design.md §8). Privacy figures follow μ-Gaussian
differential privacy (Dong, Roth & Su 2022, JRSS-B) with (ε, δ) from the exact
Gaussian tradeoff of the analytic Gaussian mechanism (Balle & Wang 2018,
ICML); an unbounded μ (an observer who learns a value exactly) is written to
JSON as the string "inf".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from noise.accounting import Observer
from noise.layout import Layout, LayoutError, TensorSlot

__all__ = [
    "GAUSSIAN_MECHANISM",
    "SAMPLER",
    "DPReceipt",
    "LayoutError",
    "MaskingFacts",
    "ObserverRelease",
    "SDCEvidence",
    "TensorEntry",
    "check_layout",
    "entries_layout",
    "json_number",
    "parse_json_number",
]

GAUSSIAN_MECHANISM = (
    "discrete Gaussian on the fixed-point grid (Canonne, Kamath & Steinke 2020), "
    "calibrated as the analytic Gaussian mechanism (Balle & Wang 2018)"
)
SAMPLER = (
    "exact integer sampler on the AES-128-CTR keyed streams (noise.discrete): bins "
    "of an integer alias table with a geometric tail (noise.gaussian_table) and one "
    "acceptance test decided exactly"
)


def json_number(value: float) -> float | str:
    """JSON has no infinity; an unbounded μ or ε is written as the string "inf"."""
    if math.isinf(value) and value > 0:
        return "inf"
    if not math.isfinite(value):
        raise LayoutError(f"privacy figures must be finite or +inf; got {value!r}")
    return float(value)


def parse_json_number(value: Any, what: str) -> float:
    """Inverse of :func:`json_number`."""
    if value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LayoutError(f"{what} must be a number or 'inf'; got {value!r}")
    return float(value)


@dataclass(frozen=True)
class TensorEntry:
    """Where one named tensor sits in the payload, and how much noise it carries.

    ``sigma`` is the per-entry noise standard deviation in the tensor's own units
    as an outsider sees a single egress: √(R_kk·s_t² + σ_res,t²). ``coalition_sigma``
    lists, for coalitions of s = 1..T other nodes pooling their pairwise seeds,
    the smallest std left on this node's entries (worst case over coalitions).
    """

    name: str
    shape: tuple[int, ...]
    offset: int
    size: int
    sigma: float
    sensitivity: float
    sensitivity_derivation: str
    coalition_sigma: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "offset": self.offset,
            "size": self.size,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "sensitivity_derivation": self.sensitivity_derivation,
            "coalition_sigma": list(self.coalition_sigma),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorEntry:
        try:
            return cls(
                name=str(data["name"]),
                shape=tuple(int(n) for n in data["shape"]),
                offset=int(data["offset"]),
                size=int(data["size"]),
                sigma=float(data["sigma"]),
                sensitivity=float(data["sensitivity"]),
                sensitivity_derivation=str(data["sensitivity_derivation"]),
                coalition_sigma=tuple(float(v) for v in data.get("coalition_sigma", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"manifest tensor entry {dict(data)!r} is malformed: {exc}") from exc


@dataclass(frozen=True)
class MaskingFacts:
    """What an outsider may know about the masking: the public design, never a seed.

    ``remaining_std_fraction[s-1]`` is the worst-case fraction of this node's
    outsider noise std that remains when s other nodes pool their seeds
    (s = 1..T, the collusion threshold).
    """

    construction: str
    graph: str
    n_nodes: int
    collusion_threshold: int
    remaining_std_fraction: tuple[float, ...]
    residual_dp: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "construction": self.construction,
            "graph": self.graph,
            "n_nodes": self.n_nodes,
            "collusion_threshold": self.collusion_threshold,
            "remaining_std_fraction": [
                {"coalition_size": s + 1, "fraction": f}
                for s, f in enumerate(self.remaining_std_fraction)
            ],
            "residual_dp": self.residual_dp,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MaskingFacts:
        try:
            rows = sorted(
                data["remaining_std_fraction"], key=lambda row: int(row["coalition_size"])
            )
            return cls(
                construction=str(data["construction"]),
                graph=str(data["graph"]),
                n_nodes=int(data["n_nodes"]),
                collusion_threshold=int(data["collusion_threshold"]),
                remaining_std_fraction=tuple(float(row["fraction"]) for row in rows),
                residual_dp=bool(data["residual_dp"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"manifest masking facts are malformed: {exc}") from exc


@dataclass(frozen=True)
class ObserverRelease:
    """μ-GDP and (ε, δ) of a release against one observer class.

    ``observer`` is "outsider" (a single egress), "colluders" (a single egress
    and the secrets of ``coalition_size`` colluding nodes), "coordinator"
    (every egress of the round) or "coalition" (the coordinator with
    ``coalition_size`` nodes pooling their seeds). ``mu`` may be +inf (e.g.
    the coordinator learns the exact aggregate when residual DP is off); it is
    written as "inf".
    """

    observer: str
    coalition_size: int
    mu: float
    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        # An unknown class, or a size that does not fit it, is refused here (ObserverError).
        Observer.named(self.observer, self.coalition_size)

    @classmethod
    def of(cls, observer: Observer, mu: float, epsilon: float, delta: float) -> ObserverRelease:
        """The row of ``observer``."""
        return cls(observer.kind, observer.size, mu, epsilon, delta)

    @property
    def observer_class(self) -> Observer:
        """The row's observer class (noise.accounting.Observer)."""
        return Observer.named(self.observer, self.coalition_size)

    @property
    def label(self) -> str:
        """The observer class as the ledger keys it ("coalition:2" for a coalition of 2)."""
        return self.observer_class.label

    def to_json(self) -> dict[str, Any]:
        return {
            "observer": self.observer,
            "coalition_size": self.coalition_size,
            "mu": json_number(self.mu),
            "epsilon": json_number(self.epsilon),
            "delta": self.delta,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ObserverRelease:
        try:
            return cls(
                observer=str(data["observer"]),
                coalition_size=int(data["coalition_size"]),
                mu=parse_json_number(data["mu"], "mu"),
                epsilon=parse_json_number(data["epsilon"], "epsilon"),
                delta=float(data["delta"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"DP receipt row {dict(data)!r} is malformed: {exc}") from exc


@dataclass(frozen=True)
class DPReceipt:
    """The differential-privacy receipt of one release and the ledger totals after it."""

    delta: float
    release: tuple[ObserverRelease, ...]
    cumulative: tuple[ObserverRelease, ...]
    releases_in_ledger: int
    mechanism: str = GAUSSIAN_MECHANISM
    calibration: str = ""
    # How the integers were drawn, and the δ each step adds to the (ε, δ) of
    # every one-egress class (docs/design.md §6): the sampler's own TV distance
    # from its target law (0: exact) and the discrete-vs-rounded-Gaussian term.
    sampler: str = SAMPLER
    delta_sampler: float = 0.0
    delta_discretisation: float = 0.0

    def observer(self, label: str, *, cumulative: bool = False) -> ObserverRelease:
        """The row for an observer class label ("outsider", "coordinator", "coalition:2")."""
        for row in self.cumulative if cumulative else self.release:
            if row.label == label:
                return row
        raise KeyError(f"DP receipt has no observer class {label!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "calibration": self.calibration,
            "delta": self.delta,
            "sampler": self.sampler,
            "delta_sampler": self.delta_sampler,
            "delta_discretisation": self.delta_discretisation,
            "release": [row.to_json() for row in self.release],
            "cumulative": [row.to_json() for row in self.cumulative],
            "releases_in_ledger": self.releases_in_ledger,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DPReceipt:
        try:
            return cls(
                mechanism=str(data["mechanism"]),
                calibration=str(data.get("calibration", "")),
                delta=float(data["delta"]),
                sampler=str(data.get("sampler", "")),
                delta_sampler=float(data.get("delta_sampler", 0.0)),
                delta_discretisation=float(data.get("delta_discretisation", 0.0)),
                release=tuple(ObserverRelease.from_json(r) for r in data["release"]),
                cumulative=tuple(ObserverRelease.from_json(r) for r in data["cumulative"]),
                releases_in_ledger=int(data["releases_in_ledger"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"manifest DP receipt is malformed: {exc}") from exc


@dataclass(frozen=True)
class SDCEvidence:
    """Statistical-disclosure-control facts a checker asks for (never the clipped count)."""

    n_subjects: int
    residual_degrees_of_freedom: int | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "n_subjects": self.n_subjects,
            "residual_degrees_of_freedom": self.residual_degrees_of_freedom,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SDCEvidence:
        try:
            dof = data.get("residual_degrees_of_freedom")
            return cls(
                n_subjects=int(data["n_subjects"]),
                residual_degrees_of_freedom=None if dof is None else int(dof),
                notes=tuple(str(n) for n in data.get("notes", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"manifest SDC evidence is malformed: {exc}") from exc


def entries_layout(tensors: Sequence[TensorEntry]) -> Layout:
    """The payload layout the manifest entries declare (LayoutError when malformed)."""
    return Layout(TensorSlot(e.name, e.shape, e.offset, e.size) for e in tensors)


def check_layout(tensors: Sequence[TensorEntry], total: int | None = None) -> Layout:
    """The entries' layout, checked: back to back from 0, size = Π shape, filling ``total``.

    Each declared σ and sensitivity must be finite and >= 0.
    """
    layout = entries_layout(tensors)
    for entry in tensors:
        for what, value in (("sigma", entry.sigma), ("sensitivity", entry.sensitivity)):
            if not math.isfinite(value) or value < 0:
                raise LayoutError(
                    f"tensor {entry.name!r} has {what} {value!r}; it must be finite and >= 0"
                )
    if total is not None and layout.size != total:
        raise LayoutError(f"the layout covers {layout.size} entries but the payload holds {total}")
    return layout
