"""The delta summary's egress bundle: what an output checker inspects before it leaves.

One folder per node and session, ``OUT/egress/delta-summary/``, laid out like a
round's bundle (``node.egress.bundle``) so the same review, approval and viewers work:

``values.csv``
    ``statistic,value,units,epsilon,sensitivity,scale,meaning``: each released
    number in real units (years), the ε and Laplace scale of the query it
    comes from (or "post-processing"), and a sentence on what it is.
``results.json``
    ACRO's schema (one "custom" output per file, ``fair`` included), so ACRO's
    reader and the SACRO Viewer open the folder; ``checksums/<file>.txt`` as ACRO
    writes them.
``manifest.json``
    Format ``zerosum-delta-summary`` version 1: session, node, the model's
    SHA-256 (which model the deltas come from), the public delta range, N₀,
    each query's sensitivity, ε and scale with its derivation, the statistics,
    the receipt (this release's ε and the node's composed totals after it),
    the SDC evidence (N ≥ N₀ only: the exact N is not DP, so no file of the
    bundle holds it) and the SHA-256 of the other files. Its own SHA-256 is
    what a checker signs.

The exact N, the exact values, the histogram before and after noise and the
count of clipped deltas stay in ``OUT/audit/delta-summary/audit.json``.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from bounded.files import read_limited
from bounded.nesting import parse_json
from node.egress.bundle import ACRO_RESULTS_VERSION
from node.errors import EgressError, EgressIntegrityError
from node.plans.deltab.delta_summary import DeltaSummary, statistic_meaning
from node.records.atomic import atomic_write_bytes, atomic_write_json, json_bytes
from node.records.ledger import ObserverTotal

__all__ = [
    "SUMMARY_FORMAT",
    "SUMMARY_ROUND",
    "SUMMARY_ROUND_NAME",
    "SummaryBundle",
    "audit_folder",
    "summary_folder",
]

SUMMARY_FORMAT: Final = "zerosum-delta-summary"
SUMMARY_VERSION: Final = 1
# The ledger keys releases by (session, round index, payload); the summary is
# no protocol round, so it takes an index no round can have.
SUMMARY_ROUND: Final = -1
SUMMARY_ROUND_NAME: Final = "delta-summary"
MANIFEST: Final = "manifest.json"
VALUES: Final = "values.csv"
RESULTS: Final = "results.json"
CHECKSUMS: Final = "checksums"
APPROVAL: Final = "approval.json"
AUDIT: Final = "audit.json"
_HEADER: Final = ("statistic", "value", "units", "epsilon", "sensitivity", "scale", "meaning")


# Every file of a summary bundle is a few kilobytes; anything larger is not one.
_FILE_BYTES: Final = 4 << 20


def _read(path: Path) -> bytes:
    """A bundle file, bounded and regular-only (bounded.files)."""
    return read_limited(path, _FILE_BYTES, what="delta-summary file")


def summary_folder(out: Path) -> Path:
    return Path(out) / "egress" / SUMMARY_ROUND_NAME


def audit_folder(out: Path) -> Path:
    return Path(out) / "audit" / SUMMARY_ROUND_NAME


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _statistic_rows(summary: DeltaSummary) -> list[dict[str, Any]]:
    by_query = {q.name: q for q in summary.queries}
    rows = []
    for name, value in summary.released.items():
        query = by_query.get(name)
        rows.append(
            {
                "name": name,
                "value": value,
                "units": "years²" if name in ("variance", "second_moment") else "years",
                "epsilon": query.epsilon if query else None,
                "sensitivity": query.sensitivity if query else None,
                "scale": query.scale if query else None,
                "from": name
                if query
                else ("mean, second_moment" if name in ("sd", "variance") else "histogram"),
                "meaning": statistic_meaning(name),
            }
        )
    return rows


@dataclass(frozen=True)
class SummaryBundle:
    """A written (or read) delta-summary bundle: its manifest and folder."""

    folder: Path
    manifest: Mapping[str, Any]

    @property
    def node_id(self) -> str:
        return str(self.manifest["node_id"])

    @property
    def config_hash(self) -> str:
        return str(self.manifest.get("config_hash", ""))

    @property
    def session_id(self) -> str:
        return str(self.manifest["session_id"])

    @property
    def epsilon(self) -> float:
        return float(self.manifest["epsilon"])

    @property
    def statistics(self) -> list[Mapping[str, Any]]:
        return list(self.manifest["statistics"])

    @property
    def values_sha256(self) -> str:
        return str(self.manifest["checksums"][VALUES])

    # -- writing ----------------------------------------------------------

    @classmethod
    def values_of(cls, summary: DeltaSummary) -> bytes:
        """The ``values.csv`` bytes the bundle of ``summary`` holds (its release identity)."""
        return cls.values_csv(_statistic_rows(summary))

    @staticmethod
    def values_csv(rows: Sequence[Mapping[str, Any]]) -> bytes:
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(_HEADER)
        for row in rows:
            writer.writerow(
                [
                    row["name"],
                    repr(float(row["value"])),
                    row["units"],
                    "post-processing" if row["epsilon"] is None else repr(row["epsilon"]),
                    "" if row["sensitivity"] is None else repr(row["sensitivity"]),
                    "" if row["scale"] is None else repr(row["scale"]),
                    row["meaning"],
                ]
            )
        return text.getvalue().encode("utf-8")

    @classmethod
    def write(
        cls,
        out: Path,
        summary: DeltaSummary,
        *,
        session_id: str,
        node_id: str,
        config_hash: str,
        model_sha256: str,
        totals: Sequence[ObserverTotal],
    ) -> SummaryBundle:
        """Write the bundle (manifest last, then checksums) and the audit record."""
        folder = summary_folder(out)
        if (folder / MANIFEST).exists():
            raise EgressError(
                f"{folder} already holds a delta summary; refusing to replace a release record"
            )
        folder.mkdir(parents=True, exist_ok=True)
        created = datetime.now(UTC).isoformat()
        rows = _statistic_rows(summary)
        settings = summary.settings
        values = cls.values_csv(rows)
        # No exact N in the bundle: it leaves the TRE whole, and N is not DP (the
        # noised histogram's total is the DP estimate). Only N ≥ N₀, public.
        where = f"node {node_id!r}, session {session_id}, N ≥ {summary.n_floor} subjects"
        privacy = (
            f"Laplace mechanism, ε = {settings.epsilon:g} in all (ε/3 each for the mean, the "
            "second moment and the histogram the quantiles are read from); neighbouring "
            "cohorts differ by one subject."
        )
        outputs = {
            "delta_summary": (VALUES, "Noised mean, SD and quantiles of the brain-age delta."),
            "release_manifest": (MANIFEST, "Manifest: sensitivities, scales, receipt, checksums."),
        }
        properties = {
            "method": "zerosum delta summary",
            "session_id": session_id,
            "node_id": node_id,
            "n_at_least": summary.n_floor,
            "epsilon": settings.epsilon,
        }
        results = {
            uid: {
                "uid": uid,
                "status": "review",
                "type": "custom",
                "properties": properties,
                "files": [{"name": name, "sdc": {}}],
                "outcome": {},
                "command": f"zerosum node --node-id {node_id} (delta summary)",
                "summary": f"review; Laplace-noised delta summary, N ≥ {summary.n_floor}",
                "timestamp": created,
                "comments": [what, where, privacy],
                "exception": (
                    "Release requested: summary statistics of model residuals with Laplace "
                    f"noise, not subject-level data. {privacy}"
                ),
                "fair": {},
            }
            for uid, (name, what) in outputs.items()
        }
        files = {
            VALUES: values,
            RESULTS: json_bytes({"version": ACRO_RESULTS_VERSION, "results": results}),
        }
        for name, data in files.items():
            atomic_write_bytes(folder / name, data)
        checksums = {name: _sha256(data) for name, data in files.items()}
        manifest = {
            "format": SUMMARY_FORMAT,
            "version": SUMMARY_VERSION,
            "session_id": session_id,
            "config_hash": config_hash,
            "node_id": node_id,
            "created": created,
            "model_sha256": model_sha256,
            "mechanism": "laplace",
            "sampler": (
                "discrete Laplace on a published grid (Canonne, Kamath & Steinke 2020), exact "
                "integer sampling from the node's private keyed stream"
            ),
            "delta_sampler": 0.0,
            "adjacency": "add or remove one subject",
            "epsilon": settings.epsilon,
            "delta_range": [settings.delta_low, settings.delta_high],
            "bins": settings.bins,
            "quantiles": list(settings.quantiles),
            "n_floor": summary.n_floor,
            "queries": [
                {
                    "name": q.name,
                    "sensitivity": q.sensitivity,
                    "epsilon": q.epsilon,
                    "scale": q.scale,
                    "grid": q.grid,
                    "grid_sensitivity": q.grid_sensitivity,
                    "derivation": q.derivation,
                }
                for q in summary.queries
            ],
            "statistics": rows,
            "dp_receipt": {
                "release_epsilon": settings.epsilon,
                "totals_after": [
                    {
                        "observer": t.label,
                        "epsilon": t.epsilon if t.epsilon != float("inf") else "inf",
                        "releases": t.releases,
                    }
                    for t in totals
                ],
            },
            "sdc": {
                "n_at_least": summary.n_floor,
                "n_subjects": "withheld (not DP); a node releases nothing below N₀",
            },
            "checksums": checksums,
        }
        manifest_bytes = atomic_write_json(folder / MANIFEST, manifest)
        checksums_all = {**checksums, MANIFEST: _sha256(manifest_bytes)}
        for name, digest in checksums_all.items():
            atomic_write_bytes(folder / CHECKSUMS / f"{name}.txt", digest.encode("ascii"))
        atomic_write_json(
            audit_folder(out) / AUDIT,
            {
                "format": "zerosum-delta-summary-audit",
                "version": 1,
                "session_id": session_id,
                "node_id": node_id,
                "manifest_sha256": checksums_all[MANIFEST],
                "n_subjects": summary.n_subjects,
                "exact": dict(summary.exact),
                "released": dict(summary.released),
                "clipped": summary.clipped,
                "edges": [float(e) for e in summary.edges],
                "exact_histogram": list(summary.exact_histogram),
                "noised_histogram": list(summary.noised_histogram),
            },
        )
        return cls(folder, manifest)

    # -- reading ----------------------------------------------------------

    @staticmethod
    def is_summary(folder: Path) -> bool:
        """True when ``folder``'s manifest says it is a delta-summary bundle."""
        try:
            document = parse_json(_read(Path(folder) / MANIFEST).decode("utf-8"), what=MANIFEST)
        except (OSError, ValueError):
            return False
        return isinstance(document, dict) and document.get("format") == SUMMARY_FORMAT

    @staticmethod
    def manifest_sha256(folder: Path) -> str:
        return _sha256(_read(Path(folder) / MANIFEST))

    @classmethod
    def verify(cls, folder: Path) -> SummaryBundle:  # noqa: C901, PLR0912 - every problem of the folder, collected in the manifest's order
        """Re-check the folder; the bundle, or EgressIntegrityError listing every problem."""
        folder = Path(folder)
        problems: list[str] = []
        try:
            manifest = parse_json(_read(folder / MANIFEST).decode("utf-8"), what=MANIFEST)
        except (OSError, ValueError) as error:
            raise EgressIntegrityError(folder, [f"{MANIFEST} cannot be read: {error}"]) from None
        if not isinstance(manifest, dict) or manifest.get("format") != SUMMARY_FORMAT:
            raise EgressIntegrityError(folder, [f"{MANIFEST} is not a {SUMMARY_FORMAT} manifest"])
        if manifest.get("version") != SUMMARY_VERSION:
            problems.append(f"{MANIFEST} has version {manifest.get('version')!r}; expected 1")
        listed = dict(manifest.get("checksums", {}))
        for name in (VALUES, RESULTS):
            if name not in listed:
                problems.append(f"{MANIFEST} lists no checksum for {name}")

        def contents(path: Path) -> bytes | None:
            try:
                return _read(path)
            except OSError as error:  # missing, not a regular file, or too large
                problems.append(str(error) if path.exists() else f"{path.name} is missing")
                return None

        for name, digest in listed.items():
            data = contents(folder / name)
            if data is not None and _sha256(data) != digest:
                problems.append(f"{name} does not match its SHA-256 in {MANIFEST}")
        for name, digest in {**listed, MANIFEST: cls.manifest_sha256(folder)}.items():
            record = folder / CHECKSUMS / f"{name}.txt"
            data = contents(record) if record.exists() else None
            if data is None or data.decode("ascii", "replace").strip() != digest:
                problems.append(f"{CHECKSUMS}/{name}.txt is missing or differs")
        try:
            expected = SummaryBundle.values_csv(list(manifest.get("statistics", [])))
        except (KeyError, TypeError, ValueError):
            problems.append(f"{MANIFEST} lists malformed statistics")
        else:
            values = contents(folder / VALUES) if (folder / VALUES).is_file() else None
            if values is not None and values != expected:
                problems.append(f"{VALUES} does not hold the manifest's statistics")
        if problems:
            raise EgressIntegrityError(folder, problems)
        return cls(folder, manifest)
