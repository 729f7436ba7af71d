"""`zerosum review`: inspect an egress bundle, sign a final decision the node's gate accepts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from node.egress.approval import (
    ApprovalError,
    ApprovalGate,
    read_approval,
    sign_approval,
    verify_approval,
    write_approval,
)
from node.egress.bundle import EgressBundle
from noise.keys import IdentityKey, key_fingerprint
from proto.federation import FederationConfig, dump_federation
from tests.support.bundles import federation, make_bundle
from tests.support.made_up_federation import SESSION, _checkers, _identities
from zerosum.cli import main

NODE_KEY = _identities(["a", "b", "c"])["a"]
CHECKER = _checkers(["a", "b", "c"])["a"]
OTHER_CHECKER = _checkers(["a", "b", "c"])["b"]


@pytest.fixture
def bundle_folder(tmp_path: Path) -> Path:
    return make_bundle(tmp_path)


def _other_federation() -> FederationConfig:
    return dataclasses.replace(federation(), federation_id="another")


def _pem(tmp_path: Path, key: IdentityKey, name: str) -> Path:
    path = tmp_path / name
    key.write_pem(path)
    return path


@pytest.fixture
def key(tmp_path: Path) -> tuple[Path, IdentityKey]:
    return _pem(tmp_path, CHECKER, "checker.pem"), CHECKER


ACCEPTED = {CHECKER.public_bytes(): "a's checker"}


def test_without_a_decision_it_only_shows_what_would_leave(
    bundle_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["review", str(bundle_folder)]) == 0
    out = capsys.readouterr().out
    assert f"session {SESSION}, round 1 ('scatter'), node a" in out
    assert "[ok  ] integrity: SHA-256 of every file matches" in out
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
    assert "already holds a valid decision" in capsys.readouterr().err
    assert main([*reject, "--replace"]) == 2  # a valid decision is final, even so
    assert read_approval(bundle_folder) == approval


@pytest.mark.parametrize(
    ("signer", "what"),
    [
        (NODE_KEY, "the node's own identity key"),
        (OTHER_CHECKER, "the checker key of another node"),
    ],
)
def test_a_key_that_is_not_a_checker_key_of_the_node_is_refused_before_signing(
    bundle_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signer: IdentityKey,
    what: str,
) -> None:
    path = _pem(tmp_path, signer, "wrong.pem")
    argv = ["review", str(bundle_folder), "--approve", "--key", str(path), "--reviewer", "X"]
    assert main(argv) == 2, what
    error = capsys.readouterr().err
    assert str(path) in error and key_fingerprint(signer.public_bytes()) in error
    assert "not an output checker key of node 'a'" in error
    assert key_fingerprint(CHECKER.public_bytes()) in error  # the key that would do
    assert "nothing was signed" in error
    assert not (bundle_folder / "approval.json").exists()


def test_a_refused_approval_can_be_replaced_by_a_listed_checker(
    bundle_folder: Path, key: tuple[Path, IdentityKey], capsys: pytest.CaptureFixture[str]
) -> None:
    digest = EgressBundle.manifest_sha256(bundle_folder)
    write_approval(bundle_folder, sign_approval(OTHER_CHECKER, digest, "approve", reviewer="B"))
    assert main(["review", str(bundle_folder)]) == 1  # a human must look
    out = capsys.readouterr().out
    assert "[LOOK] decision: approval.json is refused" in out and "--replace" in out
    # What the node's gate says too: it will not act on that file.
    with pytest.raises(ApprovalError, match="not an accepted reviewer key"):
        ApprovalGate("manual", identity=NODE_KEY, checker_keys=ACCEPTED).check(
            bundle_folder,
            read_approval(bundle_folder),  # type: ignore[arg-type]
        )
    argv = ["review", str(bundle_folder), "--approve", "--key", str(key[0]), "--reviewer", "A"]
    assert main(argv) == 2
    assert "add --replace" in capsys.readouterr().err
    assert main([*argv, "--replace"]) == 0
    assert "replacing the refused file" in capsys.readouterr().out
    found = read_approval(bundle_folder)
    assert found is not None
    gate = ApprovalGate("manual", identity=NODE_KEY, checker_keys=ACCEPTED)
    assert gate.check(bundle_folder, found).reviewer == "A"


def test_a_decision_needs_the_federation_config_of_the_bundle(
    bundle_folder: Path, key: tuple[Path, IdentityKey], capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = bundle_folder.parents[2] / "federation.toml"
    argv = ["review", str(bundle_folder), "--approve", "--key", str(key[0]), "--reviewer", "A"]
    other = _other_federation()
    config_file.write_text(dump_federation(other))
    assert main(argv) == 2
    assert "pass the node's federation config with --federation" in capsys.readouterr().err
    config_file.unlink()
    assert main(argv) == 2
    assert "no federation.toml found" in capsys.readouterr().err
    assert read_approval(bundle_folder) is None


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
