"""The approval gate releases only what an accepted reviewer signed, exactly as signed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from node.egress.approval import (
    ApprovalError,
    ApprovalGate,
    ApprovalRejected,
    approval_message,
    read_approval,
    sign_approval,
    verify_approval,
    write_approval,
)
from node.egress.bundle import EgressBundle
from node.egress.receipt import DPReceipt, MaskingFacts, ObserverRelease, SDCEvidence, TensorEntry
from noise.keys import IdentityKey

NODE_KEY = IdentityKey.from_private_bytes(bytes(range(32)))
OTHER_KEY = IdentityKey.from_private_bytes(bytes(range(1, 33)))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    bundle = EgressBundle(
        session_id="s" * 32,
        round_index=0,
        round_name="moments",
        node_id="a",
        fixed_point_bits=32,
        tensors=(TensorEntry("n", (2,), 0, 2, 1.0, 1.0, "count"),),
        masking=MaskingFacts("pairwise", "complete", 3, 1, (0.7,), False),
        dp=DPReceipt(1e-6, (ObserverRelease("outsider", 0, 1.0, 3.0, 1e-6),), (), 1),
        sdc=SDCEvidence(120),
        payload=np.array([1, 2], dtype=np.uint64),
    )
    return bundle.write(tmp_path)


class FakeClock:
    """Deterministic time for the polling loop."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_auto_mode_signs_with_the_node_key(folder: Path) -> None:
    gate = ApprovalGate("auto", identity=NODE_KEY)
    approval = gate.wait(folder)
    assert approval.decision == "approve"
    on_disk = read_approval(folder)
    assert on_disk == approval
    verify_approval(
        approval,
        manifest_sha256=EgressBundle.manifest_sha256(folder),
        accepted_keys={NODE_KEY.public_bytes(): "node"},
    )


CHECKER = {OTHER_KEY.public_bytes(): "output checker"}


def _gate(time: FakeClock, **options: Any) -> ApprovalGate:
    """A manual gate accepting OTHER_KEY (this node's checker) on fake time."""
    options.setdefault("checker_keys", CHECKER)
    options.setdefault("sleep", time.sleep)
    return ApprovalGate("manual", identity=NODE_KEY, clock=time.clock, **options)


def _approving_after(
    time: FakeClock, folder: Path, digest: str, sleeps: int, reviewer: str
) -> Callable[[float], None]:
    """A fake sleep after whose ``sleeps``-th call the checker's approval is in ``folder``."""

    def sleep(seconds: float) -> None:
        time.sleep(seconds)
        if len(time.sleeps) == sleeps:
            write_approval(folder, sign_approval(OTHER_KEY, digest, "approve", reviewer=reviewer))

    return sleep


def test_manual_mode_waits_for_the_file(folder: Path) -> None:
    time = FakeClock()
    lines: list[str] = []
    digest = EgressBundle.manifest_sha256(folder)
    sleep = _approving_after(time, folder, digest, 3, "checker")
    gate = _gate(time, poll_seconds=2.0, progress=lines.append, sleep=sleep)
    approval = gate.wait(folder)
    assert approval.reviewer == "checker"
    assert time.sleeps == [2.0, 2.0, 2.0]
    assert len(lines) == 1 and digest in lines[0]


def test_manual_mode_times_out(folder: Path) -> None:
    gate = _gate(FakeClock(), poll_seconds=1.0, timeout_seconds=3.0)
    with pytest.raises(ApprovalError, match=r"no approval appeared .* within 3 s"):
        gate.wait(folder)


def test_manual_mode_without_checker_keys_gives_up_at_once(folder: Path) -> None:
    time = FakeClock()
    with pytest.raises(ApprovalError, match="lists no output checker key for this node"):
        _gate(time, checker_keys={}).wait(folder)
    assert time.sleeps == []


def test_the_identity_key_cannot_be_a_checker_key() -> None:
    with pytest.raises(ApprovalError, match="identity key is listed as one of its checker keys"):
        ApprovalGate("manual", identity=NODE_KEY, checker_keys={NODE_KEY.public_bytes(): "x"})


def test_rejection_stops_at_once_with_reviewer_and_reason(folder: Path) -> None:
    digest = EgressBundle.manifest_sha256(folder)
    write_approval(
        folder,
        sign_approval(OTHER_KEY, digest, "reject", reviewer="Dr Checker", comment="N too small"),
    )
    time = FakeClock()
    with pytest.raises(ApprovalRejected, match="rejected by reviewer 'Dr Checker': N too small"):
        _gate(time).wait(folder)
    assert time.sleeps == []


def test_an_approval_by_the_node_identity_key_is_refused_in_manual_mode(folder: Path) -> None:
    digest = EgressBundle.manifest_sha256(folder)
    write_approval(folder, sign_approval(NODE_KEY, digest, "approve", reviewer="node"))
    time = FakeClock()
    lines: list[str] = []
    gate = _gate(time, replace_seconds=5.0, progress=lines.append)
    with pytest.raises(ApprovalError, match=r"was refused .*not an accepted reviewer key.* 5 s"):
        gate.wait(folder)
    # Given up after the replacement window, long before any round deadline.
    assert sum(time.sleeps) == 5.0
    refusals = [line for line in lines if line.startswith("refusing")]
    assert len(refusals) == 1 and "--replace" in refusals[0]


def test_an_approval_by_an_unlisted_key_is_refused(folder: Path) -> None:
    digest = EgressBundle.manifest_sha256(folder)
    stranger = IdentityKey.from_private_bytes(bytes([9]) * 32)
    write_approval(folder, sign_approval(stranger, digest, "approve", reviewer="stranger"))
    with pytest.raises(ApprovalError, match="not an accepted reviewer key"):
        _gate(FakeClock(), replace_seconds=2.0).wait(folder)


def test_a_refused_approval_replaced_by_a_valid_one_goes_through(folder: Path) -> None:
    digest = EgressBundle.manifest_sha256(folder)
    write_approval(folder, sign_approval(NODE_KEY, digest, "approve", reviewer="wrong key"))
    time = FakeClock()
    sleep = _approving_after(time, folder, digest, 4, "right")
    gate = _gate(time, replace_seconds=60.0, sleep=sleep)
    assert gate.wait(folder).reviewer == "right"
    assert len(time.sleeps) == 4


def test_approval_for_another_manifest_is_refused(folder: Path) -> None:
    write_approval(folder, sign_approval(OTHER_KEY, "11" * 32, "approve", reviewer="checker"))
    with pytest.raises(ApprovalError, match="bundle changed after review"):
        _gate(FakeClock(), replace_seconds=1.0).wait(folder)


def test_approval_invalidated_by_editing_the_bundle(folder: Path) -> None:
    digest = EgressBundle.manifest_sha256(folder)
    write_approval(folder, sign_approval(OTHER_KEY, digest, "approve", reviewer="checker"))
    assert _gate(FakeClock()).wait(folder).reviewer == "checker"
    manifest = folder / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"n_subjects": 120', '"n_subjects": 121'))
    with pytest.raises(ApprovalError, match="bundle changed after review"):
        _gate(FakeClock(), replace_seconds=1.0).wait(folder)


def test_decision_is_bound_into_the_signature(folder: Path) -> None:
    digest = EgressBundle.manifest_sha256(folder)
    rejection = sign_approval(OTHER_KEY, digest, "reject", reviewer="checker")
    data = rejection.to_json()
    data["decision"] = "approve"
    (folder / "approval.json").write_text(json.dumps(data))
    with pytest.raises(ApprovalError, match="does not verify"):
        _gate(FakeClock(), replace_seconds=1.0).wait(folder)


def test_unreadable_file_is_retried_then_refused(folder: Path) -> None:
    (folder / "approval.json").write_text('{"format": "zerosum-appr')
    time = FakeClock()
    with pytest.raises(ApprovalError, match="not valid JSON"):
        _gate(time, replace_seconds=2.0).wait(folder)
    # Three polls' grace for an editor still writing, then the replacement window.
    assert len(time.sleeps) == 3 + 2


def test_message_format_is_fixed() -> None:
    digest = "ab" * 32
    assert approval_message(digest, "approve") == (
        b"zerosum/v1/egress-approval" + b"\x00\x07approve" + bytes.fromhex(digest)
    )
    with pytest.raises(ApprovalError, match="64 hex digits"):
        approval_message("abc", "approve")
    with pytest.raises(ApprovalError, match="'approve' or 'reject'"):
        approval_message(digest, "maybe")


def test_manual_mode_without_a_checker_key_is_refused_before_any_contact(tmp_path: Path) -> None:
    import argparse
    import dataclasses

    from node.errors import SetupError
    from node.runner import NodeOptions, NodeRunner
    from proto.federation import dump_federation, load_federation
    from zerosum.commands import federation as command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    fed = tmp_path / "fed"
    argv = ["init", "--nodes", "a,b", "--out", str(fed), "--synthetic", "--seed", "3"]
    argv += ["--n-features", "4", "--n-components", "2", "--cohort-sizes", "120,130"]
    assert command.run(parser.parse_args(argv)) == 0
    config = load_federation(fed / "federation.toml")
    bare = tuple(dataclasses.replace(n, checker_public_keys=()) for n in config.nodes)
    (fed / "federation.toml").write_text(dump_federation(dataclasses.replace(config, nodes=bare)))

    def unreachable(*_: object) -> None:
        raise AssertionError("the node contacted the coordinator")

    runner = NodeRunner(
        fed,
        "a",
        options=NodeOptions(approve="manual"),
        progress=lambda _line: None,
        gateway=unreachable,  # type: ignore[arg-type]
    )
    with pytest.raises(SetupError, match="--approve manual needs an output checker key"):
        runner.run()
    # Automatic approval needs no checker key.
    NodeRunner(fed, "a", options=NodeOptions(approve="auto"), progress=lambda _l: None).prepare()
