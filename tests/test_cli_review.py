"""`zerosum review`: inspect an egress bundle, sign a final decision the node's gate accepts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from node.approval import read_approval, verify_approval
from node.egress import EgressBundle
from node.masking import pairwise_masks
from node.receipt import SDCEvidence
from noise.keys import IdentityKey
from noise.layout import Layout
from tests.node.test_runner_units import CODEC, SESSION, _config, _noise, _seeds, _tensors
from zerosum.cli import main


@pytest.fixture
def bundle_folder(tmp_path: Path) -> Path:
    ids = ["a", "b", "c"]
    tensors = _tensors(0)
    layout = Layout.of_tensors(tensors)
    noise = _noise(_config(ids), ids, "a")
    clean = layout.encode(tensors, CODEC)
    bundle = EgressBundle(
        session_id=SESSION,
        round_index=1,
        round_name="scatter",
        node_id="a",
        fixed_point_bits=32,
        tensors=noise.entries({s.name: s.shape for s in layout}),
        masking=noise.masking_facts(residual_dp=False),
        dp=noise.receipt((), 0),
        sdc=SDCEvidence(150),
        payload=clean + pairwise_masks(noise, _seeds(ids)["a"], layout, round_index=1, codec=CODEC),
    )
    return bundle.write(tmp_path / "out")


@pytest.fixture
def key(tmp_path: Path) -> tuple[Path, IdentityKey]:
    identity = IdentityKey.from_private_bytes(bytes([7]) * 32)
    path = tmp_path / "identity.pem"
    identity.write_pem(path)
    return path, identity


def test_without_a_decision_it_only_shows_what_would_leave(
    bundle_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["review", str(bundle_folder)]) == 0
    out = capsys.readouterr().out
    assert f"session {SESSION}, round 1 ('scatter'), node a; checksums verified" in out
    assert "sum_xx" in out and "outsider" in out and "no decision yet" in out
    assert read_approval(bundle_folder) is None


def test_an_approval_is_signed_for_this_manifest_and_is_final(
    bundle_folder: Path, key: tuple[Path, IdentityKey], capsys: pytest.CaptureFixture[str]
) -> None:
    path, identity = key
    base = ["review", str(bundle_folder), "--approve", "--key", str(path)]
    assert main(base) == 2  # no reviewer named
    assert "--reviewer" in capsys.readouterr().err
    assert main([*base, "--reviewer", "J. Smith", "--comment", "fine"]) == 0
    approval = read_approval(bundle_folder)
    assert approval is not None and approval.decision == "approve"
    verify_approval(
        approval,
        manifest_sha256=EgressBundle.manifest_sha256(bundle_folder),
        accepted_keys={identity.public_bytes(): "a"},
    )
    capsys.readouterr()
    reject = ["review", str(bundle_folder), "--reject", "--key", str(path), "--reviewer", "X"]
    assert main(reject) == 2
    assert "already holds a decision" in capsys.readouterr().err
    assert read_approval(bundle_folder) == approval


def test_a_changed_bundle_is_never_signed(
    bundle_folder: Path, key: tuple[Path, IdentityKey], capsys: pytest.CaptureFixture[str]
) -> None:
    payload = np.load(bundle_folder / "payload.npy")
    payload[0] += np.uint64(1)
    np.save(bundle_folder / "payload.npy", payload)
    arguments = ["review", str(bundle_folder), "--approve", "--key", str(key[0])]
    assert main([*arguments, "--reviewer", "J. Smith"]) == 2
    assert "does not verify" in capsys.readouterr().err
    assert read_approval(bundle_folder) is None


def test_a_folder_without_a_bundle_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["review", str(tmp_path)]) == 2
    assert "not an egress folder" in capsys.readouterr().err
