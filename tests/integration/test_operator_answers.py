"""What an operator reads when something is wrong, from real processes on 127.0.0.1.

* A node holding another federation's certificates: one sentence within
  seconds naming the CA file and the certificate presented (two real CAs, a
  real coordinator), no gRPC C-core lines; the coordinator logs the refused
  handshake; ``zerosum node --status`` shows the failure afterwards.
* Ctrl-C (SIGINT) on a node says that the same command resumes.
* A Python warning is one line in the tool's words (no file path, no category).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.processes import Federation, Processes, free_port, init_federation, wait_until
from tests.support.sessions import SessionRun

pytestmark = pytest.mark.integration

_CORE_MARKS = ("ssl_transport_security", "Handshake failed", ".cc:", "OPENSSL_internal")


def _federation(root: Path, seed: int) -> Federation:
    return init_federation(
        root,
        ["a", "b", "c"],
        cohort_sizes=[110, 110, 110],
        join_deadline=30.0,
        round_deadline=10.0,
        seed=seed,
    )


def test_another_federations_certificates_fail_in_one_sentence_within_seconds(
    tmp_path: Path, processes: Processes
) -> None:
    ours = _federation(tmp_path / "ours", 1)
    theirs = _federation(tmp_path / "theirs", 2)  # a CA of the same name, another key
    port = free_port()
    coordinator = processes.zerosum(
        "coordinator",
        "coordinator",
        "--federation",
        str(ours.toml),
        "--listen",
        f"127.0.0.1:{port}",
    )
    wait_until(
        lambda: "listening on" in coordinator.stderr(), what="the coordinator", alive=[coordinator]
    )
    node = processes.zerosum(
        "node",
        "node",
        "--federation",
        str(theirs.toml),
        "--node-id",
        "a",
        "--coordinator",
        f"127.0.0.1:{port}",
    )
    # From the end of its local checks (a loaded machine may take long to start Python).
    wait_until(lambda: "subjects from" in node.stderr() or not node.running(), what="the node")
    started = time.monotonic()
    assert node.wait(60) == 1
    seconds = time.monotonic() - started
    assert seconds < 15, f"the node took {seconds:.0f} s to give up (retries run for 120 s)"
    err = node.stderr()
    failed = [line for line in err.splitlines() if ": failed: " in line]
    assert len(failed) == 1, err
    ca = theirs.root / "ca" / "ca.pem"
    assert "presented a certificate ('zerosum coordinator'" in failed[0]
    assert f"that this node's CA certificate {ca}" in failed[0]
    assert "another federation's CA" in failed[0]
    assert not any(mark in err for mark in _CORE_MARKS), err
    assert "does not answer yet" not in err

    wait_until(
        lambda: "refused a TLS handshake" in coordinator.stderr(),
        what="the coordinator to log the refused handshake",
        timeout=10,
        alive=[coordinator],
    )
    logged = coordinator.stderr()
    assert "the client's certificate was not issued by this federation's CA" in logged
    assert "ssl_transport_security" not in logged and "I1" not in logged

    status = processes.zerosum(
        "status", "node", "--federation", str(theirs.toml), "--node-id", "a", "--status"
    )
    assert status.wait(60) == 0
    assert f"that this node's CA certificate {ca}" in status.stdout()


def test_ctrl_c_on_a_node_says_the_same_command_resumes(
    tmp_path: Path, processes: Processes
) -> None:
    federation = _federation(tmp_path / "fed", 3)
    # Nothing listens there: the node keeps retrying until it is interrupted.
    node = processes.zerosum(
        "node",
        "node",
        "--federation",
        str(federation.toml),
        "--node-id",
        "b",
        "--coordinator",
        f"127.0.0.1:{free_port()}",
    )
    wait_until(lambda: "subjects from" in node.stderr(), what="the node to start", alive=[node])
    node.popen.send_signal(signal.SIGINT)
    assert node.wait(30) == 130
    last = node.stderr().strip().splitlines()[-1]
    assert last.startswith("zerosum node: interrupted; run the same command again to resume")
    assert "Traceback" not in node.stderr()


def test_a_python_warning_is_one_line_in_the_tools_words(
    tmp_path: Path, processes: Processes
) -> None:
    rng = np.random.default_rng(5)
    table = tmp_path / "train.csv"
    rows = ["id,age,f0,f1,f2"]
    for i in range(30):
        rows.append(f"s{i},{rng.uniform(40, 80):.2f},{rng.normal():.4f},1.0,{rng.normal():.4f}")
    table.write_text("\n".join(rows) + "\n")
    run = processes.zerosum(
        "deltab",
        "deltab",
        "--train-features",
        str(table),
        "--predict-output",
        str(tmp_path / "delta.txt"),
    )
    assert run.wait(60) == 0
    err = run.stderr()
    warned = [line for line in err.splitlines() if "warning" in line]
    assert warned == [
        f"zerosum deltab: warning: 1 feature(s) of {table} do not vary across the training "
        "subjects and are left out of the model: 'f1'."
    ], err
    assert ".py:" not in err and "DeltabWarning" not in err and "warnings.warn" not in err


def test_ctrl_c_on_the_coordinator_says_the_same_command_resumes(
    tmp_path: Path, processes: Processes
) -> None:
    federation = _federation(tmp_path / "fed", 4)
    coordinator = processes.zerosum(
        "coordinator",
        "coordinator",
        "--federation",
        str(federation.toml),
        "--listen",
        f"127.0.0.1:{free_port()}",
    )
    wait_until(
        lambda: "listening on" in coordinator.stderr(), what="the coordinator", alive=[coordinator]
    )
    coordinator.popen.send_signal(signal.SIGINT)
    assert coordinator.wait(30) == 128 + signal.SIGINT
    last = coordinator.stderr().strip().splitlines()[-1]
    assert last.endswith(
        "stopped by SIGINT; start again with the same arguments to resume the session"
    )


@pytest.mark.slow  # waits out a real join deadline (about 15 s)
def test_a_node_missing_the_join_deadline_is_named_with_what_the_design_needs(
    tmp_path: Path, processes: Processes
) -> None:
    # Collusion threshold 1 (the default): every round needs 3 of the 3 nodes; c never starts.
    federation = init_federation(
        tmp_path / "fed",
        ["a", "b", "c"],
        cohort_sizes=[110, 110, 110],
        join_deadline=10.0,
        round_deadline=4.0,
        nan_policy="drop",
    )
    run = SessionRun(federation, tmp_path / "run", processes)
    # The nodes start first and wait for the coordinator, so that a slow start on a
    # loaded machine does not make them miss the join deadline too.
    nodes = {n: run.start_node(n) for n in ("a", "b")}
    for node in nodes.values():
        wait_until(lambda n=node: "subjects from" in n.stderr(), what=node.name, alive=[node])
    run.start_coordinator()
    for node_id, node in nodes.items():
        assert node.wait(90) == 1, node.describe()
        failed = [line for line in node.stderr().splitlines() if ": failed: " in line]
        # The first to fail withdraws; the other may hear the session end with that reason.
        assert len(failed) == 1, node.stderr()
        # federation init set min_nodes = 3 (T + 2), so the roster itself is refused,
        # naming who did not join and what the minimum is for.
        assert (
            "c did not join before the join deadline, so the final roster has 2 member(s) "
            "(a, b), fewer than the federation's min_nodes = 3 (the fewest nodes with which no "
            "dropout leaves an observer class without noise); this node releases nothing"
        ) in failed[0]
        assert "no pair left" not in node.stderr()
        assert not (run.out(node_id) / "egress" / "round-0" / "payload.npy").exists()
    assert run.coordinator.wait(60) == 1
    logged = run.coordinator.stderr()
    assert "only 2 of 3 nodes joined before the join deadline (c missing)" in logged
