"""NodeRunner withdraws when it refuses on purpose, and never when it merely stops.

A real coordinator on 127.0.0.1 (in-process server) and four nodes in
threads. Node c's privacy ledger already holds an earlier session's release
that spent its ε budget: it refuses round 0 before writing anything, tells the
coordinator at once, and the other three finish long before the round
deadline. A node interrupted (Ctrl-C) in the same place sends nothing: it may
be run again and resume, so the coordinator waits for the deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from coordinator.config import SessionConfig
from coordinator.server import RunningServer, ServerTLS, start_server
from coordinator.session import Session
from coordinator.store import Store
from node.egress.approval import sign_approval, write_approval
from node.egress.bundle import EgressBundle, egress_folder
from node.errors import ApprovalError, ApprovalRejected
from node.protocol.client import RetryPolicy
from node.records.ledger import PrivacyLedger
from node.runner import GatewayFactory, NodeOptions, NodeRefused, NodeRunner, grpc_gateway
from noise.keys import IdentityKey
from proto.federation import config_hash, load_federation
from proto.messages import (
    SessionState,
)
from tests.node.gateways import failing_before_upload
from tests.support.synthetic_init import init_synthetic

pytestmark = pytest.mark.integration

NODES = "abcd"


def _federation(out: Path, round_deadline: float) -> Path:
    return init_synthetic(
        out,
        NODES,
        seed=5,
        n_features=6,
        n_components=3,
        cohort_sizes="120,150,130,140",
        options=[
            "--coordinator",
            "127.0.0.1:1",
            "--round-deadline",
            str(round_deadline),
            "--join-deadline",
            "30",
            # Two rounds ("means", then "sums"): the others go on after a withdrawal.
            "--nan-policy",
            "mean",
        ],
    )


@pytest.fixture
def servers() -> Iterator[list[RunningServer]]:
    started: list[RunningServer] = []
    yield started
    for server in started:
        server.stop(grace=None)
        server.session.store.close()


def _serve(fed: Path, state: Path, servers: list[RunningServer]) -> RunningServer:
    config = load_federation(fed / "federation.toml")
    session = Session(
        Store(state / "coordinator.db"), SessionConfig.from_federation(config, config_hash(config))
    )
    tls = ServerTLS(
        (fed / "coordinator" / "server.pem").read_bytes(),
        (fed / "coordinator" / "server.key").read_bytes(),
        (fed / "ca" / "ca.pem").read_bytes(),
    )
    server = start_server(session, tls, listen="127.0.0.1:0", tick_seconds=0.05)
    servers.append(server)
    return server


def _runner(
    fed: Path,
    node: str,
    port: int,
    tmp: Path,
    *,
    lines: list[str],
    gateway: GatewayFactory = grpc_gateway,
    approve: Literal["auto", "manual"] = "auto",
) -> NodeRunner:
    return NodeRunner(
        fed,
        node,
        out=tmp / f"out-{node}",
        options=NodeOptions(
            approve=approve,
            poll_seconds=0.05,
            address=f"127.0.0.1:{port}",
            retry=RetryPolicy(total_seconds=10.0),
        ),
        progress=lines.append,
        gateway=gateway,
    )


def _runners_with_c(
    fed: Path, port: int, tmp: Path, **for_c: Any
) -> tuple[dict[str, list[str]], list[NodeRunner]]:
    """Every node's runner (``for_c``: node c's own gateway or approval) and its printed lines."""
    lines: dict[str, list[str]] = {n: [] for n in NODES}
    runners = [
        _runner(fed, n, port, tmp, lines=lines[n], **(for_c if n == "c" else {})) for n in NODES
    ]
    return lines, runners


def _start(runners: list[NodeRunner]) -> tuple[dict[str, object], dict[str, threading.Thread]]:
    outcomes: dict[str, object] = {}

    def go(runner: NodeRunner) -> None:
        try:
            outcomes[runner.node_id] = runner.run()
        except BaseException as error:
            outcomes[runner.node_id] = error

    threads = {r.node_id: threading.Thread(target=go, args=(r,), daemon=True) for r in runners}
    for thread in threads.values():
        thread.start()
    return outcomes, threads


def _spend_budget(out: Path, node: str, fed: Path) -> None:
    """An earlier session's release in the node's ledger, large enough to use up its ε budget."""
    config = load_federation(fed / "federation.toml")
    ledger = PrivacyLedger.open(out / "ledger.json", node, config.privacy.delta)
    ledger.record_release(
        session_id="an-earlier-session",
        round_index=0,
        round_name="means",
        mu={"outsider": 10.0, "coordinator": 10.0},
        manifest_sha256="0" * 64,
        payload_sha256="0" * 64,
    )


def _ctrl_c(round_name: str) -> None:
    """A node whose operator presses Ctrl-C as its first release is about to leave."""
    raise KeyboardInterrupt


def test_a_node_over_its_budget_withdraws_and_the_others_finish_at_once(
    tmp_path: Path, servers: list[RunningServer]
) -> None:
    fed = _federation(tmp_path / "fed", round_deadline=120.0)
    server = _serve(fed, tmp_path / "state", servers)
    _spend_budget(tmp_path / "out-c", "c", fed)
    lines: dict[str, list[str]] = {n: [] for n in NODES}
    runners = [_runner(fed, n, server.port, tmp_path, lines=lines[n]) for n in NODES]
    started = time.monotonic()
    outcomes, threads = _start(runners)
    for thread in threads.values():
        thread.join(timeout=60)
    elapsed = time.monotonic() - started
    assert isinstance(outcomes["c"], NodeRefused), outcomes["c"]
    assert "above the budget" in str(outcomes["c"])
    assert all(not isinstance(outcomes[n], BaseException) for n in "abd"), outcomes
    # The round deadline was two minutes away.
    assert elapsed < 30.0, f"the session took {elapsed:.1f} s"
    session = server.session
    assert session.state() == SessionState.COMPLETED
    (dropped,) = session.status().dropped
    assert (dropped.node_id, dropped.round_index) == ("c", 0)
    assert dropped.reason == f"withdrew from round 0 ('means'): {outcomes['c']}"
    assert any(line.endswith("(dropped from the round: {c})") for line in lines["c"]), lines["c"]
    # Nothing of c's was written for review, nor sent.
    assert not (tmp_path / "out-c" / "egress" / "round-0").exists()
    assert session.store.uploads(0) and "c" not in {u.node_id for u in session.store.uploads(0)}
    for n in "abd":
        EgressBundle.verify(tmp_path / f"out-{n}" / "egress" / "round-1")


def test_an_interrupted_node_does_not_withdraw_and_is_dropped_at_the_deadline(
    tmp_path: Path, servers: list[RunningServer]
) -> None:
    fed = _federation(tmp_path / "fed", round_deadline=6.0)
    server = _serve(fed, tmp_path / "state", servers)
    lines, runners = _runners_with_c(
        fed, server.port, tmp_path, gateway=failing_before_upload(_ctrl_c)
    )
    outcomes, threads = _start(runners)
    threads["c"].join(timeout=60)
    assert isinstance(outcomes["c"], KeyboardInterrupt), outcomes["c"]
    # c has stopped, and the coordinator still counts on it until the deadline.
    status = server.session.status()
    assert status.dropped == () and status.rounds[0].dropped == ()
    assert not any("withdr" in line for line in lines["c"]), lines["c"]
    for n in "abd":
        threads[n].join(timeout=60)
        assert not isinstance(outcomes[n], BaseException), outcomes[n]
    (dropped,) = server.session.status().dropped
    assert (dropped.node_id, dropped.reason) == ("c", "missed the deadline of round 0 ('means')")


def _decide_when_written(out: Path, signer: Path, decision: str) -> threading.Thread:
    """As c's output checker: once round 0's bundle is written, sign ``decision``."""
    folder = egress_folder(out, 0)

    def decide() -> None:
        deadline = time.monotonic() + 60
        while not (folder / "manifest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the manifest is written atomically; its checksums follow at once
        signed = sign_approval(
            IdentityKey.read_pem(signer),
            EgressBundle.manifest_sha256(folder),
            decision,  # type: ignore[arg-type]
            reviewer="output checker",
            comment="cell counts too small",
        )
        write_approval(folder, signed)

    thread = threading.Thread(target=decide, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "case",
    [
        (
            "checkers/c/checker.pem",
            "reject",
            ApprovalRejected,
            "the TRE's output checker rejected this node's egress",
        ),
        (
            # Signed with the node's own key: the node refuses it, and when no
            # checker replaces it, withdraws instead of waiting for the deadline.
            "nodes/c/identity.pem",
            "approve",
            ApprovalError,
            "this node holds no valid output checker decision on its egress",
        ),
    ],
)
def test_a_node_without_a_valid_approval_withdraws_promptly(
    tmp_path: Path,
    servers: list[RunningServer],
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, str, type[Exception], str],
) -> None:
    signer, decision, raised, reason = case
    monkeypatch.setattr("node.egress.approval.REPLACE_SECONDS", 1.0)
    fed = _federation(tmp_path / "fed", round_deadline=120.0)
    server = _serve(fed, tmp_path / "state", servers)
    _, runners = _runners_with_c(fed, server.port, tmp_path, approve="manual")
    checker = _decide_when_written(tmp_path / "out-c", fed / signer, decision)
    started = time.monotonic()
    outcomes, threads = _start(runners)
    for thread in threads.values():
        thread.join(timeout=60)
    checker.join(timeout=1)
    elapsed = time.monotonic() - started
    assert isinstance(outcomes["c"], raised), outcomes["c"]
    assert all(not isinstance(outcomes[n], BaseException) for n in "abd"), outcomes
    assert elapsed < 30.0, f"the session took {elapsed:.1f} s (the deadline was 120 s away)"
    (dropped,) = server.session.status().dropped
    assert (dropped.node_id, dropped.round_index) == ("c", 0)
    assert dropped.reason == f"withdrew from round 0 ('means'): {reason}"
    assert "cell counts" not in dropped.reason
