"""Egress bundles load with ACRO's own reader and meet the SACRO Viewer's discovery rules.

ACRO (the ``acro`` package, a development dependency) reads an output
folder with ``acro.record.load_records``: it demands ``results.json`` with
exactly its own version, every record with ``fair`` among its fields, and it
loads each ``.csv`` file a record names. The SACRO Viewer (sacro/models.py,
``find_acro_metadata`` and ``ACROOutputs``) opens a folder through the one
JSON file in it that has ``version`` and ``results``, each result naming at
least one file, accepts ACRO versions from 0.4 on (sacro/versioning.py), and
checks each file against ``checksums/<name>.txt`` holding its hex SHA-256.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
from acro import record as acro_record
from acro.version import __version__ as acro_version

from node.egress.approval import sign_approval, write_approval
from node.egress.bundle import ACRO_RESULTS_VERSION, EgressBundle
from tests.support.bundles import make_bundle
from tests.support.made_up_federation import _checkers


def test_the_bundle_names_the_installed_acro_release() -> None:
    assert acro_version == ACRO_RESULTS_VERSION


def test_acro_loads_a_real_bundle(tmp_path: Path) -> None:
    folder = make_bundle(tmp_path)
    records = acro_record.load_records(str(folder))
    assert set(records.results) == {"noised_values", "noised_payload", "release_manifest"}
    values = records.results["noised_values"]
    assert values.status == "review" and values.output_type == "custom"
    assert values.fair == {}
    (table,) = values.output
    assert isinstance(table, pd.DataFrame)
    assert list(table.columns) == ["tensor", "index", "element", "value"]
    assert len(table) == EgressBundle.read(folder).payload.size
    assert records.results["noised_payload"].output == ["payload.npy"]
    assert records.results["release_manifest"].properties["node_id"] == "a"


def _viewer_metadata(folder: Path) -> list[Path]:
    """The JSON files of the folder the SACRO Viewer would accept as ACRO outputs."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            assert "version" in data and "results" in data
            for result in data["results"].values():
                assert result["files"]
                assert all("name" in f for f in result["files"])
        except (AssertionError, AttributeError, KeyError, TypeError, json.JSONDecodeError):
            continue
        found.append(path)
    return found


def test_the_sacro_viewer_finds_exactly_one_acro_file_with_valid_checksums(
    tmp_path: Path,
) -> None:
    folder = make_bundle(tmp_path)
    digest = EgressBundle.manifest_sha256(folder)
    # With a decision in the folder there are three JSON files; still one is ACRO's.
    write_approval(
        folder,
        sign_approval(_checkers(["a", "b", "c"])["a"], digest, "approve", reviewer="checker"),
    )
    assert len(list(folder.glob("*.json"))) == 3
    (metadata,) = _viewer_metadata(folder)
    assert metadata.name == "results.json"
    data = json.loads(metadata.read_text())
    major, minor = (int(part) for part in data["version"].split(".")[:2])
    assert (major, minor) >= (0, 4)
    for result in data["results"].values():
        for entry in result["files"]:
            recorded = (folder / "checksums" / f"{entry['name']}.txt").read_text()
            actual = hashlib.sha256((folder / entry["name"]).read_bytes()).hexdigest()
            assert recorded == actual, entry["name"]
