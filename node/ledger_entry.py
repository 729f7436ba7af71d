"""One event of the privacy ledger, the observer-class labels it uses, and composed totals.

``node.ledger`` keeps the entries in order and composes them; this module
holds what an entry is. Labels: "outsider", "colluders:m" (an outsider with
the secrets of m colluding nodes), "coordinator" and "coalition:m" (the
coordinator with m colluding nodes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from node.errors import LedgerError
from node.receipt import LayoutError, ObserverRelease, json_number, parse_json_number

__all__ = [
    "EntryKind",
    "LedgerEntry",
    "ObserverTotal",
    "ReleaseKey",
    "check_digest",
    "check_mu",
    "label_order",
    "observer_from_label",
]

EntryKind = Literal["release", "unmask", "refusal", "laplace"]
# (session id, round index, payload identity) of one release.
ReleaseKey = tuple[str, int, str]
_OBSERVERS = ("outsider", "coordinator")
_GROUPS = ("coalition", "colluders")


def observer_from_label(label: str) -> tuple[str, int]:
    """("outsider", 0), ("coordinator", 0), ("colluders", m) or ("coalition", m) from a label."""
    if label in _OBSERVERS:
        return label, 0
    kind, _, size = label.partition(":")
    if kind in _GROUPS and size.isdigit() and int(size) >= 1:
        return kind, int(size)
    raise LedgerError(
        f"observer class {label!r} is not 'outsider', 'coordinator', 'colluders:<m>' or "
        "'coalition:<m>'"
    )


def check_digest(value: str, what: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        raise LedgerError(f"{what} must be 64 lowercase hex digits (a SHA-256); got {value!r}")
    return value


def check_mu(mu: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for label, value in mu.items():
        observer_from_label(label)
        number = float(value)
        if math.isnan(number) or number < 0:
            raise LedgerError(f"μ for observer class {label!r} must be >= 0; got {value!r}")
        out[label] = number
    return out


@dataclass(frozen=True)
class LedgerEntry:
    """One event in the ledger; ``release_key`` names the release it concerns."""

    kind: EntryKind
    session_id: str
    round_index: int
    round_name: str
    timestamp: str
    mu: Mapping[str, float] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def round_key(self) -> tuple[str, int]:
        """(session id, round index): the round this entry concerns."""
        return (self.session_id, self.round_index)

    @property
    def laplace_epsilon(self) -> float:
        """The pure ε of a ``laplace`` entry (0 for every other kind)."""
        if self.kind != "laplace":
            return 0.0
        return float(self.details.get("epsilon", 0.0))

    @property
    def payload_sha256(self) -> str:
        """The digest of the payload released (release) or corrected (unmask); '' if unnamed."""
        return str(self.details.get("payload_sha256", ""))

    @property
    def release_key(self) -> ReleaseKey:
        """What this release entry released: (session, round, payload identity).

        A version-1 entry names no payload digest; its manifest digest stands in.
        """
        digest = self.payload_sha256
        if not digest:
            digest = "manifest:" + str(self.details.get("manifest_sha256", ""))
        return (self.session_id, self.round_index, digest)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "session_id": self.session_id,
            "round_index": self.round_index,
            "round_name": self.round_name,
            "timestamp": self.timestamp,
            "mu": {label: json_number(v) for label, v in self.mu.items()},
            "details": dict(self.details),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LedgerEntry:
        try:
            kind = data["kind"]
            if kind not in ("release", "unmask", "refusal", "laplace"):
                raise LedgerError(f"ledger entry kind {kind!r} is unknown")
            return cls(
                kind=kind,
                session_id=str(data["session_id"]),
                round_index=int(data["round_index"]),
                round_name=str(data["round_name"]),
                timestamp=str(data["timestamp"]),
                mu={str(k): parse_json_number(v, f"mu[{k!r}]") for k, v in data["mu"].items()},
                details=dict(data.get("details", {})),
            )
        except (KeyError, TypeError, ValueError, LayoutError) as exc:
            if isinstance(exc, LedgerError):
                raise
            raise LedgerError(f"ledger entry {dict(data)!r} is malformed: {exc}") from exc


@dataclass(frozen=True)
class ObserverTotal:
    """Composed privacy loss against one observer class over every release so far."""

    label: str
    mu: float
    epsilon: float
    delta: float
    releases: int
    # Pure ε of the Laplace releases (the delta summaries), included in ``epsilon``.
    laplace_epsilon: float = 0.0

    def as_release(self) -> ObserverRelease:
        observer, size = observer_from_label(self.label)
        return ObserverRelease(observer, size, self.mu, self.epsilon, self.delta)


def label_order(label: str) -> tuple[int, int]:
    observer, size = observer_from_label(label)
    return ({"outsider": 0, "colluders": 1, "coordinator": 2}.get(observer, 3), size)
