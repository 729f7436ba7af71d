"""A coordinator whose certificate the federation revoked: the nodes refuse it before they join.

Real processes: the coordinator starts with a federation.toml that does not
list its certificate (it holds a leaked, since revoked, key and an old copy
of the config); the nodes' federation.toml lists the certificate's
fingerprint in ``revoked``. gRPC's TLS layer accepts the certificate (the
federation CA issued it), so only the node's own check of the certificate
the coordinator presents stands between them: each node must stop with
exit 2 and a sentence naming the fingerprint, having sent nothing — the
coordinator's state holds no join.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from proto.tls import certificate_fingerprint
from tests.adversary.scenario import Processes
from tests.support.processes import init_federation
from tests.support.sessions import SessionRun

pytestmark = pytest.mark.integration


def test_nodes_refuse_a_revoked_coordinator_certificate(
    tmp_path: Path, processes: Processes
) -> None:
    fed = init_federation(
        tmp_path / "fed",
        ("a", "b", "c"),
        cohort_sizes=(120, 120, 120),
        join_deadline=20.0,
        round_deadline=20.0,
        nan_policy="drop",
    )
    run = SessionRun(fed, tmp_path / "run", processes)
    run.start_coordinator()
    pem = (fed.root / "coordinator" / "server.pem").read_bytes()
    fingerprint = certificate_fingerprint(x509.load_pem_x509_certificate(pem))
    text = fed.toml.read_text()
    assert "\n[privacy]" in text
    fed.toml.write_text(text.replace("\n[privacy]", f'revoked = ["{fingerprint}"]\n\n[privacy]', 1))

    nodes = [run.start_node(node) for node in ("a", "b")]
    for spawned in nodes:
        assert spawned.wait(timeout=30) == 2, spawned.describe()
        err = spawned.stderr()
        assert "Traceback" not in err, err
        assert (
            f"refusing the coordinator at {run.address}: the certificate of the coordinator " in err
        )
        assert f"(SHA-256 {fingerprint}) is revoked by this federation" in err, err
        assert "Nothing was sent" in err, err
    assert run.coordinator.running()
    assert run.state.members() == {}
