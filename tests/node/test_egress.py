"""Egress bundles: written, read back, verified, and every kind of tampering caught."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from node.egress.audit import AuditRecord, audit_folder, read_audit, write_audit
from node.egress.bundle import (
    ACRO_RESULTS_VERSION,
    EGRESS_FORMAT,
    EgressBundle,
    EgressError,
    EgressIntegrityError,
    egress_folder,
)
from node.egress.receipt import (
    DPReceipt,
    MaskingFacts,
    ObserverRelease,
    SDCEvidence,
    TensorEntry,
    check_layout,
)
from noise.fixed_point import FixedPointCodec
from noise.layout import payload_sha256

BITS = 32


def _tensors() -> tuple[TensorEntry, ...]:
    return (
        TensorEntry("n", (), 0, 1, 0.5, 1.0, "one subject changes the count by 1"),
        TensorEntry("sum_x", (3,), 1, 3, 2.0, 4.0, "|x| <= 4 per feature", (1.5,)),
        TensorEntry("sxx", (3, 3), 4, 9, 8.0, 16.0, "||x xᵀ||_F <= 16", (6.0,)),
    )


def _bundle(payload: np.ndarray | None = None, **changes: object) -> EgressBundle:
    rng = np.random.default_rng(7)
    if payload is None:
        values = rng.normal(0.0, 3.0, size=13)
        payload = (np.round(values * 2.0**BITS).astype(np.int64)).view(np.uint64)
    fields: dict[str, object] = {
        "session_id": "5f" * 16,
        "round_index": 1,
        "round_name": "scatter",
        "node_id": "alpha",
        "fixed_point_bits": BITS,
        "tensors": _tensors(),
        "masking": MaskingFacts("pairwise", "complete", 3, 1, (0.70710678,), False),
        "dp": DPReceipt(
            delta=1e-6,
            release=(
                ObserverRelease("outsider", 0, 0.5, 1.0, 1e-6),
                ObserverRelease("coordinator", 0, math.inf, math.inf, 1e-6),
                ObserverRelease("coalition", 1, math.inf, math.inf, 1e-6),
            ),
            cumulative=(ObserverRelease("outsider", 0, 0.7071, 1.5, 1e-6),),
            releases_in_ledger=2,
            calibration="equal μ share per tensor",
        ),
        "sdc": SDCEvidence(n_subjects=150, residual_degrees_of_freedom=146),
        "payload": payload,
        "config_hash": "ab" * 32,
    }
    fields.update(changes)
    return EgressBundle(**fields)  # type: ignore[arg-type]


def test_write_then_read_round_trips_every_field(tmp_path: Path) -> None:
    bundle = _bundle()
    folder = bundle.write(tmp_path)
    assert folder == egress_folder(tmp_path, 1) == tmp_path / "egress" / "round-1"
    back = EgressBundle.verify(folder)
    assert back.tensors == bundle.tensors
    assert back.masking == bundle.masking
    assert back.dp == bundle.dp
    assert back.sdc == bundle.sdc
    assert back.created  # filled in at write time
    assert np.array_equal(back.payload, bundle.payload)
    assert back.payload.dtype == np.uint64
    assert back.dp.observer("coordinator").mu == math.inf


def test_payload_file_is_plain_little_endian_uint64(tmp_path: Path) -> None:
    bundle = _bundle()
    folder = bundle.write(tmp_path)
    loaded = np.load(folder / "payload.npy", allow_pickle=False)
    assert loaded.dtype == np.dtype("<u8")
    assert loaded.shape == (13,)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == EGRESS_FORMAT
    assert manifest["payload"]["sha256"] == hashlib.sha256(loaded.tobytes()).hexdigest()
    assert manifest["payload"]["sha256"] == payload_sha256(bundle.payload).hex()


def test_manifest_declares_layout_noise_and_no_secrets(tmp_path: Path) -> None:
    folder = _bundle().write(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    sxx = manifest["tensors"][2]
    assert sxx == {
        "name": "sxx",
        "shape": [3, 3],
        "offset": 4,
        "size": 9,
        "sigma": 8.0,
        "sensitivity": 16.0,
        "sensitivity_derivation": "||x xᵀ||_F <= 16",
        "coalition_sigma": [6.0],
    }
    mechanism = manifest["dp_receipt"]["mechanism"]
    assert mechanism.startswith("discrete Gaussian on the fixed-point grid")
    assert manifest["dp_receipt"]["delta_sampler"] == 0.0
    assert 0.0 <= manifest["dp_receipt"]["delta_discretisation"] < 1e-12
    assert manifest["dp_receipt"]["release"][1]["mu"] == "inf"
    assert manifest["masking"]["remaining_std_fraction"] == [
        {"coalition_size": 1, "fraction": 0.70710678}
    ]
    assert manifest["sdc"]["n_subjects"] == 150
    text = (folder / "manifest.json").read_text().lower()
    assert "seed" not in text
    assert "clipped" not in text
    for name in ("payload.npy", "values.csv", "results.json"):
        assert (
            manifest["checksums"][name] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
        )


def test_values_csv_decodes_payload_exactly(tmp_path: Path) -> None:
    bundle = _bundle()
    folder = bundle.write(tmp_path)
    with (folder / "values.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 13
    assert rows[0]["element"] == "n"
    assert rows[5]["element"] == "sxx[0][1]"
    decoded = FixedPointCodec(BITS).decode(bundle.payload)
    assert [float(r["value"]) for r in rows] == decoded.tolist()
    assert np.array_equal(bundle.decoded()["sxx"].ravel(), decoded[4:])


def test_decoding_is_twos_complement_fixed_point() -> None:
    words = np.array([2**32, (-(2**31)) & (2**64 - 1), 0, 2**64 - 1], dtype=np.uint64)
    assert FixedPointCodec(32).decode(words).tolist() == [1.0, -0.5, 0.0, -(2.0**-32)]


def test_results_json_follows_acro_schema(tmp_path: Path) -> None:
    folder = _bundle().write(tmp_path)
    document = json.loads((folder / "results.json").read_text())
    assert document["version"] == ACRO_RESULTS_VERSION
    assert set(document) == {"version", "results"}
    names = []
    for uid, output in document["results"].items():
        assert output["uid"] == uid
        assert output["status"] == "review"
        assert output["type"] == "custom"
        assert set(output) == {
            "uid",
            "status",
            "type",
            "properties",
            "files",
            "outcome",
            "command",
            "summary",
            "timestamp",
            "fair",
            "comments",
            "exception",
        }
        assert len(output["files"]) == 1
        names.append(output["files"][0]["name"])
        assert output["comments"] and all(isinstance(c, str) and c for c in output["comments"])
        assert "Gaussian noise" in output["exception"]
        assert output["properties"]["n_subjects"] == 150
    assert sorted(names) == ["manifest.json", "payload.npy", "values.csv"]
    # ACRO keeps one checksum file per output; the SACRO viewer checks them.
    for name in [*names, "results.json"]:
        stored = (folder / "checksums" / f"{name}.txt").read_text()
        assert stored == hashlib.sha256((folder / name).read_bytes()).hexdigest()


def test_manifest_sha256_is_digest_of_file(tmp_path: Path) -> None:
    folder = _bundle().write(tmp_path)
    expected = hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    assert EgressBundle.manifest_sha256(folder) == expected


def test_write_refuses_to_replace_a_bundle_unless_asked(tmp_path: Path) -> None:
    folder = _bundle().write(tmp_path)
    (folder / "approval.json").write_text("{}")
    with pytest.raises(EgressError, match="already holds an egress bundle"):
        _bundle().write(tmp_path)
    other = _bundle(payload=np.zeros(13, dtype=np.uint64))
    other.write(tmp_path, overwrite=True)
    assert not (folder / "approval.json").exists()
    assert np.array_equal(EgressBundle.verify(folder).payload, other.payload)


@pytest.mark.parametrize(
    ("target", "damage"),
    [
        ("payload.npy", "flip"),
        ("values.csv", "edit"),
        ("results.json", "status"),
        ("values.csv", "delete"),
    ],
)
def test_verify_catches_tampering(tmp_path: Path, target: str, damage: str) -> None:
    folder = _bundle().write(tmp_path)
    path = folder / target
    if damage == "flip":
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(bytes(data))
    elif damage == "edit":
        path.write_text(path.read_text().replace("sxx[2][2]", "sxx[2][3]"))
    elif damage == "status":
        doc = json.loads(path.read_text())
        doc["results"]["noised_values"]["status"] = "pass"
        path.write_text(json.dumps(doc))
    else:
        path.unlink()
    with pytest.raises(EgressIntegrityError) as caught:
        EgressBundle.verify(folder)
    assert any(target in p for p in caught.value.problems)


def test_verify_catches_values_that_do_not_match_a_consistent_manifest(tmp_path: Path) -> None:
    # A forger who also rewrites the checksums still cannot make values.csv lie.
    folder = _bundle().write(tmp_path)
    values = folder / "values.csv"
    lines = values.read_text().splitlines()
    tensor, index, element, _ = lines[1].split(",")
    lines[1] = f"{tensor},{index},{element},123.0"
    values.write_text("\n".join(lines) + "\n")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["checksums"]["values.csv"] = hashlib.sha256(values.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "checksums" / "values.csv.txt").write_text(manifest["checksums"]["values.csv"])
    (folder / "checksums" / "manifest.json.txt").unlink()
    with pytest.raises(EgressIntegrityError, match="but the payload gives"):
        EgressBundle.verify(folder)


def test_verify_rejects_a_manifest_whose_layout_does_not_fill_the_payload(tmp_path: Path) -> None:
    folder = _bundle().write(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tensors"][2]["shape"] = [2, 3]
    manifest["tensors"][2]["size"] = 6
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EgressIntegrityError, match="layout covers 10 entries"):
        EgressBundle.verify(folder)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ((TensorEntry("a", (2,), 0, 3, 1.0, 1.0, ""),), r"has shape \(2,\) \(2 words\) but size 3"),
        (
            (TensorEntry("a", (2,), 1, 2, 1.0, 1.0, ""),),
            "starts at word 1; the tensors before it end at word 0",
        ),
        (
            (TensorEntry("a", (1,), 0, 1, 1.0, 1.0, ""), TensorEntry("a", (1,), 1, 1, 1, 1, "")),
            "is listed twice",
        ),
        ((TensorEntry("a", (2,), 0, 2, -1.0, 1.0, ""),), "sigma -1.0"),
        ((TensorEntry("a", (2,), 0, 2, 1.0, math.nan, ""),), "sensitivity nan"),
    ],
)
def test_bad_layouts_are_named(tensors: tuple[TensorEntry, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_layout(tensors)


def test_bundle_rejects_payload_of_wrong_type_or_length() -> None:
    with pytest.raises(EgressError, match="uint64"):
        _bundle(payload=np.zeros(13, dtype=np.int64))
    with pytest.raises(EgressError, match="payload holds 12"):
        _bundle(payload=np.zeros(12, dtype=np.uint64))


def test_read_names_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(EgressError, match=r"has no manifest\.json"):
        EgressBundle.read(tmp_path)


def test_audit_record_round_trips_and_stays_apart(tmp_path: Path) -> None:
    bundle = _bundle()
    unnoised = np.arange(13, dtype=np.uint64) << np.uint64(BITS)
    record = AuditRecord(
        session_id=bundle.session_id,
        round_index=1,
        round_name="scatter",
        node_id="alpha",
        fixed_point_bits=BITS,
        tensors=bundle.tensors,
        payload=unnoised,
        clipped={"age": 2, "features": 5},
        egress_payload_sha256=bundle.payload_sha256,
    )
    folder = write_audit(tmp_path, record)
    assert folder == audit_folder(tmp_path, 1)
    assert not folder.is_relative_to(tmp_path / "egress")
    back = read_audit(tmp_path, 1)
    assert back.clipped == {"age": 2, "features": 5}
    assert np.array_equal(back.payload, unnoised)
    assert back.decoded()["sum_x"].tolist() == [1.0, 2.0, 3.0]
    assert back.egress_payload_sha256 == bundle.payload_sha256
    (folder / "payload.npy").write_bytes((folder / "payload.npy").read_bytes()[:-8] + bytes(8))
    with pytest.raises(EgressError, match="does not match the digest"):
        read_audit(tmp_path, 1)
