"""`zerosum review` with a decision prints what it wrote, and its last line is its exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.egress.approval import read_approval, sign_approval
from node.egress.bundle import EgressBundle
from noise.keys import IdentityKey
from tests.support.bundles import make_bundle
from tests.support.made_up_federation import _checkers
from zerosum.cli import main

CHECKER = _checkers(["a", "b", "c"])["a"]
OTHER_CHECKER = _checkers(["a", "b", "c"])["b"]


def _decide(folder: Path, key: Path, *extra: str) -> list[str]:
    return ["review", str(folder), "--approve", "--key", str(key), "--reviewer", "J. Smith", *extra]


def _bundle_and_key(tmp_path: Path, name: str, checker: IdentityKey) -> tuple[Path, Path]:
    """A bundle to review, and ``checker``'s key written to ``name`` beside it."""
    folder = make_bundle(tmp_path)
    key = tmp_path / name
    checker.write_pem(key)
    return folder, key


def test_an_approval_prints_the_decision_it_wrote_not_the_report_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, key = _bundle_and_key(tmp_path, "checker.pem", CHECKER)
    assert main(_decide(folder, key)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[-1] == "decision: approve written (exit 0)"
    assert lines[-2] == f"  approve signed by J. Smith → {folder}/approval.json"
    assert "review verdict pass" in lines[0]
    assert "no decision yet" not in out and "verdict: pass (exit 0)" not in out
    assert read_approval(folder) is not None


def test_a_wrong_key_ends_with_the_exit_status_it_returns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, key = _bundle_and_key(tmp_path, "other.pem", OTHER_CHECKER)
    assert main(_decide(folder, key)) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "decision: none written (exit 2)"
    assert "(exit 0)" not in captured.out
    assert "not an output checker key of node 'a'" in captured.err
    assert read_approval(folder) is None


def test_an_approval_signed_elsewhere_is_imported_only_for_a_bundle_that_passes_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good").mkdir()
    (tmp_path / "weak").mkdir()
    good, weak = make_bundle(tmp_path / "good"), make_bundle(tmp_path / "weak", noise_epsilon=4.0)
    for folder in (good, weak):
        decision = sign_approval(
            CHECKER, EgressBundle.manifest_sha256(folder), "approve", reviewer="J. Smith"
        )
        (folder.parent / "signed.json").write_text(json.dumps(decision.to_json()))
    assert main(["review", str(weak)]) == 2  # ε above the cap: this side's review fails
    capsys.readouterr()
    assert main(["review", str(weak), "--import-decision", str(weak.parent / "signed.json")]) == 2
    captured = capsys.readouterr()
    assert "fails the review here (privacy" in captured.err
    assert captured.out.splitlines()[-1] == "decision: none written (exit 2)"
    assert read_approval(weak) is None
    assert main(["review", str(good), "--import-decision", str(good.parent / "signed.json")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "decision: approve imported (exit 0)"
    found = read_approval(good)
    assert found is not None and found.reviewer == "J. Smith"
