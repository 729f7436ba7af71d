"""Every RPC of the coordinator under seeded fuzzing, over mutual TLS with a real SQLite state.

``make test`` sends a sample of :data:`SAMPLE` cases per RPC; ``make
test-slow`` sends :data:`FULL` per RPC and writes the status-code counts to
``fuzz-summary.json`` in the test's folder. Each case must be answered
within the bound, with a status the RPC may give, by a coordinator still
alive, and a refused case must leave the state digest unchanged
(tests/campaign/fuzz.py). The seed is printed with every run.

Then the callers that are not members of the session: ``zed`` (a certificate
of the federation CA for a name outside the federation) and ``d`` (a
federation node that missed the join deadline) send each RPC's valid request
in their own name, signed with their own keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from tests.campaign.digest import state_digest
from tests.campaign.fuzz import RPCS, Case, call, run_campaign
from tests.campaign.harness import OUTSIDER, Certificates, build_stage, make_certificates

pytestmark = pytest.mark.integration

SEED = 20261201
SAMPLE = 30
FULL = 1000


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    return make_certificates()


def _fuzz(rpc: str, count: int, folder: Path, certificates: Certificates) -> dict[str, object]:
    spec = RPCS[rpc]
    target = build_stage(spec.stage, folder, certificates)
    try:
        report = run_campaign(target, spec, count, SEED)
    finally:
        target.close()
    summary = report.summary()
    print(f"fuzz {rpc}: seed {SEED}, {json.dumps(summary)}")
    assert report.cases == count
    assert not report.failures, "\n".join(report.failures[:20])
    return summary


@pytest.mark.parametrize("rpc", sorted(RPCS))
def test_a_sample_of_fuzzed_messages_is_refused_cleanly(
    rpc: str, tmp_path: Path, certificates: Certificates
) -> None:
    summary = _fuzz(rpc, SAMPLE, tmp_path, certificates)
    # The sample reaches the coordinator's own checks, not only gRPC's parser.
    codes = summary["codes"]
    assert isinstance(codes, dict)
    assert set(codes) - {"OK", "INTERNAL"}


@pytest.mark.slow
def test_a_thousand_fuzzed_messages_per_rpc(tmp_path: Path, certificates: Certificates) -> None:
    summaries = [_fuzz(rpc, FULL, tmp_path / rpc, certificates) for rpc in sorted(RPCS)]
    out = tmp_path / "fuzz-summary.json"
    out.write_text(json.dumps({"seed": SEED, "per_rpc": summaries}, indent=2) + "\n")
    print(f"fuzz summary written to {out}")
    assert sum(int(s["cases"]) for s in summaries) == FULL * len(RPCS)  # type: ignore[call-overload]


# ---------------------------------------------------------------- callers outside the session


def _as_outsider(
    rpc: str, caller: str, folder: Path, certificates: Certificates
) -> tuple[grpc.StatusCode, str, bool]:
    spec = RPCS[rpc]
    # Join is tried once the roster is final, like every other call.
    stage = "uploading" if rpc == "Join" else spec.stage
    target = build_stage(stage, folder, certificates)
    try:
        before = state_digest(target.state_path)
        messages = tuple(m.SerializeToString() for m in spec.valid(target, caller))
        code, details = call(target, spec, Case(rpc, caller, messages, ("as is",)))
        unchanged = state_digest(target.state_path) == before
        assert target.alive()
    finally:
        target.close()
    return code, details, unchanged


@pytest.mark.parametrize("rpc", sorted(RPCS))
def test_a_certificate_outside_the_federation_is_denied_every_rpc(
    rpc: str, tmp_path: Path, certificates: Certificates
) -> None:
    code, details, unchanged = _as_outsider(rpc, OUTSIDER, tmp_path, certificates)
    assert code == grpc.StatusCode.PERMISSION_DENIED, details
    assert "'zed' is not a member" in details
    assert unchanged


@pytest.mark.parametrize(
    "rpc",
    sorted(RPCS),
)
def test_a_federation_node_outside_the_roster_is_denied_every_rpc(
    rpc: str, tmp_path: Path, certificates: Certificates
) -> None:
    code, details, unchanged = _as_outsider(rpc, "d", tmp_path, certificates)
    assert code == grpc.StatusCode.PERMISSION_DENIED, f"{code.name}: {details}"
    assert unchanged
