"""The per-round egress bundle: everything a TRE output checker inspects before release.

One folder per node and round, ``OUT/egress/round-<r>/`` (docs/design.md §8):

``payload.npy``
    The uint64 fixed-point vector exactly as submitted (``np.save``, little-endian
    ``<u8``, one dimension). Tensors sit back to back in manifest order; word w
    decodes to ``int64(w) / 2^F``.
``values.csv``
    The same numbers decoded to floats for people: ``tensor,index,element,value``
    with ``index`` the flat C-order index inside the tensor and ``element`` the
    readable position (``sxx[2][0]``). Values are written with Python's shortest
    round-trip ``repr`` so the file decodes to the payload bit for bit.
``results.json``
    The ACRO / SACRO output-checking schema (Green et al. 2023, "ACRO: a tool for
    semi-automated statistical disclosure control", SACRO project): a top-level
    ``version`` and ``results`` keyed by output, each with ``uid``, ``status``
    ("review"), ``type`` ("custom"), ``properties``, ``files`` ([{name, sdc}]),
    ``outcome``, ``command``, ``summary``, ``timestamp``, ``comments``,
    ``exception`` and ``fair``; one output per file, so the SACRO viewer can open
    the folder and ACRO's own reader (``acro.record.load_records``, which
    demands its exact version, :data:`ACRO_RESULTS_VERSION`) can load it.
    As in ACRO, ``checksums/<file>.txt`` holds each file's hex SHA-256.
``manifest.json``
    Format ``zerosum-egress`` version 1: session, round, node, fixed-point bits,
    the tensor layout with per-entry noise std σ in the tensor's own units (the
    scaled sums as sent) as an outsider sees it (√(R_kk + σ_res²)), each
    tensor's sensitivity and how it was derived,
    the masking facts (construction, graph, K, collusion profile — never seeds),
    the DP receipt (mechanism, μ/ε/δ per observer class for this release and the
    cumulative ledger totals), SDC evidence (N, residual degrees of freedom) and
    SHA-256 checksums of the other three files, and ``approval_mode``: how the
    node was told to release it — "manual" (it waits for an output checker's
    signed decision, the default) or "auto" (released without one; demos and
    tests). Its own SHA-256 is what a reviewer signs to approve the release.

The un-noised counterpart of each bundle lives in ``OUT/audit/round-<r>/``
(node/egress/audit.py) and never leaves the TRE.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from node.egress.receipt import (
    DPReceipt,
    LayoutError,
    MaskingFacts,
    ObserverRelease,
    SDCEvidence,
    TensorEntry,
    check_layout,
    entries_layout,
    json_number,
)
from node.errors import EgressError, EgressIntegrityError
from node.records.atomic import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_writer,
    json_bytes,
    sha256_file,
)
from noise.fixed_point import FixedPointCodec
from noise.layout import Layout
from noise.layout import payload_sha256 as words_sha256

__all__ = [
    "ACRO_RESULTS_VERSION",
    "EGRESS_FORMAT",
    "EGRESS_VERSION",
    "EgressBundle",
    "EgressError",
    "EgressIntegrityError",
    "egress_folder",
    "load_payload",
]

EGRESS_FORMAT = "zerosum-egress"
EGRESS_VERSION = 1
# The ACRO release whose results.json this bundle writes. ACRO's own reader
# (acro.record.load_records) accepts only its exact version; the SACRO Viewer
# accepts 0.4 and later (sacro/versioning.py compares major.minor).
ACRO_RESULTS_VERSION = "1.0.2"

MANIFEST = "manifest.json"
PAYLOAD = "payload.npy"
VALUES = "values.csv"
RESULTS = "results.json"
CHECKSUMS = "checksums"
APPROVAL = "approval.json"

_U64 = np.dtype("<u8")
# values.csv is made, written and checked this many rows at a time (under 1 MB of
# text): a round of Σxxᵀ at P = 2,641 has 3.5 million rows, some 170 MB.
_CSV_ROWS = 1 << 14


def egress_folder(out: Path, round_index: int) -> Path:
    """``OUT/egress/round-<r>``: what may leave the TRE after approval."""
    return Path(out) / "egress" / f"round-{round_index}"


def _sha256_file(path: Path) -> str:
    return sha256_file(path)


def _csv_field(text: str) -> str:
    """RFC 4180 quoting, only when the field needs it."""
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _element_labels(name: str, shape: tuple[int, ...], start: int, stop: int) -> list[str]:
    """Labels ``sxx[0][0]``, ``sxx[0][1]``, … of flat C-order indices ``start:stop``."""
    if not shape:
        return [name][start:stop]
    if len(shape) == 1:
        return [f"{name}[{i}]" for i in range(start, stop)]
    template = name.replace("{", "{{").replace("}", "}}") + "[{}]" * len(shape)
    index = np.unravel_index(np.arange(start, stop), shape)
    return [template.format(*at) for at in zip(*(axis.tolist() for axis in index), strict=True)]


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The pieces of ``str.split("\\n")`` of the UTF-8 text of ``chunks`` joined, one by one."""
    rest = b""
    for chunk in chunks:
        pieces = (rest + chunk).split(b"\n")
        rest = pieces.pop()
        for piece in pieces:
            yield piece.decode("utf-8", errors="replace")
    yield rest.decode("utf-8", errors="replace")


def _file_blocks(path: Path, size: int = 1 << 22) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while block := handle.read(size):
            yield block


# ---------------------------------------------------------------- the bundle


@dataclass(frozen=True)
class EgressBundle:
    """One node's release for one round, as written to and read from its egress folder."""

    session_id: str
    round_index: int
    round_name: str
    node_id: str
    fixed_point_bits: int
    tensors: tuple[TensorEntry, ...]
    masking: MaskingFacts
    dp: DPReceipt
    sdc: SDCEvidence
    payload: NDArray[np.uint64] = field(repr=False)
    config_hash: str = ""
    created: str = ""
    approval_mode: str = ""  # "manual" or "auto"; "" in bundles written before it was recorded

    def __post_init__(self) -> None:
        if self.approval_mode not in ("", "manual", "auto"):
            raise EgressError(
                f"approval_mode must be 'manual' or 'auto'; got {self.approval_mode!r}"
            )
        payload = np.asarray(self.payload)
        if payload.dtype != np.uint64 or payload.ndim != 1:
            raise EgressError(
                f"the payload must be a one-dimensional uint64 vector; got dtype {payload.dtype} "
                f"with shape {payload.shape}"
            )
        if self.round_index < 0:
            raise EgressError(f"round_index must be >= 0; got {self.round_index}")
        if not 0 < self.fixed_point_bits < 63:
            raise EgressError(f"fixed_point_bits must be in 1..62; got {self.fixed_point_bits}")
        try:
            check_layout(self.tensors, payload.size)
        except LayoutError as exc:
            raise EgressError(str(exc)) from exc

    # -- derived views --------------------------------------------------

    def tensor(self, name: str) -> TensorEntry:
        for entry in self.tensors:
            if entry.name == name:
                return entry
        raise KeyError(f"egress of round {self.round_index} has no tensor {name!r}")

    @property
    def layout(self) -> Layout:
        return entries_layout(self.tensors)

    def decoded(self) -> dict[str, NDArray[np.float64]]:
        """Every tensor decoded to floats, reshaped to its declared shape."""
        return self.layout.decode(self.payload, FixedPointCodec(self.fixed_point_bits))

    @property
    def payload_sha256(self) -> str:
        return words_sha256(self.payload).hex()

    # -- file content ---------------------------------------------------

    def values_csv_chunks(self) -> Iterator[bytes]:
        """``values.csv`` piece by piece: ``tensor,index,element,value`` rows, whole rows each.

        Values in Python's shortest round-trip ``repr``. Made a few tens of
        thousands of rows at a time, so a bundle of millions of values never
        has its text (nor a float copy of its payload) in memory at once.
        """
        codec = FixedPointCodec(self.fixed_point_bits)
        yield b"tensor,index,element,value\n"
        for t in self.tensors:
            name = _csv_field(t.name)
            quote = name != t.name
            for start in range(0, t.size, _CSV_ROWS):
                stop = min(start + _CSV_ROWS, t.size)
                labels = _element_labels(t.name, t.shape, start, stop)
                if quote:
                    labels = [_csv_field(label) for label in labels]
                words = self.payload[t.offset + start : t.offset + stop]
                values = codec.decode(words).tolist()
                rows = zip(range(start, stop), labels, values, strict=True)
                yield "".join(f"{name},{i},{label},{value!r}\n" for i, label, value in rows).encode(
                    "utf-8"
                )

    def _outsider(self) -> ObserverRelease | None:
        try:
            return self.dp.observer("outsider")
        except KeyError:
            return None

    def _sigma_sentence(self) -> str:
        parts = [f"{t.name}: σ={t.sigma:.4g} (Δ={t.sensitivity:.4g})" for t in self.tensors]
        return "Per-entry noise std in each tensor's own units, as sent — " + "; ".join(parts) + "."

    def results_json(self, timestamp: str) -> dict[str, Any]:
        """The ACRO-schema ``results.json``: one "custom" output per released file."""
        outsider = self._outsider()
        if outsider is not None:
            privacy = (
                f"Against an outsider this release is μ={_fmt(outsider.mu)}-GDP, i.e. "
                f"(ε={_fmt(outsider.epsilon)}, δ={outsider.delta:.3g})-DP "
                f"({self.dp.mechanism})."
            )
        else:
            privacy = f"Mechanism: {self.dp.mechanism}."
        where = (
            f"Node {self.node_id!r}, session {self.session_id}, round {self.round_index} "
            f"({self.round_name!r}), N={self.sdc.n_subjects} subjects."
        )
        masking = (
            f"Masking: {self.masking.construction} construction on a {self.masking.graph} graph "
            f"of {self.masking.n_nodes} nodes; masks cancel exactly in the federated sum, "
            f"collusion threshold T={self.masking.collusion_threshold}. These values leave "
            "under a uniform one-time self-mask as well; its 32-byte seed goes to the "
            "coordinator in the round's unmask step, once every surviving node has signed the "
            "same survivor set, and with it the coordinator holds exactly these values."
        )
        exception = (
            "Release requested: these are sums over subjects with calibrated Gaussian noise "
            f"added to every entry, not subject-level data. {privacy} "
            "The noise-free values remain inside the TRE (audit folder)."
        )
        properties = {
            "method": "zerosum federated round",
            "session_id": self.session_id,
            "round_index": self.round_index,
            "round_name": self.round_name,
            "node_id": self.node_id,
            "n_subjects": self.sdc.n_subjects,
            "residual_degrees_of_freedom": self.sdc.residual_degrees_of_freedom,
            "fixed_point_bits": self.fixed_point_bits,
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "sigma": t.sigma} for t in self.tensors
            ],
        }
        if outsider is not None:
            properties["epsilon_outsider"] = json_number(outsider.epsilon)
            properties["delta"] = outsider.delta
        outputs = {
            "noised_values": (
                VALUES,
                "Noised values of every tensor as sent, decoded from fixed point to floats: sums "
                "of values clipped to the public bounds and pre-scaled to [-1, 1], not real "
                "units (zerosum review shows each in years and feature units).",
            ),
            "noised_payload": (
                PAYLOAD,
                "The same noised values in the exact fixed-point form submitted "
                f"(uint64, value = int64(word) / 2^{self.fixed_point_bits}).",
            ),
            "release_manifest": (
                MANIFEST,
                "Release manifest: tensor layout, noise std per tensor, DP receipt, "
                "masking facts, SDC evidence and checksums.",
            ),
        }
        results: dict[str, Any] = {}
        for uid, (filename, what) in outputs.items():
            results[uid] = {
                "uid": uid,
                "status": "review",
                "type": "custom",
                "properties": properties,
                "files": [{"name": filename, "sdc": {}}],
                "outcome": {},
                "command": (
                    f"zerosum node --node-id {self.node_id} "
                    f"(round {self.round_index} '{self.round_name}')"
                ),
                "summary": f"review; noised aggregate statistics, N={self.sdc.n_subjects}",
                "timestamp": timestamp,
                "comments": [what, where, self._sigma_sentence(), privacy, masking],
                "exception": exception,
                # ACRO 1.x records a FAIR description per output; its custom
                # outputs carry an empty one, as these do.
                "fair": {},
            }
        return {"version": ACRO_RESULTS_VERSION, "results": results}

    def manifest_json(self, checksums: Mapping[str, str]) -> dict[str, Any]:
        return {
            "format": EGRESS_FORMAT,
            "version": EGRESS_VERSION,
            "session_id": self.session_id,
            "config_hash": self.config_hash,
            "round_index": self.round_index,
            "round_name": self.round_name,
            "node_id": self.node_id,
            "created": self.created,
            "fixed_point_bits": self.fixed_point_bits,
            "payload": {
                "file": PAYLOAD,
                "dtype": "uint64",
                "byte_order": "little",
                "elements": int(self.payload.size),
                "sha256": self.payload_sha256,
            },
            "tensors": [t.to_json() for t in self.tensors],
            "masking": self.masking.to_json(),
            "dp_receipt": self.dp.to_json(),
            "sdc": self.sdc.to_json(),
            **({"approval_mode": self.approval_mode} if self.approval_mode else {}),
            "checksums": dict(checksums),
        }

    # -- disk -----------------------------------------------------------

    def write(self, out: Path, *, overwrite: bool = False) -> Path:
        """Write the bundle to ``OUT/egress/round-<r>/`` and return that folder.

        Files are written atomically, the manifest last (it holds the other
        files' checksums), then ``checksums/``. An existing bundle is kept
        unless ``overwrite`` is set; overwriting removes any stale approval.
        """
        folder = egress_folder(out, self.round_index)
        if (folder / MANIFEST).exists():
            if not overwrite:
                raise EgressError(
                    f"{folder} already holds an egress bundle; refusing to replace a release "
                    "record (move it away or start with a fresh output folder)"
                )
            (folder / APPROVAL).unlink(missing_ok=True)
            shutil.rmtree(folder / CHECKSUMS, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        created = self.created or datetime.now(UTC).isoformat()
        # The payload and values.csv are streamed to disk, hashed on the way:
        # neither their bytes nor the text of values.csv is held whole.
        checksums: dict[str, str] = {}
        with atomic_writer(folder / PAYLOAD) as handle:
            np.save(handle, np.ascontiguousarray(self.payload, dtype=_U64), allow_pickle=False)
        checksums[PAYLOAD] = handle.hexdigest()
        with atomic_writer(folder / VALUES) as handle:
            for chunk in self.values_csv_chunks():
                handle.write(chunk)
        checksums[VALUES] = handle.hexdigest()
        results = json_bytes(self.results_json(created))
        atomic_write_bytes(folder / RESULTS, results)
        checksums[RESULTS] = hashlib.sha256(results).hexdigest()
        bundle = self if self.created else replace(self, created=created)
        manifest = atomic_write_json(folder / MANIFEST, bundle.manifest_json(checksums))
        checksums[MANIFEST] = hashlib.sha256(manifest).hexdigest()
        for name, digest in checksums.items():
            atomic_write_bytes(folder / CHECKSUMS / f"{name}.txt", digest.encode("ascii"))
        return folder

    @staticmethod
    def complete_after_crash(folder: Path) -> list[str]:
        """Finish what a crash during :meth:`write` left undone; the files written.

        :meth:`write` writes ``checksums/`` after the manifest, each file
        through a temporary ``.<name>.<random>.tmp`` renamed into place, so a
        node killed in between leaves a bundle that verifies but lacks ACRO's
        records, or holds a temporary file that is no part of it. This writes
        each missing record (the SHA-256 the manifest declares, only when the
        file on disk has it; call after :meth:`verify`) and removes the
        temporary files.
        """
        folder = Path(folder)
        manifest_bytes = (folder / MANIFEST).read_bytes()
        declared = dict(json.loads(manifest_bytes.decode("utf-8")).get("checksums", {}))
        declared[MANIFEST] = hashlib.sha256(manifest_bytes).hexdigest()
        # Only the node's own temporary files: an output checker may be writing
        # approval.json (through its own .approval.json.*.tmp) at this moment.
        strays = [s for name in (MANIFEST, PAYLOAD, VALUES, RESULTS)
                  for s in folder.glob(f".{name}.*.tmp")]  # fmt: skip
        for stray in [*strays, *(folder / CHECKSUMS).glob(".*.tmp")]:
            stray.unlink(missing_ok=True)
        written = []
        for name, digest in declared.items():
            record = folder / CHECKSUMS / f"{name}.txt"
            if record.exists() or _sha256_file(folder / name) != digest:
                continue
            atomic_write_bytes(record, str(digest).encode("ascii"))
            written.append(name)
        return written

    @classmethod
    def read(cls, folder: Path) -> EgressBundle:
        """Parse a bundle folder (manifest + payload); ``verify`` checks the rest."""
        folder = Path(folder)
        try:
            manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise EgressError(f"{folder} has no {MANIFEST}") from exc
        except json.JSONDecodeError as exc:
            raise EgressError(f"{folder / MANIFEST} is not valid JSON: {exc}") from exc
        if manifest.get("format") != EGRESS_FORMAT or manifest.get("version") != EGRESS_VERSION:
            raise EgressError(
                f"{folder / MANIFEST} is not a {EGRESS_FORMAT} version {EGRESS_VERSION} manifest "
                f"(format={manifest.get('format')!r}, version={manifest.get('version')!r})"
            )
        payload = load_payload(folder / PAYLOAD)
        try:
            return cls(
                session_id=str(manifest["session_id"]),
                round_index=int(manifest["round_index"]),
                round_name=str(manifest["round_name"]),
                node_id=str(manifest["node_id"]),
                fixed_point_bits=int(manifest["fixed_point_bits"]),
                tensors=tuple(TensorEntry.from_json(t) for t in manifest["tensors"]),
                masking=MaskingFacts.from_json(manifest["masking"]),
                dp=DPReceipt.from_json(manifest["dp_receipt"]),
                sdc=SDCEvidence.from_json(manifest["sdc"]),
                payload=payload,
                config_hash=str(manifest.get("config_hash", "")),
                created=str(manifest.get("created", "")),
                approval_mode=str(manifest.get("approval_mode", "")),
            )
        except KeyError as exc:
            raise EgressError(f"{folder / MANIFEST} lacks the field {exc.args[0]!r}") from exc
        except EgressError:
            raise
        except LayoutError as exc:
            raise EgressError(f"{folder / MANIFEST}: {exc}") from exc

    @staticmethod
    def manifest_sha256(folder: Path) -> str:
        """Hex SHA-256 of ``manifest.json`` as stored: the digest a reviewer signs."""
        return _sha256_file(Path(folder) / MANIFEST)

    @staticmethod
    def verify(folder: Path) -> EgressBundle:
        """Re-check an egress folder; return the bundle or raise listing every problem.

        Checks: the manifest parses; the layout is contiguous and fills the
        payload; each file's SHA-256 equals the manifest's (and ACRO's
        ``checksums/`` where present); the payload's word digest matches;
        ``values.csv`` decodes to the payload bit for bit; ``results.json``
        follows the ACRO schema with one "review" output per file.
        """
        folder = Path(folder)
        problems: list[str] = []
        try:
            bundle = EgressBundle.read(folder)
        except EgressError as exc:
            raise EgressIntegrityError(folder, [str(exc)]) from exc
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        problems.extend(_check_file_digests(folder, manifest.get("checksums", {})))
        problems.extend(_check_payload_claims(manifest.get("payload", {}), bundle))
        if (folder / VALUES).exists():
            problems.extend(_check_values_csv(folder / VALUES, bundle))
        if (folder / RESULTS).exists():
            problems.extend(_check_results_json(folder, folder / RESULTS))
        if problems:
            raise EgressIntegrityError(folder, problems)
        return bundle


def _check_file_digests(folder: Path, declared: dict[str, str]) -> list[str]:
    """Each file's SHA-256 against the manifest's, and against ACRO's ``checksums/``."""
    problems: list[str] = []
    for name in (PAYLOAD, VALUES, RESULTS):
        path = folder / name
        if not path.exists():
            problems.append(f"{name} is missing")
            continue
        actual = _sha256_file(path)
        if declared.get(name) != actual:
            problems.append(
                f"{name} has SHA-256 {actual} but the manifest declares {declared.get(name)}"
            )
    checksum_dir = folder / CHECKSUMS
    if checksum_dir.is_dir():
        for record in sorted(checksum_dir.glob("*.txt")):
            target = folder / record.name.removesuffix(".txt")
            if not target.exists():
                problems.append(f"{CHECKSUMS}/{record.name} names a missing file")
            elif record.read_text(encoding="ascii").strip() != _sha256_file(target):
                problems.append(f"{target.name} does not match {CHECKSUMS}/{record.name}")
    return problems


def _check_payload_claims(declared: dict[str, object], bundle: EgressBundle) -> list[str]:
    """The payload's word digest and length against the manifest's."""
    problems: list[str] = []
    if declared.get("sha256") != bundle.payload_sha256:
        problems.append("the payload words do not match the manifest's payload sha256")
    if declared.get("elements") != int(bundle.payload.size):
        problems.append(
            f"the payload holds {bundle.payload.size} words but the manifest declares "
            f"{declared.get('elements')}"
        )
    return problems


def _fmt(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.4g}"


def load_payload(path: Path) -> NDArray[np.uint64]:
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError as exc:
        raise EgressError(f"{path} is missing") from exc
    except ValueError as exc:
        raise EgressError(f"{path} is not a valid .npy file: {exc}") from exc
    if array.dtype != np.uint64 or array.ndim != 1:
        raise EgressError(
            f"{path} must hold a one-dimensional uint64 vector; got dtype {array.dtype} "
            f"with shape {array.shape}"
        )
    return np.ascontiguousarray(array, dtype=np.uint64)


def _check_values_csv(path: Path, bundle: EgressBundle) -> list[str]:
    """values.csv must be exactly what the payload decodes to (the first difference is named).

    Compared piece by piece with what the payload gives; only a file that
    differs is read again, line by line, to name where.
    """
    with path.open("rb") as handle:
        for expected in bundle.values_csv_chunks():
            if handle.read(len(expected)) != expected:
                break
        else:
            if not handle.read(1):
                return []
    counts = [0, 0]
    pairs = itertools.zip_longest(_lines(_file_blocks(path)), _lines(bundle.values_csv_chunks()))
    for line, reference in pairs:
        counts[0] += line is not None
        counts[1] += reference is not None
        if line is not None and reference is not None and line != reference:
            return [f"{VALUES} line {counts[0]} reads {line!r} but the payload gives {reference!r}"]
    return [f"{VALUES} has {counts[0] - 1} lines; the payload gives {counts[1] - 1}"]


def _check_results_json(folder: Path, path: Path) -> list[str]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        return [f"{RESULTS} is not valid JSON: {exc}"]
    problems: list[str] = []
    version = str(document.get("version", ""))
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
        if (major, minor) < (0, 4):
            problems.append(f"{RESULTS} has ACRO version {version}; 0.4 or later is required")
    except ValueError:
        problems.append(f"{RESULTS} has an unreadable version {version!r}")
    results = document.get("results")
    if not isinstance(results, dict) or not results:
        return [*problems, f"{RESULTS} lists no outputs"]
    required = (
        "uid",
        "status",
        "type",
        "properties",
        "files",
        "outcome",
        "command",
        "summary",
        "timestamp",
        "comments",
        "exception",
    )
    named: set[str] = set()
    for key, output in results.items():
        missing = [f for f in required if f not in output]
        if missing:
            problems.append(f"{RESULTS} output {key!r} lacks {', '.join(missing)}")
            continue
        if output["status"] != "review":
            problems.append(f"{RESULTS} output {key!r} has status {output['status']!r}")
        if len(output["files"]) != 1:
            problems.append(f"{RESULTS} output {key!r} must name exactly one file")
            continue
        name = output["files"][0].get("name", "")
        named.add(name)
        if not (folder / name).exists():
            problems.append(f"{RESULTS} output {key!r} names a missing file {name!r}")
    for needed in (PAYLOAD, VALUES, MANIFEST):
        if needed not in named:
            problems.append(f"{RESULTS} has no output for {needed}")
    return problems
