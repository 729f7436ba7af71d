"""The node's privacy ledger: every release and unmask correction, and what they add up to.

A TRE must be able to say, at any time, how much the data it holds has
disclosed in total. The ledger is one JSON file per node, kept in the node's
state folder across every session it takes part in (``STATE/ledger.json``,
``node.records.state_folder``), with one entry per event:

* ``release`` — an egress left the TRE; it records μ per observer class
  ("outsider"; "colluders:m" for an outsider who also holds the secrets of m
  colluding nodes; "coordinator"; "coalition:m" for the coordinator plus m
  pooling nodes) for that release, and the SHA-256 of the payload it sent;
* ``unmask`` — the node revealed its pair terms with dropped nodes for a round;
  the coordinator then holds more of the node's noise than before, so the
  entry records the release's new, larger μ per observer class. Its
  ``dropped`` list is everything revealed for that round so far (a node only
  answers a request whose dropped set contains every earlier one). For a CAPE
  secure-sum round the revealed values are one-time pads, the entry has no μ
  and ``details.secure_sum`` is true (a ``SecureSumUnmask``);
* ``refusal`` — the node declined an unmask request, with its reason (no
  privacy cost, kept for the record);
* ``laplace`` — a pure ε-DP release in the clear (a delta summary,
  ``node.plans.deltab.delta_summary``): every observer class sees it, so its ε adds to
  every class's total.

Each event is its own frozen class (``node.records.ledger_entry``: ``Release``,
``UnmaskReveal``, ``SecureSumUnmask``, ``Refusal``, ``LaplaceRelease``); the
file keeps the JSON form above (``kind``, ``mu`` and ``details``).

A release is identified by what was released: (session id, round index,
payload SHA-256). The same bytes sent again (a restart resubmits its bundle
as it was) are one release; different bytes for the same session and round
are a second release and cost again. An unmask entry names the payload of the
release it corrects (the latest release of its round when it was written);
an entry of a version-1 ledger, which names none, corrects every release of
its round, so that no cost is ever dropped.

Totals compose exactly in μ-GDP: a release's cost is its largest recorded μ
(the release itself or a later correction), and r releases compose to
μ = sqrt(Σ μ_r²) (Dong, Roth & Su 2022, JRSS-B, Corollary 3.3); (ε, δ) is read
off the exact Gaussian tradeoff at the ledger's δ (Balle & Wang 2018). The
ε of the Laplace releases is added on top (basic composition of an
(ε₁, δ)-DP and an ε₂-DP mechanism is (ε₁ + ε₂, δ)-DP). An
unbounded μ (the coordinator learns an exact sum when residual DP is off)
makes that class's total unbounded, written "inf".

Every update rewrites the whole file atomically (temporary file, fsync,
rename), so a crash leaves either the old or the new ledger, never a torn one;
``copies`` (the session's ``OUT/ledger.json``) are rewritten after it, for the
session's record. Version 2 is written; version 1 (release entries without a
payload digest, keyed by their manifest digest instead) is read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bounded.files import LocalFileError, read_limited_text
from bounded.nesting import NestingError, parse_json
from node.egress.receipt import json_number
from node.errors import LedgerError
from node.records.atomic import atomic_write_json
from node.records.ledger_entry import (
    LaplaceRelease,
    LedgerEntry,
    NoiseFacts,
    ObserverTotal,
    Refusal,
    Release,
    ReleaseKey,
    SecureSumUnmask,
    UnmaskReveal,
    check_digest,
    check_mu,
    entry_from_json,
    label_order,
    observer_of,
)
from noise.accounting import compose_mu, gaussian_epsilon

# A ledger gains a few hundred bytes per release; 64 MiB is decades of them.
_LEDGER_BYTES = 64 << 20

__all__ = [
    "LEDGER_FORMAT",
    "LEDGER_VERSION",
    "READABLE_VERSIONS",
    "LaplaceRelease",
    "LedgerEntry",
    "LedgerError",
    "NoiseFacts",
    "ObserverTotal",
    "PrivacyLedger",
    "Refusal",
    "Release",
    "ReleaseKey",
    "SecureSumUnmask",
    "UnmaskReveal",
    "observer_of",
]

LEDGER_FORMAT = "zerosum-ledger"
LEDGER_VERSION = 2
READABLE_VERSIONS = (1, 2)
COMPOSITION = (
    "μ-GDP composition: μ_total = sqrt(Σ μ_release²), each release at its largest recorded μ "
    "(Dong, Roth & Su 2022); ε from the exact Gaussian tradeoff at δ (Balle & Wang 2018), "
    "plus Σ ε of the Laplace releases (basic composition)"
)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class PrivacyLedger:
    """The privacy ledger of one node, bound to a file.

    ``delta`` is the δ at which composed totals are converted to ε (the
    policy's per-release δ). Each ``record_*`` call appends one entry and
    saves the file, then its ``copies``; an entry the file did not take
    leaves both memory and file unchanged.
    """

    def __init__(
        self, path: Path, node_id: str, delta: float, *, copies: Sequence[Path] = ()
    ) -> None:
        if not 0.0 < delta < 1.0:
            raise LedgerError(f"ledger δ must be strictly between 0 and 1; got {delta!r}")
        self.path = Path(path)
        self.node_id = node_id
        self.delta = float(delta)
        self.copies = tuple(Path(c) for c in copies if Path(c) != Path(path))
        self._entries: list[LedgerEntry] = []

    # -- persistence ----------------------------------------------------

    @classmethod
    def open(
        cls, path: Path, node_id: str, delta: float, *, copies: Sequence[Path] = ()
    ) -> PrivacyLedger:
        """Load the ledger at ``path`` (an empty one when the file does not exist yet)."""
        ledger = cls(path, node_id, delta, copies=copies)
        path = Path(path)
        if not path.exists():
            return ledger
        try:
            text = read_limited_text(path, _LEDGER_BYTES, what="privacy ledger")
        except LocalFileError as exc:
            raise LedgerError(str(exc)) from None
        try:
            document = parse_json(text, what=f"privacy ledger {path}")
        except NestingError as exc:
            raise LedgerError(str(exc)) from None
        except json.JSONDecodeError as exc:
            raise LedgerError(f"privacy ledger {path} is not valid JSON: {exc}") from exc
        if not isinstance(document, dict) or document.get("format") != LEDGER_FORMAT:
            raise LedgerError(f"{path} is not a {LEDGER_FORMAT} file")
        if document.get("version") not in READABLE_VERSIONS:
            raise LedgerError(
                f"{path} has ledger version {document.get('version')!r}; "
                f"this program reads versions {', '.join(map(str, READABLE_VERSIONS))}"
            )
        if document.get("node_id") != node_id:
            raise LedgerError(
                f"privacy ledger {path} belongs to node {document.get('node_id')!r}, "
                f"not {node_id!r}"
            )
        entries = document.get("entries", [])
        if not isinstance(entries, list):
            raise LedgerError(f"privacy ledger {path}: 'entries' must be a list")
        ledger._entries = [entry_from_json(e) for e in entries]
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
        document = self.to_json()
        atomic_write_json(self.path, document)
        for copy in self.copies:
            atomic_write_json(copy, document)

    def _append(self, entry: LedgerEntry) -> None:
        self._entries.append(entry)
        try:
            document = self.to_json()
            atomic_write_json(self.path, document)
        except BaseException:
            self._entries.pop()
            raise
        # The entry is on disk in the ledger itself; a copy that cannot be
        # written is reported, but the entry stays (dropping it would let the
        # next save erase it from the ledger).
        for copy in self.copies:
            atomic_write_json(copy, document)

    def merge(self, other: PrivacyLedger) -> int:
        """Add every entry of ``other`` this ledger lacks (an import); how many were added.

        Entries are compared whole, so importing a copy of this ledger adds
        nothing and importing the same file twice adds its entries once.
        """
        if other.node_id != self.node_id:
            raise LedgerError(
                f"privacy ledger {other.path} belongs to node {other.node_id!r}, "
                f"not {self.node_id!r}"
            )
        have = {json.dumps(e.to_json(), sort_keys=True) for e in self._entries}
        new = [e for e in other.entries if json.dumps(e.to_json(), sort_keys=True) not in have]
        if new:
            before = list(self._entries)
            self._entries.extend(new)
            try:
                self.save()
            except BaseException:
                self._entries = before
                raise
        return len(new)

    # -- queries --------------------------------------------------------

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        return tuple(self._entries)

    def session_ids(self) -> frozenset[str]:
        """Every session this ledger holds an entry of."""
        return frozenset(e.session_id for e in self._entries)

    def release_mu(self) -> dict[ReleaseKey, dict[str, float]]:
        """Per release (session, round, payload): the largest μ recorded per observer class.

        An unmask entry raises the release whose payload it names; one that
        names none (version 1) raises every release of its round, and one
        whose release is missing counts as a release of its own: a cost is
        never dropped.
        """
        out: dict[ReleaseKey, dict[str, float]] = {}
        # The releases of each round, in the order they were first recorded.
        by_round: dict[tuple[str, int], list[ReleaseKey]] = {}

        def add(key: ReleaseKey, mu: Mapping[str, float]) -> None:
            if key not in out:
                out[key] = {}
                by_round.setdefault(key[:2], []).append(key)
            _raise_to(out[key], mu)

        for entry in self._entries:
            if isinstance(entry, Release):
                add(entry.release_key, entry.mu)
        for entry in self._entries:
            # A refusal costs nothing, nor does revealing CAPE secure-sum pads
            # (a SecureSumUnmask, for a round that released no egress).
            if not isinstance(entry, UnmaskReveal) or not entry.mu:
                continue
            digest = entry.payload_sha256
            targets = [
                key for key in by_round.get(entry.round_key, ()) if not digest or key[2] == digest
            ]
            if not targets:
                targets = [(entry.session_id, entry.round_index, digest or "unmask")]
            for key in targets:
                add(key, entry.mu)
        return out

    def laplace_releases(self) -> dict[ReleaseKey, float]:
        """Per Laplace release (session, round, payload): its ε (the same bytes count once)."""
        out: dict[ReleaseKey, float] = {}
        for entry in self._entries:
            if isinstance(entry, LaplaceRelease):
                out[entry.release_key] = max(out.get(entry.release_key, 0.0), entry.epsilon)
        return out

    def totals(
        self,
        extra: Mapping[str, float] | None = None,
        *,
        extras: Sequence[Mapping[str, float]] = (),
        laplace: Sequence[float] = (),
        unmask: tuple[str, int, Mapping[str, float]] | None = None,
    ) -> tuple[ObserverTotal, ...]:
        """Composed μ and ε per observer class.

        ``extra``/``extras`` add prospective Gaussian releases (μ per class),
        ``laplace`` prospective Laplace releases (ε, seen by every class), and
        ``unmask`` = (session id, round index, μ) a prospective unmask answer:
        it raises the round's latest release to that μ, as
        :meth:`record_unmask` would.
        """
        by_release = self.release_mu()
        if unmask is not None:
            session_id, round_index, raised = unmask
            release = self.release_entry(session_id, round_index)
            key = (
                release.release_key if release is not None else (session_id, round_index, "unmask")
            )
            _raise_to(by_release.setdefault(key, {}), check_mu(raised))
        per_release = list(by_release.values())
        prospective = ([extra] if extra is not None else []) + list(extras)
        per_release.extend(check_mu(mu) for mu in prospective)
        pure = [*self.laplace_releases().values(), *(float(e) for e in laplace)]
        labels = sorted({label for mus in per_release for label in mus}, key=label_order)
        if pure and not labels:
            labels = ["outsider"]
        pure_epsilon = math.fsum(pure)
        totals = []
        for label in labels:
            mus = [mus[label] for mus in per_release if label in mus]
            mu = math.inf if any(math.isinf(m) for m in mus) else compose_mu(mus)
            totals.append(
                ObserverTotal(
                    observer=observer_of(label),
                    mu=mu,
                    epsilon=gaussian_epsilon(mu, self.delta) + pure_epsilon,
                    delta=self.delta,
                    releases=len(mus) + len(pure),
                    laplace_epsilon=pure_epsilon,
                )
            )
        return tuple(totals)

    def total(self, label: str) -> ObserverTotal:
        for t in self.totals():
            if t.label == label:
                return t
        return ObserverTotal(observer_of(label), 0.0, 0.0, self.delta, 0)

    def projected_epsilon(self, label: str, mu: Mapping[str, float]) -> float:
        """Total ε against ``label`` if a further release with per-class ``mu`` were made."""
        for t in self.totals(extra=mu):
            if t.label == label:
                return t.epsilon
        return 0.0

    def has_release(
        self, session_id: str, round_index: int, payload_sha256: str | None = None
    ) -> bool:
        """True when a release of (session, round) is recorded (of that payload, if given)."""
        return any(
            payload_sha256 is None or e.payload_sha256 == payload_sha256
            for e in self.release_entries(session_id, round_index)
        )

    def release_entries(self, session_id: str, round_index: int) -> tuple[Release, ...]:
        """Every release recorded for (session, round), oldest first."""
        return tuple(
            e
            for e in self._entries
            if isinstance(e, Release) and e.round_key == (session_id, round_index)
        )

    def release_entry(
        self, session_id: str, round_index: int, payload_sha256: str | None = None
    ) -> Release | None:
        """The latest release recorded for (session, round) (of that payload, if given)."""
        found = [
            e
            for e in self.release_entries(session_id, round_index)
            if payload_sha256 is None or e.payload_sha256 == payload_sha256
        ]
        return found[-1] if found else None

    def recorded_release(
        self, session_id: str, round_index: int, *, payload_sha256: str, manifest_sha256: str
    ) -> Release | None:
        """The entry that already records this release, or None.

        That is the entry of the same payload, or a version-1 entry (no
        payload digest) of the same round whose manifest digest is this
        bundle's: a bundle is never recomputed, so the same manifest is the
        same release.
        """
        for entry in reversed(self.release_entries(session_id, round_index)):
            if entry.payload_sha256 == payload_sha256 or (
                not entry.payload_sha256 and entry.manifest_sha256 == manifest_sha256
            ):
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
            if not isinstance(entry, UnmaskReveal | SecureSumUnmask):
                continue
            if entry.session_id != session_id:
                continue
            dropped, survivors = out.get(entry.round_index, (frozenset(), frozenset()))
            out[entry.round_index] = (
                dropped | frozenset(entry.dropped),
                survivors | frozenset(entry.survivors),
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
        want = (tuple(sorted(dropped)), tuple(sorted(survivors)))
        return any(
            isinstance(entry, UnmaskReveal | SecureSumUnmask)
            and entry.round_key == (session_id, round_index)
            and (entry.dropped, entry.survivors) == want
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
        payload_sha256: str,
        tensors: Sequence[str] = (),
        noise: NoiseFacts | None = None,
    ) -> Release:
        """Record that a round's egress left the TRE, before its bytes leave.

        ``noise`` records how the noise was drawn (mechanism, δ_sampler,
        δ_discretisation) beside the μ per class.

        The same payload of the same session and round is one release (also
        when a version-1 entry records it by its manifest): its entry is
        returned and nothing is added. A different payload for the same
        session and round is a second release.
        """
        digest = check_digest(payload_sha256, "payload_sha256")
        existing = self.recorded_release(
            session_id, round_index, payload_sha256=digest, manifest_sha256=manifest_sha256
        )
        if existing is not None:
            return existing
        entry = Release(
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            timestamp=_now(),
            mu=mu,
            payload_sha256=digest,
            manifest_sha256=manifest_sha256,
            tensors=tuple(tensors),
            noise=noise,
        )
        self._append(entry)
        return entry

    def record_laplace(
        self,
        *,
        session_id: str,
        round_index: int,
        round_name: str,
        epsilon: float,
        manifest_sha256: str,
        payload_sha256: str,
        statistics: Sequence[str] = (),
    ) -> LaplaceRelease:
        """Record a pure ε-DP release (a delta summary) before it leaves; once per payload."""
        digest = check_digest(payload_sha256, "payload_sha256")
        number = float(epsilon)
        if not (math.isfinite(number) and number > 0):
            raise LedgerError(f"a Laplace release needs a finite ε > 0; got {epsilon!r}")
        for found in self._entries:
            if isinstance(found, LaplaceRelease) and found.release_key == (
                session_id,
                round_index,
                digest,
            ):
                return found
        entry = LaplaceRelease(
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            timestamp=_now(),
            epsilon=number,
            payload_sha256=digest,
            manifest_sha256=manifest_sha256,
            statistics=tuple(statistics),
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
    ) -> UnmaskReveal:
        """Record revealed pair terms with ``dropped``; ``mu`` is the release's μ afterwards.

        The entry names the payload of the round's latest release (the one
        this node sent in this process or resubmitted after a restart).
        """
        release = self.release_entry(session_id, round_index)
        if release is None:
            raise LedgerError(
                f"cannot record an unmask for round {round_index} of session {session_id}: "
                "the ledger has no release for it"
            )
        entry = UnmaskReveal(
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            timestamp=_now(),
            dropped=tuple(dropped),
            survivors=tuple(survivors),
            mu=mu,
            payload_sha256=release.payload_sha256,
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
    ) -> SecureSumUnmask:
        """Record CAPE secure-sum pads revealed with ``dropped`` (no μ of its own).

        The pads blind a private Gaussian draw, not data: revealing those with
        D lets the coordinator learn Σ_S ê_k, the sum it publishes anyway. Its
        cost shows in the model round's release, whose CAPE noise is then
        planned among the survivors S only (and refused below the floor). The
        entry keeps the record of what was revealed to whom.
        """
        entry = SecureSumUnmask(
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            timestamp=_now(),
            dropped=tuple(dropped),
            survivors=tuple(survivors),
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
    ) -> Refusal:
        """Record a declined unmask request and why (no privacy cost)."""
        entry = Refusal(
            session_id=session_id,
            round_index=round_index,
            round_name=round_name,
            timestamp=_now(),
            dropped=tuple(dropped),
            survivors=tuple(survivors),
            reason=reason,
        )
        self._append(entry)
        return entry


def _raise_to(current: dict[str, float], mu: Mapping[str, float]) -> None:
    for label, value in mu.items():
        current[label] = max(current.get(label, 0.0), value)
