"""The audit record of a round: the un-noised fixed-point vector, kept inside the TRE.

``OUT/audit/round-<r>/payload.npy`` holds the node's contribution *before*
masking and residual noise, in exactly the layout of the round's egress, and
``audit.json`` the per-tensor counts of values clipped to the public bounds
and the number of subjects they are out of (SDC facts that must not leave
the TRE). Subtracting it from the egress payload leaves the node's mask plus
residual noise, which lets a reviewer confirm that noise of the declared scale
is really present (docs/design.md §8), and summing every node's audit payload
gives the same exact aggregate as summing their egresses when residual noise
is off (the masks cancel, Σ_k m_k = 0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from node.egress.bundle import EgressBundle, EgressError, load_payload
from node.egress.receipt import TensorEntry, check_layout, entries_layout
from node.records.atomic import atomic_write_json, atomic_writer
from noise.fixed_point import FixedPointCodec
from noise.layout import payload_sha256

__all__ = [
    "AUDIT_FORMAT",
    "AuditRecord",
    "TensorNoise",
    "audit_folder",
    "noise_evidence",
    "read_audit",
    "write_audit",
]

AUDIT_FORMAT = "zerosum-audit"
AUDIT = "audit.json"
PAYLOAD = "payload.npy"
_U64 = np.dtype("<u8")


def audit_folder(out: Path, round_index: int) -> Path:
    """``OUT/audit/round-<r>``: the un-noised record that stays inside the TRE."""
    return Path(out) / "audit" / f"round-{round_index}"


@dataclass(frozen=True)
class AuditRecord:
    """The un-noised fixed-point vector of a round and what was clipped; never leaves the TRE."""

    session_id: str
    round_index: int
    round_name: str
    node_id: str
    fixed_point_bits: int
    tensors: tuple[TensorEntry, ...]
    payload: NDArray[np.uint64] = field(repr=False)
    clipped: Mapping[str, int] = field(default_factory=dict)
    egress_payload_sha256: str = ""
    subjects: int | None = None  # the subjects the clipped counts are out of (N used)

    def decoded(self) -> dict[str, NDArray[np.float64]]:
        return entries_layout(self.tensors).decode(
            self.payload, FixedPointCodec(self.fixed_point_bits)
        )


def write_audit(out: Path, record: AuditRecord) -> Path:
    """Write ``OUT/audit/round-<r>/payload.npy`` and ``audit.json``; returns the folder."""
    check_layout(record.tensors, int(np.asarray(record.payload).size))
    folder = audit_folder(out, record.round_index)
    with atomic_writer(folder / PAYLOAD) as handle:
        np.save(handle, np.ascontiguousarray(record.payload, dtype=_U64), allow_pickle=False)
    atomic_write_json(
        folder / AUDIT,
        {
            "format": AUDIT_FORMAT,
            "version": 1,
            "notice": "Inside the TRE only: un-noised values. Never release this folder.",
            "session_id": record.session_id,
            "round_index": record.round_index,
            "round_name": record.round_name,
            "node_id": record.node_id,
            "fixed_point_bits": record.fixed_point_bits,
            "tensors": [t.to_json() for t in record.tensors],
            "clipped": {name: int(n) for name, n in record.clipped.items()},
            **({"subjects": int(record.subjects)} if record.subjects is not None else {}),
            "payload_sha256": payload_sha256(record.payload).hex(),
            "egress_payload_sha256": record.egress_payload_sha256,
        },
    )
    return folder


def read_audit(out: Path, round_index: int) -> AuditRecord:
    """Read back the audit record of a round (layout checked against the payload)."""
    folder = audit_folder(out, round_index)
    try:
        meta = json.loads((folder / AUDIT).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise EgressError(f"{folder} has no {AUDIT}") from exc
    if meta.get("format") != AUDIT_FORMAT:
        raise EgressError(f"{folder / AUDIT} is not a {AUDIT_FORMAT} record")
    payload = load_payload(folder / PAYLOAD)
    tensors = tuple(TensorEntry.from_json(t) for t in meta["tensors"])
    check_layout(tensors, payload.size)
    if meta.get("payload_sha256") != payload_sha256(payload).hex():
        raise EgressError(f"{folder / PAYLOAD} does not match the digest in {AUDIT}")
    return AuditRecord(
        session_id=str(meta["session_id"]),
        round_index=int(meta["round_index"]),
        round_name=str(meta["round_name"]),
        node_id=str(meta["node_id"]),
        fixed_point_bits=int(meta["fixed_point_bits"]),
        tensors=tensors,
        payload=payload,
        clipped={str(k): int(v) for k, v in meta["clipped"].items()},
        egress_payload_sha256=str(meta.get("egress_payload_sha256", "")),
        subjects=int(meta["subjects"]) if isinstance(meta.get("subjects"), int) else None,
    )


@dataclass(frozen=True)
class TensorNoise:
    """Noise actually present on one tensor of an egress, against what the manifest declares."""

    name: str
    entries: int
    declared_sigma: float
    empirical_std: float  # root mean square of (egress − audit), decoded

    @property
    def ratio(self) -> float:
        """empirical / declared; near 1 for a tensor with many entries."""
        return self.empirical_std / self.declared_sigma if self.declared_sigma > 0 else math.inf


def noise_evidence(
    bundle: EgressBundle, record: AuditRecord
) -> tuple[tuple[TensorNoise, ...], float]:
    """Noise found per tensor in ``bundle`` against the un-noised ``record``, and pooled.

    egress − audit (modulo 2^64, read as signed) is exactly the node's mask plus
    residual noise. For every tensor the root mean square of that difference
    estimates the per-entry std; the pooled ratio sqrt(mean over all entries of
    (noise/σ_t)²) is about 1 when the declared noise is really there (with n
    entries its relative standard error is about 1/sqrt(2n)).
    """

    if entries_layout(record.tensors) != bundle.layout:
        raise EgressError(
            f"the audit record of round {record.round_index} has another layout than its egress"
        )
    if record.fixed_point_bits != bundle.fixed_point_bits:
        raise EgressError("the audit record and the egress use different fixed-point scales")
    noise = FixedPointCodec(bundle.fixed_point_bits).decode(bundle.payload - record.payload)
    rows = []
    squares = 0.0
    count = 0
    for t in bundle.tensors:
        part = noise[t.offset : t.offset + t.size]
        rms = float(np.sqrt(np.mean(part * part))) if t.size else 0.0
        rows.append(TensorNoise(t.name, t.size, t.sigma, rms))
        if t.sigma > 0 and t.size:
            squares += float(np.sum((part / t.sigma) ** 2))
            count += t.size
    pooled = math.sqrt(squares / count) if count else 0.0
    return tuple(rows), pooled
