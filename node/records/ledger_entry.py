"""The typed privacy record: one frozen class per ledger event, and composed totals.

``node.records.ledger`` keeps the events in order and composes them; this module holds
what an event is. Each kind of event is its own immutable class with its own
documented fields (no free-form details), in the manner of one event class per
mechanism:

* :class:`Release` — an egress left the TRE; μ per observer class, the payload
  and manifest digests, the tensors, and how the noise was drawn
  (:class:`NoiseFacts`);
* :class:`LaplaceRelease` — a pure ε-DP release in the clear (a delta summary);
* :class:`UnmaskReveal` — pair terms revealed with dropped nodes; the
  release's μ per class afterwards;
* :class:`SecureSumUnmask` — CAPE secure-sum pads revealed (no μ of its own);
* :class:`Refusal` — a declined unmask request and why (no cost).

:data:`LedgerEntry` is any one of them. Observer classes are
:class:`noise.accounting.Observer`; a μ map is keyed by their labels
("outsider", "colluders:m", "coordinator", "coalition:m"), the form the
ledger file writes. Every event reads and writes the JSON form of ledger
format version 2 unchanged (``kind``, the round, ``mu`` and ``details``), and
reads version 1 (a release or unmask without a payload digest). An event that
does not fit its class (an unknown field, a malformed digest or label) is
refused with :class:`node.errors.LedgerError` naming what is wrong.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from node.egress.receipt import LayoutError, ObserverRelease, json_number, parse_json_number
from node.errors import LedgerError
from noise.accounting import Observer
from noise.errors import ObserverError

__all__ = [
    "EntryKind",
    "LaplaceRelease",
    "LedgerEntry",
    "NoiseFacts",
    "ObserverTotal",
    "Refusal",
    "Release",
    "ReleaseKey",
    "SecureSumUnmask",
    "UnmaskReveal",
    "check_digest",
    "check_mu",
    "entry_from_json",
    "label_order",
    "observer_of",
]

EntryKind = Literal["release", "unmask", "refusal", "laplace"]
# (session id, round index, payload identity) of one release.
ReleaseKey = tuple[str, int, str]
_KINDS: tuple[EntryKind, ...] = ("release", "unmask", "refusal", "laplace")


def observer_of(label: str) -> Observer:
    """The observer class a ledger label names (LedgerError when it names none)."""
    if not isinstance(label, str):
        try:
            return Observer.parse(label)
        except ObserverError as exc:
            raise LedgerError(str(exc)) from None
    return _observer_named(label)


@functools.lru_cache(maxsize=256)
def _observer_named(label: str) -> Observer:
    # Cached: totals and receipts ask for the same few labels over and over.
    try:
        return Observer.parse(label)
    except ObserverError as exc:
        raise LedgerError(str(exc)) from None


def label_order(label: str) -> tuple[int, int]:
    """Sort key of a label: outsider, colluders by size, coordinator, coalitions by size."""
    return _order_named(label) if isinstance(label, str) else observer_of(label).order


@functools.lru_cache(maxsize=256)
def _order_named(label: str) -> tuple[int, int]:
    return observer_of(label).order


def check_digest(value: str, what: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        raise LedgerError(f"{what} must be 64 lowercase hex digits (a SHA-256); got {value!r}")
    return value


def check_mu(mu: Mapping[str, float]) -> dict[str, float]:
    """μ per observer class, checked: known labels, each μ >= 0 (+inf allowed)."""
    out: dict[str, float] = {}
    for label, value in mu.items():
        observer_of(label)
        number = float(value)
        if math.isnan(number) or number < 0:
            raise LedgerError(f"μ for observer class {label!r} must be >= 0; got {value!r}")
        out[label] = number
    return out


def _frozen_mu(mu: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(check_mu(mu))


def _names(values: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise LedgerError(f"{what} must be a list of names; got {values!r}")
    names = tuple(values)
    for name in names:
        if not isinstance(name, str):
            raise LedgerError(f"{what} must hold names (strings); got {name!r}")
    return names


@dataclass(frozen=True, kw_only=True)
class _Event:
    """What every event names: the round it concerns and when it was written."""

    session_id: str
    round_index: int
    round_name: str
    timestamp: str

    def _check_round(self) -> None:
        for what in ("session_id", "round_name", "timestamp"):
            if not isinstance(getattr(self, what), str):
                raise LedgerError(f"ledger {what} must be a string; got {getattr(self, what)!r}")
        if isinstance(self.round_index, bool) or not isinstance(self.round_index, int):
            raise LedgerError(f"ledger round_index must be an integer; got {self.round_index!r}")

    @property
    def round_key(self) -> tuple[str, int]:
        """(session id, round index): the round this event concerns."""
        return (self.session_id, self.round_index)

    def _json(self, kind: str, mu: Mapping[str, float], details: dict[str, Any]) -> dict[str, Any]:
        return {
            "kind": kind,
            "session_id": self.session_id,
            "round_index": self.round_index,
            "round_name": self.round_name,
            "timestamp": self.timestamp,
            "mu": {label: json_number(v) for label, v in mu.items()},
            "details": details,
        }


@dataclass(frozen=True)
class NoiseFacts:
    """How a release's noise was drawn, beside its μ (docs/design.md §6).

    ``mechanism`` names the noise; ``delta_sampler`` is the sampler's own TV
    distance from its target law (0: exact) and ``delta_discretisation`` the
    discrete-vs-rounded-Gaussian term, each added to the δ of every
    one-egress class.
    """

    mechanism: str
    delta_sampler: float
    delta_discretisation: float

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, str):
            raise LedgerError(f"noise mechanism must be a string; got {self.mechanism!r}")
        for what in ("delta_sampler", "delta_discretisation"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise LedgerError(f"noise {what} must be a number; got {value!r}")
            if not 0.0 <= value <= 1.0:  # a total-variation distance
                raise LedgerError(f"noise {what} must be in [0, 1]; got {value!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "delta_sampler": self.delta_sampler,
            "delta_discretisation": self.delta_discretisation,
        }

    @classmethod
    def from_json(cls, data: Any) -> NoiseFacts:
        required = ("mechanism", "delta_sampler", "delta_discretisation")
        facts = _fields(data, "noise", required=required)
        return cls(
            mechanism=facts["mechanism"],
            delta_sampler=facts["delta_sampler"],
            delta_discretisation=facts["delta_discretisation"],
        )


@dataclass(frozen=True, kw_only=True)
class Release(_Event):
    """An egress that left the TRE (a μ-GDP release of discrete Gaussian noise).

    ``mu``: μ per observer class label for this release; ``payload_sha256``:
    the digest of the bytes sent ('' in a version-1 ledger, where
    ``manifest_sha256`` identifies the release instead); ``tensors``: the
    tensor names of the payload; ``noise``: how the noise was drawn (None
    when not recorded).
    """

    kind: ClassVar[Literal["release"]] = "release"

    mu: Mapping[str, float]
    payload_sha256: str
    manifest_sha256: str
    tensors: tuple[str, ...] = ()
    noise: NoiseFacts | None = None

    def __post_init__(self) -> None:
        self._check_round()
        object.__setattr__(self, "mu", _frozen_mu(self.mu))
        if self.payload_sha256:
            check_digest(self.payload_sha256, "payload_sha256")
        if not isinstance(self.manifest_sha256, str):
            raise LedgerError(f"manifest_sha256 must be a string; got {self.manifest_sha256!r}")
        object.__setattr__(self, "tensors", _names(self.tensors, "tensors"))
        if self.noise is not None and not isinstance(self.noise, NoiseFacts):
            raise LedgerError(f"noise must be NoiseFacts or None; got {self.noise!r}")

    @property
    def release_key(self) -> ReleaseKey:
        """What was released: (session, round, payload digest).

        A version-1 release names no payload digest; its manifest digest
        stands in.
        """
        digest = self.payload_sha256 or "manifest:" + self.manifest_sha256
        return (self.session_id, self.round_index, digest)

    def to_json(self) -> dict[str, Any]:
        details: dict[str, Any] = {}
        if self.payload_sha256:
            details["payload_sha256"] = self.payload_sha256
        details["manifest_sha256"] = self.manifest_sha256
        details["tensors"] = list(self.tensors)
        if self.noise is not None:
            details["noise"] = self.noise.to_json()
        return self._json("release", self.mu, details)


@dataclass(frozen=True, kw_only=True)
class LaplaceRelease(_Event):
    """A pure ε-DP release in the clear (a delta summary); every observer class sees it.

    ``epsilon``: its ε (finite, > 0); ``payload_sha256`` and
    ``manifest_sha256``: the bytes released and their manifest;
    ``statistics``: the names of the released statistics.
    """

    kind: ClassVar[Literal["laplace"]] = "laplace"
    mechanism: ClassVar[str] = "laplace"

    epsilon: float
    payload_sha256: str
    manifest_sha256: str
    statistics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._check_round()
        number = self.epsilon
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise LedgerError(f"a Laplace release's ε must be a number; got {number!r}")
        if not (math.isfinite(number) and number > 0):
            raise LedgerError(f"a Laplace release needs a finite ε > 0; got {number!r}")
        object.__setattr__(self, "epsilon", float(number))
        check_digest(self.payload_sha256, "payload_sha256")
        if not isinstance(self.manifest_sha256, str):
            raise LedgerError(f"manifest_sha256 must be a string; got {self.manifest_sha256!r}")
        object.__setattr__(self, "statistics", _names(self.statistics, "statistics"))

    @property
    def mu(self) -> Mapping[str, float]:
        """A Laplace release has no μ: its ε adds to every class's total."""
        return MappingProxyType({})

    @property
    def release_key(self) -> ReleaseKey:
        return (self.session_id, self.round_index, self.payload_sha256)

    def to_json(self) -> dict[str, Any]:
        details = {
            "epsilon": self.epsilon,
            "payload_sha256": self.payload_sha256,
            "manifest_sha256": self.manifest_sha256,
            "statistics": list(self.statistics),
            "mechanism": self.mechanism,
        }
        return self._json("laplace", {}, details)


@dataclass(frozen=True, kw_only=True)
class _Reveal(_Event):
    """An unmask request's sets: ``dropped`` (revealed with) and ``survivors``, sorted."""

    dropped: tuple[str, ...]
    survivors: tuple[str, ...]

    def _check_sets(self) -> None:
        self._check_round()
        for what in ("dropped", "survivors"):
            names = _names(getattr(self, what), what)
            object.__setattr__(self, what, tuple(sorted(names)))

    def _sets(self) -> dict[str, Any]:
        return {"dropped": list(self.dropped), "survivors": list(self.survivors)}


@dataclass(frozen=True, kw_only=True)
class UnmaskReveal(_Reveal):
    """Pair terms revealed with ``dropped``: the coordinator now holds more of the noise.

    ``mu``: the corrected release's μ per class afterwards (larger for the
    classes the reveal helps); ``payload_sha256``: the release it corrects
    (the round's latest when written; '' in a version-1 ledger, where it
    corrects every release of its round).
    """

    kind: ClassVar[Literal["unmask"]] = "unmask"

    mu: Mapping[str, float]
    payload_sha256: str = ""

    def __post_init__(self) -> None:
        self._check_sets()
        object.__setattr__(self, "mu", _frozen_mu(self.mu))
        if self.payload_sha256:
            check_digest(self.payload_sha256, "payload_sha256")

    def to_json(self) -> dict[str, Any]:
        details = self._sets()
        if self.payload_sha256:
            details["payload_sha256"] = self.payload_sha256
        return self._json("unmask", self.mu, details)


@dataclass(frozen=True, kw_only=True)
class SecureSumUnmask(_Reveal):
    """CAPE secure-sum pads revealed with ``dropped`` (no μ of its own).

    The pads blind a private Gaussian draw, not data; the cost shows in the
    model round's release. The event keeps the record of what was revealed
    to whom.
    """

    kind: ClassVar[Literal["unmask"]] = "unmask"

    def __post_init__(self) -> None:
        self._check_sets()

    @property
    def mu(self) -> Mapping[str, float]:
        return MappingProxyType({})

    def to_json(self) -> dict[str, Any]:
        return self._json("unmask", {}, {**self._sets(), "secure_sum": True})


@dataclass(frozen=True, kw_only=True)
class Refusal(_Reveal):
    """An unmask request the node declined, and its ``reason`` (no privacy cost)."""

    kind: ClassVar[Literal["refusal"]] = "refusal"

    reason: str

    def __post_init__(self) -> None:
        self._check_sets()
        if not isinstance(self.reason, str):
            raise LedgerError(f"a refusal's reason must be a string; got {self.reason!r}")

    @property
    def mu(self) -> Mapping[str, float]:
        return MappingProxyType({})

    def to_json(self) -> dict[str, Any]:
        return self._json("refusal", {}, {**self._sets(), "reason": self.reason})


LedgerEntry = Release | LaplaceRelease | UnmaskReveal | SecureSumUnmask | Refusal


def _fields(
    data: Any, what: str, *, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``data`` as a dict holding every ``required`` key and no key beyond ``optional``."""
    if not isinstance(data, Mapping):
        raise LedgerError(f"{what} must be a JSON object; got {data!r}")
    missing = [key for key in required if key not in data]
    if missing:
        raise LedgerError(f"{what} lacks {', '.join(map(repr, missing))}")
    unknown = [key for key in data if key not in required and key not in optional]
    if unknown:
        raise LedgerError(f"{what} has unknown field(s) {', '.join(map(repr, unknown))}")
    return dict(data)


_DETAILS: dict[tuple[str, bool], tuple[tuple[str, ...], tuple[str, ...]]] = {
    # (kind, secure_sum): (required details, optional details)
    ("release", False): (("manifest_sha256", "tensors"), ("payload_sha256", "noise")),
    ("laplace", False): (
        ("epsilon", "payload_sha256", "manifest_sha256", "statistics", "mechanism"),
        (),
    ),
    ("unmask", False): (("dropped", "survivors"), ("payload_sha256",)),
    ("unmask", True): (("dropped", "survivors", "secure_sum"), ()),
    ("refusal", False): (("dropped", "survivors", "reason"), ()),
}


def entry_from_json(data: Any) -> LedgerEntry:
    """The event an entry of a ledger file (format version 1 or 2) records."""
    try:
        return _entry(data)
    except (KeyError, TypeError, ValueError, LayoutError) as exc:
        raise LedgerError(f"ledger entry {_shown(data)} is malformed: {exc}") from exc


def _shown(data: Any) -> str:
    return repr(dict(data)) if isinstance(data, Mapping) else repr(data)


def _entry(data: Any) -> LedgerEntry:
    entry = _fields(
        data,
        "ledger entry",
        required=("kind", "session_id", "round_index", "round_name", "timestamp", "mu"),
        optional=("details",),
    )
    kind = entry["kind"]
    if kind not in _KINDS:
        raise LedgerError(f"ledger entry kind {kind!r} is unknown")
    if not isinstance(entry["mu"], Mapping):
        raise LedgerError(f"mu must be a JSON object; got {entry['mu']!r}")
    mu = {str(k): parse_json_number(v, f"mu[{k!r}]") for k, v in entry["mu"].items()}
    raw = entry.get("details", {})
    secure_sum = isinstance(raw, Mapping) and kind == "unmask" and "secure_sum" in raw
    required, optional = _DETAILS[(kind, secure_sum)]
    details = _fields(raw, f"{kind} details", required=required, optional=optional)
    round_fields: dict[str, Any] = {
        "session_id": str(entry["session_id"]),
        "round_index": int(entry["round_index"]),
        "round_name": str(entry["round_name"]),
        "timestamp": str(entry["timestamp"]),
    }
    if kind == "release":
        noise = details.get("noise")
        return Release(
            **round_fields,
            mu=mu,
            payload_sha256=details.get("payload_sha256", ""),
            manifest_sha256=details["manifest_sha256"],
            tensors=details["tensors"],
            noise=None if noise is None else NoiseFacts.from_json(noise),
        )
    if mu and kind != "unmask":
        raise LedgerError(f"a {kind} entry carries no μ; got {mu!r}")
    if kind == "laplace":
        if details["mechanism"] != "laplace":
            raise LedgerError(
                f"a laplace entry's mechanism must be 'laplace'; got {details['mechanism']!r}"
            )
        return LaplaceRelease(
            **round_fields,
            epsilon=details["epsilon"],
            payload_sha256=details["payload_sha256"],
            manifest_sha256=details["manifest_sha256"],
            statistics=details["statistics"],
        )
    sets: dict[str, Any] = {"dropped": details["dropped"], "survivors": details["survivors"]}
    if kind == "refusal":
        return Refusal(**round_fields, **sets, reason=details["reason"])
    if secure_sum:
        if details["secure_sum"] is not True:
            raise LedgerError(f"secure_sum must be true; got {details['secure_sum']!r}")
        if mu:
            raise LedgerError(f"a secure-sum unmask carries no μ; got {mu!r}")
        return SecureSumUnmask(**round_fields, **sets)
    digest = details.get("payload_sha256", "")
    return UnmaskReveal(**round_fields, **sets, mu=mu, payload_sha256=digest)


@dataclass(frozen=True)
class ObserverTotal:
    """Composed privacy loss against one observer class over every release so far."""

    observer: Observer
    mu: float
    epsilon: float
    delta: float
    releases: int
    # Pure ε of the Laplace releases (the delta summaries), included in ``epsilon``.
    laplace_epsilon: float = 0.0

    @property
    def label(self) -> str:
        """The class as the ledger writes it ("colluders:1")."""
        return self.observer.label

    def as_release(self) -> ObserverRelease:
        return ObserverRelease.of(self.observer, self.mu, self.epsilon, self.delta)
