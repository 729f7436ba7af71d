"""`zerosum coordinator` as a real process: exit codes, progress lines, signals, resume."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

from proto.federation import config_hash, load_federation
from tests.coordinator.coordinator_process import (
    Coordinator,
    _no_leftover_processes,
    federation_dir,
    join,
    nodes_for,
    result,
    reveal_seeds,
    upload,
)
from tests.coordinator.support import zero_sum

# Fixtures defined with the helpers.
__all__ = ["_no_leftover_processes", "federation_dir", "nodes_for"]

pytestmark = pytest.mark.integration


def test_a_completed_session_exits_0_after_every_node_has_the_result(
    federation_dir: Path, nodes_for: object, tmp_path: Path
) -> None:
    config = load_federation(federation_dir / "federation.toml")
    fed_hash = config_hash(config)
    coordinator = Coordinator(
        federation_dir / "federation.toml", "--state", str(tmp_path / "state.sqlite")
    )
    session_id = coordinator.wait_for(r"started session ([0-9a-f]{32})").group(1)
    nodes = nodes_for(coordinator.port)  # type: ignore[operator]
    for node in nodes.values():
        join(node, session_id, fed_hash)
    for round_index, name in enumerate(("means", "sums")):
        layout = config.plan.round(name).layout
        data = zero_sum(("a", "b", "c"), layout.size, seed=round_index)
        for node in nodes.values():
            payload = data.payloads[node.node_id]
            upload(node, session_id, fed_hash, round_index, name, payload=payload, layout=layout)
        reveal_seeds(list(nodes.values()), session_id, fed_hash, round_index)
        for node in nodes.values():
            total = np.frombuffer(result(node, session_id, round_index), dtype="<u8")
            np.testing.assert_array_equal(total, data.total(["a", "b", "c"]))
    assert coordinator.finish() == 0
    text = "\n".join(coordinator.seen)
    assert "roster final: a, b, c joined" in text
    assert "round 1 ('sums') ready" in text
    assert f"session {session_id} completed" in text


def test_sigterm_stops_cleanly_and_a_restart_resumes_the_same_session(
    federation_dir: Path, nodes_for: object, tmp_path: Path
) -> None:
    fed_hash = config_hash(load_federation(federation_dir / "federation.toml"))
    state = str(tmp_path / "state.sqlite")
    first = Coordinator(federation_dir / "federation.toml", "--state", state)
    session_id = first.wait_for(r"started session ([0-9a-f]{32})").group(1)
    nodes = nodes_for(first.port)  # type: ignore[operator]
    join(nodes["a"], session_id, fed_hash)
    first.wait_for("node 'a' joined")
    first.process.send_signal(signal.SIGTERM)
    assert first.finish() == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in first.seen[-1]
    second = Coordinator(federation_dir / "federation.toml", "--state", state)
    second.wait_for(f"resumed session {session_id}")
    second.process.send_signal(signal.SIGINT)
    assert second.finish() == 128 + signal.SIGINT


def test_a_failed_session_exits_1_with_the_reason(
    federation_dir: Path, nodes_for: object, tmp_path: Path
) -> None:
    text = (federation_dir / "federation.toml").read_text()
    quick = tmp_path / "federation.toml"
    quick.write_text(
        text.replace("join_deadline_seconds = 120.0", "join_deadline_seconds = 1.0").replace(
            'ca_certificate = "ca/ca.pem"', f'ca_certificate = "{federation_dir / "ca" / "ca.pem"}"'
        )
    )
    coordinator = Coordinator(
        quick, "--tls-dir", str(federation_dir / "coordinator"), "--linger", "0.5"
    )
    session_id = coordinator.wait_for(r"started session ([0-9a-f]{32})").group(1)
    nodes = nodes_for(coordinator.port)  # type: ignore[operator]
    join(nodes["a"], session_id, config_hash(load_federation(quick)))
    assert coordinator.finish() == 1
    assert coordinator.seen[-1].endswith(
        f"session {session_id} failed: only 1 of 3 nodes joined before the join deadline "
        "(b, c missing); the federation requires at least 3"
    )
    assert (tmp_path / "coordinator" / "state.sqlite").is_file()
