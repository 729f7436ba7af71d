"""A node's private CAPE material on disk, so that a restarted node resumes a CAPE session.

Under the CAPE construction (Imtiaz, Mohammadi & Sarwate 2019, arXiv
1904.10059; docs/design.md §6) node k's egress of a model round is

    q(x_k) + e_k + q(r_k),   e_k = q(ê_k) − share_k(S),   S = Σ_j q(ê_j),

where q(ê_k) is its private quantised Gaussian draw, S is learnt through a
secure sum among the participants, and q(r_k) is optional residual noise. A
rerun after a dropout must reuse q(ê_k) and q(r_k): the coordinator sees both
attempts, and with the same draws their difference is share_k(S) − share_k(S'),
which it computes itself, whereas fresh draws would hand it two independently
noised copies of q(x_k). Those values used to live only in memory, so a node
restarted after a crash could not go on once it had sent anything. This module
keeps them inside the TRE, next to the un-noised audit records:

``OUT/audit/cape-<round name>/``  (mode 0700)
    ``draws.npy``
        q(ê_k), one uint64 word per payload entry, in the round's tensor layout.
    ``residual.npy``
        q(r_k), once drawn (zeros when residual noise is off).
    ``sum-round-<r>.npy``
        S as published for CAPE-sum round r (the latest attempt only).
    ``cape.json``
        Format ``zerosum-cape-material`` version 1: the session id, node id and
        federation config hash it belongs to, the model round's name and tensor
        layout, the participants τ² was planned for, and for each vector file
        its SHA-256 (for S also the round index and the participants it covers).

Every file is written atomically (node/records/atomic.py) and private to its owner
(0600, like the session key of node/records/session_state.py); a file readable by
others is refused on load, as ``ssh`` refuses such a private key. ``cape.json``
is written last and is the commit point: only the vector files it names, with
the digests it records, are ever read back, so a crash between two writes
leaves the previous complete state. The node saves each piece *before*
anything derived from it leaves the TRE — the draws before its CAPE-sum share
is uploaded, S before the model round's egress is computed from it, the
residual before the egress bundle is written — so whatever a restarted node
finds committed covers everything it sent.

These vectors are secrets. With them and the egress anyone strips this node's
CAPE noise; and q(ê_k) with the published S gives Σ_{j≠k} q(ê_j), the other
nodes' draws summed, which with two nodes is the other node's draw itself.
The privacy report counts q(ê_k) as known to coalitions that include node k
only, so keeping the folder after the session would make every later reader of
the TRE's output folder (staff, a backup, a breach) such a coalition member.
Their one use is a restart, so they are deleted when the session completes at
this node, together with the session key (:meth:`CapeStore.discard`), when the
session has ended without it, and when a new session begins. The audit record
``OUT/audit/round-<r>/`` stays: the reviewer's noise check needs only the
egress and the un-noised values (egress − audit = e_k + q(r_k)).
"""

from __future__ import annotations

import io
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from node.errors import CapeStateError
from node.records.atomic import (
    ExposedFileError,
    atomic_write_bytes,
    atomic_write_json,
    read_private_bytes,
)
from noise.layout import Layout, LayoutError, payload_sha256

__all__ = [
    "CAPE_FORMAT",
    "CAPE_VERSION",
    "CapeMaterial",
    "CapeStateError",
    "CapeStore",
    "CapeSum",
]

CAPE_FORMAT = "zerosum-cape-material"
CAPE_VERSION = 1
RECORD = "cape.json"
DRAWS = "draws.npy"
RESIDUAL = "residual.npy"
FILE_MODE = 0o600
FOLDER_MODE = 0o700
_PREFIX = "cape-"
_U64 = np.dtype("<u8")
# Round names become folder names: letters, digits and "._-", never a path.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SUM_FILE = re.compile(r"sum-round-(0|[1-9][0-9]*)\.npy")

U64 = NDArray[np.uint64]


@dataclass(frozen=True)
class CapeSum:
    """The published CAPE secure sum S of round ``round_index`` over ``participants``."""

    round_index: int
    participants: tuple[str, ...]
    total: U64


@dataclass(frozen=True)
class CapeMaterial:
    """Everything a node needs to send its CAPE shares and egress of one model round again."""

    session_id: str
    node_id: str
    config_hash: bytes
    round_name: str
    layout: Layout
    planned: tuple[str, ...]
    draws: U64
    residual: U64 | None = None
    sum: CapeSum | None = None
    # The CAPE-sum round index the draws were made for: a rerun draws afresh.
    drawn_for: int | None = None

    def check(self) -> None:
        """Raise :class:`CapeStateError` unless the pieces fit together (see the fields)."""
        size = self.layout.size
        vectors = {"draws": self.draws, "residual": self.residual}
        if self.sum is not None:
            vectors["sum"] = self.sum.total
        for name, vector in vectors.items():
            if vector is None:
                continue
            array = np.asarray(vector)
            if array.dtype != np.uint64 or array.shape != (size,):
                raise CapeStateError(
                    f"the CAPE {name} vector of round {self.round_name!r} must be {size} uint64 "
                    f"words (its tensor layout); got dtype {array.dtype} with shape {array.shape}"
                )
        if self.node_id not in self.planned:
            raise CapeStateError(
                f"node {self.node_id!r} is not among the planned CAPE participants "
                f"{list(self.planned)} of round {self.round_name!r}"
            )
        if self.sum is not None:
            if self.sum.round_index < 0:
                raise CapeStateError(
                    f"the CAPE sum of round {self.round_name!r} names round index "
                    f"{self.sum.round_index}; it must be >= 0"
                )
            covered = set(self.sum.participants)
            if self.node_id not in covered or not covered <= set(self.planned):
                raise CapeStateError(
                    f"the CAPE sum of round {self.round_name!r} covers "
                    f"{sorted(self.sum.participants)}, which must include node {self.node_id!r} "
                    f"and lie within the planned participants {list(self.planned)}"
                )


def _npy_bytes(vector: U64) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(vector, dtype=_U64), allow_pickle=False)
    return buffer.getvalue()


class CapeStore:
    """The CAPE material saved in the output folder ``out`` (see the module docstring)."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.root = self.out / "audit"

    def folder(self, round_name: str) -> Path:
        """``OUT/audit/cape-<round name>``; ValueError for a name that is not a plain word."""
        if not _SAFE_NAME.fullmatch(round_name):
            raise ValueError(
                f"round name {round_name!r} cannot name a folder: use letters, digits, '_', "
                "'.' and '-' only, not starting with '.' or '-'"
            )
        return self.root / f"{_PREFIX}{round_name}"

    def folders(self) -> list[Path]:
        """Every saved CAPE folder (``OUT/audit/cape-*``), sorted."""
        return sorted(p for p in self.root.glob(f"{_PREFIX}*") if p.is_dir())

    # ------------------------------------------------------------ writing

    def save(self, material: CapeMaterial) -> Path:
        """Write ``material`` (vector files first, ``cape.json`` last); returns the folder.

        Raises :class:`CapeStateError` for material whose pieces do not fit
        together (nothing is written then).
        """
        material.check()
        folder = self.folder(material.round_name)
        folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        folder.chmod(FOLDER_MODE)
        record: dict[str, Any] = {
            "format": CAPE_FORMAT,
            "version": CAPE_VERSION,
            "notice": (
                "Inside the TRE only: this node's private CAPE noise, which strips the noise "
                "from its egress. Never release this folder; it is deleted when the session "
                "completes."
            ),
            "session_id": material.session_id,
            "node_id": material.node_id,
            "config_hash": material.config_hash.hex(),
            "round_name": material.round_name,
            "tensors": [
                {"name": s.name, "shape": list(s.shape), "offset": s.offset, "size": s.size}
                for s in material.layout
            ],
            "planned": list(material.planned),
            "drawn_for": material.drawn_for,
            "draws": self._write_vector(folder / DRAWS, material.draws),
            "residual": None,
            "sum": None,
        }
        if material.residual is not None:
            record["residual"] = self._write_vector(folder / RESIDUAL, material.residual)
        keep = {DRAWS, RESIDUAL, RECORD}
        if material.sum is not None:
            name = f"sum-round-{material.sum.round_index}.npy"
            keep.add(name)
            record["sum"] = {
                **self._write_vector(folder / name, material.sum.total),
                "round_index": material.sum.round_index,
                "participants": list(material.sum.participants),
            }
        atomic_write_json(folder / RECORD, record, mode=FILE_MODE)
        # Only now, with the new record committed, is an earlier attempt's S unreferenced.
        for stale in folder.glob("sum-round-*.npy"):
            if stale.name not in keep:
                stale.unlink(missing_ok=True)
        return folder

    @staticmethod
    def _write_vector(path: Path, vector: U64) -> dict[str, str]:
        atomic_write_bytes(path, _npy_bytes(vector), mode=FILE_MODE)
        return {"file": path.name, "sha256": payload_sha256(vector).hex()}

    def discard(self) -> None:
        """Delete every saved CAPE folder, half-written files included (no-op when none)."""
        for folder in self.folders():
            shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------ reading

    def load(
        self,
        round_name: str,
        *,
        session_id: str,
        node_id: str,
        config_hash: bytes,
        layout: Layout | None = None,
    ) -> CapeMaterial | None:
        """The material committed for ``round_name``, checked; None when none was committed.

        A folder without ``cape.json`` holds nothing committed (the node
        stopped before it sent anything drawn there). Raises
        :class:`CapeStateError` naming the file and the problem when the record
        or a vector it names is unreadable, readable by others, does not match
        its recorded digest or shape, or belongs to another session, node,
        federation config, round or (when given) tensor layout.
        """
        folder = self.folder(round_name)
        path = folder / RECORD
        data = _read_json(path)
        if data is None:
            return None
        if data.get("format") != CAPE_FORMAT or data.get("version") != CAPE_VERSION:
            raise CapeStateError(
                f"{path} is not a {CAPE_FORMAT} version {CAPE_VERSION} record "
                f"(format={data.get('format')!r}, version={data.get('version')!r})"
            )
        mine = {
            "session_id": session_id,
            "node_id": node_id,
            "config_hash": bytes(config_hash).hex(),
            "round_name": round_name,
        }
        for field, expected in mine.items():
            if data.get(field) != expected:
                raise CapeStateError(
                    f"{path} records {field} {data.get(field)!r}, not this node's {expected!r}; "
                    "it is not the CAPE material of this round"
                )
        saved_layout = _parse_layout(data.get("tensors"), path)
        size = saved_layout.size
        if layout is not None and layout != saved_layout:
            raise CapeStateError(
                f"{path} was saved for tensors {saved_layout}, but round "
                f"{round_name!r} has tensors {layout} now"
            )
        planned = _names(data.get("planned"), path, "planned")
        drawn_for = data.get("drawn_for")
        if drawn_for is not None and (
            not isinstance(drawn_for, int) or isinstance(drawn_for, bool)
        ):
            raise CapeStateError(f"{path}: field 'drawn_for' must be an integer or null")
        draws = _read_vector(folder, data.get("draws"), size, path, "draws")
        residual = None
        if data.get("residual") is not None:
            residual = _read_vector(folder, data.get("residual"), size, path, "residual")
        cape_sum = _read_sum(folder, data.get("sum"), size, path)
        material = CapeMaterial(
            session_id=session_id,
            node_id=node_id,
            config_hash=bytes(config_hash),
            round_name=round_name,
            layout=saved_layout,
            planned=planned,
            draws=draws,
            residual=residual,
            sum=cape_sum,
            drawn_for=drawn_for,
        )
        try:
            material.check()
        except CapeStateError as error:
            raise CapeStateError(f"{path}: {error}") from None
        return material


def _read_sum(folder: Path, entry: object, size: int, path: Path) -> CapeSum | None:
    """The record's ``sum`` entry (round, participants, the summed vector), or None."""
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise CapeStateError(f"{path}: field 'sum' must be an object or null")
    index = entry.get("round_index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise CapeStateError(f"{path}: field 'sum.round_index' must be an integer")
    file = entry.get("file")
    if file != f"sum-round-{index}.npy":
        raise CapeStateError(
            f"{path}: field 'sum.file' must be 'sum-round-{index}.npy'; got {file!r}"
        )
    return CapeSum(
        round_index=index,
        participants=_names(entry.get("participants"), path, "sum.participants"),
        total=_read_vector(folder, entry, size, path, "sum"),
    )


def _open_private(path: Path) -> bytes | None:
    """The bytes of ``path`` (None when it does not exist), refusing a file others can read."""
    try:
        return read_private_bytes(path)
    except ExposedFileError as error:
        raise CapeStateError(
            f"{path} is accessible to other users (mode {error.mode:04o}); CAPE material strips "
            f"this node's noise and must be private to its owner: chmod 600 {path}"
        ) from None
    except OSError as error:
        raise CapeStateError(f"{path} cannot be opened: {error.strerror}") from None


def _read_json(path: Path) -> dict[str, Any] | None:
    raw = _open_private(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CapeStateError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise CapeStateError(f"{path} must hold a JSON object; found {type(data).__name__}")
    return data


def _names(value: Any, path: Path, field: str) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(n, str) and n for n in value)
        or len(set(value)) != len(value)
    ):
        raise CapeStateError(
            f"{path}: field {field!r} must be a non-empty list of distinct node ids; got {value!r}"
        )
    return tuple(value)


def _parse_layout(value: Any, path: Path) -> Layout:
    try:
        return Layout.from_json(value)
    except LayoutError as error:
        raise CapeStateError(f"{path}: field 'tensors' is not a tensor layout: {error}") from None


def _read_vector(folder: Path, entry: Any, size: int, record: Path, what: str) -> U64:
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise CapeStateError(f"{record}: field {what!r} must name a file and its sha256")
    file = entry.get("file")
    allowed = {"draws": DRAWS, "residual": RESIDUAL}.get(what)
    if not isinstance(file, str) or (
        file != allowed if allowed is not None else not _SUM_FILE.fullmatch(file)
    ):
        raise CapeStateError(f"{record}: field {what!r} names file {file!r}, not its own")
    path = folder / file
    raw = _open_private(path)
    if raw is None:
        raise CapeStateError(f"{path} is missing, but {record} records it")
    try:
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise CapeStateError(f"{path} is not a valid .npy file ({error})") from None
    if array.dtype != _U64 or array.shape != (size,):
        raise CapeStateError(
            f"{path} must hold {size} little-endian uint64 words (the round's tensor layout); "
            f"found dtype {array.dtype} with shape {array.shape}"
        )
    vector = np.ascontiguousarray(array, dtype=np.uint64)
    if payload_sha256(vector).hex() != entry["sha256"]:
        raise CapeStateError(
            f"{path} has sha256 {payload_sha256(vector).hex()[:16]}…, but {record} records "
            f"{str(entry['sha256'])[:16]}…; the file was changed or damaged"
        )
    return vector
