"""Egress bundles of real-study size: values.csv made, written and checked in pieces.

A round of Σxxᵀ at P = 2,641 releases 3.5 million values; its values.csv is
some 170 MB of text. These tests pin the bytes of the streamed file to the
one-piece rendering the bundle format defines, show that tampering far into
the file is still named by line, and bound the memory a bundle's write and
verification take (a tracemalloc peak, not a timing).
"""

from __future__ import annotations

import itertools
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from node.egress import bundle as egress
from node.egress.audit import AuditRecord, read_audit, write_audit
from node.egress.bundle import EgressBundle, EgressIntegrityError
from node.egress.receipt import DPReceipt, MaskingFacts, ObserverRelease, SDCEvidence, TensorEntry
from noise.fixed_point import FixedPointCodec

BITS = 32


def _bundle(shapes: dict[str, tuple[int, ...]], seed: int = 3) -> EgressBundle:
    entries, offset = [], 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        entries.append(TensorEntry(name, shape, offset, size, 1.0, 1.0, "test tensor"))
        offset += size
    values = np.random.default_rng(seed).normal(0.0, 50.0, size=offset)
    payload = np.round(values * 2.0**BITS).astype(np.int64).view(np.uint64)
    return EgressBundle(
        session_id="5f" * 16,
        round_index=0,
        round_name="sums",
        node_id="alpha",
        fixed_point_bits=BITS,
        tensors=tuple(entries),
        masking=MaskingFacts("pairwise", "complete", 3, 1, (0.70710678,), False),
        dp=DPReceipt(
            delta=1e-6,
            release=(ObserverRelease("outsider", 0, 0.5, 1.0, 1e-6),),
            cumulative=(ObserverRelease("outsider", 0, 0.5, 1.0, 1e-6),),
            releases_in_ledger=1,
            calibration="equal μ share per tensor",
        ),
        sdc=SDCEvidence(n_subjects=150, residual_degrees_of_freedom=146),
        payload=payload,
        config_hash="ab" * 32,
    )


def _one_piece_csv(bundle: EgressBundle) -> bytes:
    """values.csv as the format defines it, rendered whole (the reference)."""

    def field(text: str) -> str:
        return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\r\n') else text

    flat = FixedPointCodec(bundle.fixed_point_bits).decode(bundle.payload).tolist()
    lines = ["tensor,index,element,value"]
    for t in bundle.tensors:
        axes = [[f"[{i}]" for i in range(n)] for n in t.shape]
        labels = [t.name + "".join(c) for c in itertools.product(*axes)] if t.shape else [t.name]
        for i, (label, value) in enumerate(
            zip(labels, flat[t.offset : t.offset + t.size], strict=True)
        ):
            lines.append(f"{field(t.name)},{i},{field(label)},{value!r}")
    return ("\n".join(lines) + "\n").encode("utf-8")


SHAPES = {
    "n": (),
    "sum_x": (7,),
    "sum_xx": (70_001,),  # more than one piece of values.csv
    "odd:name/2": (3, 2),
    "cube": (2, 3, 4),
    "empty": (0,),
}


@pytest.mark.parametrize("rows", [1, 5, 1 << 16])
def test_streamed_values_csv_is_the_one_piece_rendering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    monkeypatch.setattr(egress, "_CSV_ROWS", rows)
    shapes = SHAPES if rows > 1 else {k: v for k, v in SHAPES.items() if k != "sum_xx"}
    bundle = _bundle(shapes)
    folder = bundle.write(tmp_path)
    assert (folder / "values.csv").read_bytes() == _one_piece_csv(bundle)
    assert np.array_equal(EgressBundle.verify(folder).payload, bundle.payload)


def test_a_changed_value_deep_in_values_csv_is_named_by_line(tmp_path: Path) -> None:
    bundle = _bundle(SHAPES)
    folder = bundle.write(tmp_path)
    path = folder / "values.csv"
    lines = path.read_bytes().split(b"\n")
    number = 1 + 1 + 7 + 68_000  # header, n, sum_x, then sum_xx[67999]
    original = lines[number - 1].decode()
    name, index, label, value = original.split(",")
    lines[number - 1] = f"{name},{index},{label},{float(value) + 1.0!r}".encode()
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(EgressIntegrityError) as caught:
        EgressBundle.verify(folder)
    assert f"values.csv line {number} reads" in str(caught.value)
    assert repr(original) in str(caught.value)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ("truncate", "values.csv line 70003 reads '' but the payload gives 'sum_xx,70000,"),
        ("extend", "values.csv has 70004 lines; the payload gives 70003"),
    ],
)
def test_values_csv_of_another_length_is_named(tmp_path: Path, change: str, problem: str) -> None:
    bundle = _bundle({"n": (), "sum_xx": (70_001,)})
    folder = bundle.write(tmp_path)
    path = folder / "values.csv"
    text = path.read_bytes()
    path.write_bytes(text[: text.rindex(b"sum_xx,70000")] if change == "truncate" else text + b"\n")
    with pytest.raises(EgressIntegrityError) as caught:
        EgressBundle.verify(folder)
    assert problem in str(caught.value)


@pytest.mark.slow
def test_writing_and_verifying_a_large_bundle_holds_no_whole_copy(tmp_path: Path) -> None:
    # 400,000 values (P ≈ 900): 3.2 MB of payload, about 20 MB of values.csv.
    # Holding the text whole (as a string and as bytes) would take over 40 MB,
    # its rows as a list of strings more; pieces of 16,384 rows take a few MB.
    bundle = _bundle({"n": (), "sum_x": (900,), "sum_xx": (399_099,)})
    payload_bytes = bundle.payload.nbytes
    tracemalloc.start()
    try:
        folder = bundle.write(tmp_path)
        write_audit(
            tmp_path,
            AuditRecord(
                session_id=bundle.session_id,
                round_index=0,
                round_name="sums",
                node_id="alpha",
                fixed_point_bits=BITS,
                tensors=bundle.tensors,
                payload=bundle.payload,
            ),
        )
        checked = EgressBundle.verify(folder)
        record = read_audit(tmp_path, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(checked.payload, bundle.payload)
    assert np.array_equal(record.payload, bundle.payload)
    size = (folder / "values.csv").stat().st_size
    assert size > 16 << 20
    # Two payload-sized vectors (the one read back and its decoded piece) plus
    # a piece of text: far below the file itself.
    assert peak < 2 * payload_bytes + (8 << 20), (peak, size)
