"""The node's privacy ledger: every release and unmask correction, and what they add up to.

A TRE must be able to say, at any time, how much the data it holds has
disclosed in total. The ledger is a JSON file (``OUT/ledger.json``, kept across
sessions for the same data) with one entry per event:

* ``release`` — an egress left the TRE; it records μ per observer class
  ("outsider", "coordinator", "coalition:m" for the coordinator plus m pooling
  nodes) for that release;
* ``unmask`` — the node revealed its pair terms with dropped nodes for a round;
  the coordinator then holds more of the node's noise than before, so the
  entry records the release's new, larger μ per observer class. Its
  ``dropped`` list is everything revealed for that round so far (a node only
  answers a request whose dropped set contains every earlier one). For a CAPE
  secure-sum round the revealed values are one-time pads, the entry has no μ
  and ``details.secure_sum`` is true;
* ``refusal`` — the node declined an unmask request, with its reason (no
  privacy cost, kept for the record).

Totals compose exactly in μ-GDP: a release's cost is its largest recorded μ
(the release itself or a later correction), and r releases compose to
μ = sqrt(Σ μ_r²) (Dong, Roth & Su 2022, JRSS-B, Corollary 3.3); (ε, δ) is read
off the exact Gaussian tradeoff at the ledger's δ (Balle & Wang 2018). An
unbounded μ (the coordinator learns an exact sum when residual DP is off)
makes that class's total unbounded, written "inf".

Every update rewrites the whole file atomically (temporary file, fsync,
rename), so a crash leaves either the old or the new ledger, never a torn one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from node.atomic import atomic_write_json
from node.errors import LedgerError
from node.receipt import LayoutError, ObserverRelease, json_number, parse_json_number
from noise.accounting import compose_mu, gaussian_epsilon

__all__ = [
    "LEDGER_FORMAT",
    "LedgerEntry",
    "LedgerError",
    "ObserverTotal",
    "PrivacyLedger",
    "observer_from_label",
]

LEDGER_FORMAT = "zerosum-ledger"
LEDGER_VERSION = 1
COMPOSITION = (
    "μ-GDP composition: μ_total = sqrt(Σ μ_release²), each release at its largest recorded μ "
    "(Dong, Roth & Su 2022); ε from the exact Gaussian tradeoff at δ (Balle & Wang 2018)"
)

EntryKind = Literal["release", "unmask", "refusal"]


def observer_from_label(label: str) -> tuple[str, int]:
    """("outsider", 0), ("coordinator", 0) or ("coalition", m) from a ledger label."""
    if label in {"outsider", "coordinator"}:
        return label, 0
    kind, _, size = label.partition(":")
    if kind == "coalition" and size.isdigit() and int(size) >= 1:
        return kind, int(size)
    raise LedgerError(
        f"observer class {label!r} is not 'outsider', 'coordinator' or 'coalition:<m>'"
    )


def _check_mu(mu: Mapping[str, float]) -> dict[str, float]:
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
    def release_key(self) -> tuple[str, int]:
        return (self.session_id, self.round_index)

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
            if kind not in ("release", "unmask", "refusal"):
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

    def as_release(self) -> ObserverRelease:
        observer, size = observer_from_label(self.label)
        return ObserverRelease(observer, size, self.mu, self.epsilon, self.delta)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class PrivacyLedger:
    """The privacy ledger of one node, bound to a file.

    ``delta`` is the δ at which composed totals are converted to ε (the
    policy's per-release δ). Each ``record_*`` call appends one entry and
    saves the file; a rejected entry leaves both memory and file unchanged.
    """

    def __init__(self, path: Path, node_id: str, delta: float) -> None:
        if not 0.0 < delta < 1.0:
            raise LedgerError(f"ledger δ must be strictly between 0 and 1; got {delta!r}")
        self.path = Path(path)
        self.node_id = node_id
        self.delta = float(delta)
        self._entries: list[LedgerEntry] = []

    # -- persistence ----------------------------------------------------

    @classmethod
    def open(cls, path: Path, node_id: str, delta: float) -> PrivacyLedger:
        """Load the ledger at ``path`` (an empty one when the file does not exist yet)."""
        ledger = cls(path, node_id, delta)
        path = Path(path)
        if not path.exists():
            return ledger
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise LedgerError(f"privacy ledger {path} is not valid JSON: {exc}") from exc
        if document.get("format") != LEDGER_FORMAT:
            raise LedgerError(f"{path} is not a {LEDGER_FORMAT} file")
        if document.get("version") != LEDGER_VERSION:
            raise LedgerError(
                f"{path} has ledger version {document.get('version')!r}; "
                f"this program reads version {LEDGER_VERSION}"
            )
        if document.get("node_id") != node_id:
            raise LedgerError(
                f"privacy ledger {path} belongs to node {document.get('node_id')!r}, "
                f"not {node_id!r}"
            )
        ledger._entries = [LedgerEntry.from_json(e) for e in document.get("entries", [])]
        return ledger

    def to_json(self) -> dict[str, Any]:
        return {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "node_id": self.node_id,
            "delta": self.delta,
            "composition": COMPOSITION,
            "updated": _now(),
            "entries": [e.to_json() for e in self._entries],
            "totals": {
                t.label: {
                    "mu": json_number(t.mu),
                    "epsilon": json_number(t.epsilon),
                    "delta": t.delta,
                    "releases": t.releases,
                }
                for t in self.totals()
            },
        }

    def save(self) -> None:
        atomic_write_json(self.path, self.to_json())

    def _append(self, entry: LedgerEntry) -> None:
        self._entries.append(entry)
        try:
            self.save()
        except BaseException:
            self._entries.pop()
            raise

    # -- queries --------------------------------------------------------

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        return tuple(self._entries)

    def release_mu(self) -> dict[tuple[str, int], dict[str, float]]:
        """Per release (session, round): the largest μ recorded per observer class."""
        out: dict[tuple[str, int], dict[str, float]] = {}
        for entry in self._entries:
            # A refusal costs nothing, nor does revealing CAPE secure-sum pads
            # (an unmask entry without μ, for a round that released no egress).
            if entry.kind == "refusal" or (entry.kind == "unmask" and not entry.mu):
                continue
            current = out.setdefault(entry.release_key, {})
            for label, mu in entry.mu.items():
                current[label] = max(current.get(label, 0.0), mu)
        return out

    def totals(self, extra: Mapping[str, float] | None = None) -> tuple[ObserverTotal, ...]:
        """Composed μ and ε per observer class; ``extra`` adds a prospective release."""
        per_release = list(self.release_mu().values())
        if extra is not None:
            per_release.append(_check_mu(extra))
        labels = sorted({label for mus in per_release for label in mus}, key=_label_order)
        totals = []
        for label in labels:
            mus = [mus[label] for mus in per_release if label in mus]
            mu = math.inf if any(math.isinf(m) for m in mus) else compose_mu(mus)
            totals.append(
                ObserverTotal(
                    label=label,
                    mu=mu,
                    epsilon=gaussian_epsilon(mu, self.delta),
                    delta=self.delta,
                    releases=len(mus),
                )
            )
        return tuple(totals)

    def total(self, label: str) -> ObserverTotal:
        for t in self.totals():
            if t.label == label:
                return t
        return ObserverTotal(label, 0.0, 0.0, self.delta, 0)

    def projected_epsilon(self, label: str, mu: Mapping[str, float]) -> float:
        """Total ε against ``label`` if a further release with per-class ``mu`` were made."""
        for t in self.totals(extra=mu):
            if t.label == label:
                return t.epsilon
        return 0.0

    def has_release(self, session_id: str, round_index: int) -> bool:
        return self.release_entry(session_id, round_index) is not None

    def release_entry(self, session_id: str, round_index: int) -> LedgerEntry | None:
        """The release recorded for (session, round), or None (there is at most one)."""
        for entry in self._entries:
            if entry.kind == "release" and entry.release_key == (session_id, round_index):
                return entry
        return None

    def revealed(self, session_id: str) -> dict[int, tuple[frozenset[str], frozenset[str]]]:
        """Per round of ``session_id``: what this node's unmask answers revealed.

        (the union of the dropped sets, the union of the survivor sets) over
        every ``unmask`` entry of the round, pair terms and CAPE pads alike.
        Entries are written before an answer is sent, so this is what a node
        that answered and then restarted must assume the coordinator holds.
        """
        out: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
        for entry in self._entries:
            if entry.kind != "unmask" or entry.session_id != session_id:
                continue
            dropped, survivors = out.get(entry.round_index, (frozenset(), frozenset()))
            out[entry.round_index] = (
                dropped | frozenset(entry.details.get("dropped", ())),
                survivors | frozenset(entry.details.get("survivors", ())),
            )
        return out

    def has_unmask(
        self,
        session_id: str,
        round_index: int,
        *,
        dropped: Sequence[str],
        survivors: Sequence[str],
    ) -> bool:
        """True when an unmask with exactly these dropped and survivor sets is recorded."""
        want = (sorted(dropped), sorted(survivors))
        return any(
            entry.kind == "unmask"
            and entry.release_key == (session_id, round_index)
            and (list(entry.details.get("dropped", ())), list(entry.details.get("survivors", ())))
            == want
            for entry in self._entries
        )

    # -- updates --------------------------------------------------------

    def record_release(
        self,
        *,
        session_id: str,
        round_index: int,
        round_name: str,
        mu: Mapping[str, float],
        manifest_sha256: str,
        tensors: Sequence[str] = (),
    ) -> LedgerEntry:
        """Record that a round's egress left the TRE (once per session and round)."""
        if self.has_release(session_id, round_index):
            raise LedgerError(
                f"round {round_index} of session {session_id} is already in the ledger"
            )
        entry = LedgerEntry(
            kind="release",
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            timestamp=_now(),
            mu=_check_mu(mu),
            details={"manifest_sha256": manifest_sha256, "tensors": list(tensors)},
        )
        self._append(entry)
        return entry

    def record_unmask(
        self,
        *,
        session_id: str,
        round_index: int,
        round_name: str,
        dropped: Sequence[str],
        survivors: Sequence[str],
        mu: Mapping[str, float],
    ) -> LedgerEntry:
        """Record revealed pair terms with ``dropped``; ``mu`` is the release's μ afterwards."""
        if not self.has_release(session_id, round_index):
            raise LedgerError(
                f"cannot record an unmask for round {round_index} of session {session_id}: "
                "the ledger has no release for it"
            )
        entry = LedgerEntry(
            kind="unmask",
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            timestamp=_now(),
            mu=_check_mu(mu),
            details={"dropped": sorted(dropped), "survivors": sorted(survivors)},
        )
        self._append(entry)
        return entry

    def record_secure_sum_unmask(
        self,
        *,
        session_id: str,
        round_index: int,
        round_name: str,
        dropped: Sequence[str],
        survivors: Sequence[str],
    ) -> LedgerEntry:
        """Record CAPE secure-sum pads revealed with ``dropped`` (no μ of its own).

        The pads blind a private Gaussian draw, not data: revealing those with
        D lets the coordinator learn Σ_S ê_k, the sum it publishes anyway. Its
        cost shows in the model round's release, whose CAPE noise is then
        planned among the survivors S only (and refused below the floor). The
        entry keeps the record of what was revealed to whom.
        """
        entry = LedgerEntry(
            kind="unmask",
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            timestamp=_now(),
            details={
                "dropped": sorted(dropped),
                "survivors": sorted(survivors),
                "secure_sum": True,
            },
        )
        self._append(entry)
        return entry

    def record_refusal(
        self,
        *,
        session_id: str,
        round_index: int,
        round_name: str,
        dropped: Sequence[str],
        survivors: Sequence[str],
        reason: str,
    ) -> LedgerEntry:
        """Record a declined unmask request and why (no privacy cost)."""
        entry = LedgerEntry(
            kind="refusal",
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            timestamp=_now(),
            details={
                "dropped": sorted(dropped),
                "survivors": sorted(survivors),
                "reason": reason,
            },
        )
        self._append(entry)
        return entry


def _label_order(label: str) -> tuple[int, int]:
    observer, size = observer_from_label(label)
    return ({"outsider": 0, "coordinator": 1}.get(observer, 2), size)
