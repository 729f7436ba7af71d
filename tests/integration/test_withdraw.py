"""A node whose egress its output checker rejects withdraws, and the others finish at once.

Real processes: a coordinator and four nodes, with a round deadline of two
minutes. Node c runs with ``--approve manual``; the test, as c's output
checker, signs a *rejection* of its round-0 egress. c stops and withdraws at
once, so the coordinator drops it without waiting for the deadline: a, b and
d unmask c's pair terms, and the session completes with the exact aggregate
over {a, b, d} in far less time than the deadline. (Four nodes, because with
the default collusion threshold of 1 two survivors could not keep their noise
floor in the next round.) Node a also runs with
``--approve manual``, which holds it at its round-1 gate while the test reads
the coordinator's status (c's reason must be there) over a's own mutual-TLS
channel. The reviewer's comment never leaves c's TRE.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from node.egress.approval import sign_approval, write_approval
from node.egress.bundle import EgressBundle
from node.protocol.client import GrpcGateway
from tests.support.processes import Processes, init_federation
from tests.support.sessions import SessionRun, reference_model, relative_difference

pytestmark = pytest.mark.integration

ROUND_DEADLINE = 120.0
# The round deadline is four times this: finishing within it proves nobody waited.
QUICK = 30.0
SURVIVORS = ("a", "b", "d")
COMMENT = "cell counts below 10 in the sex-by-site table"
WITHDREW = "withdrew from round 0 ('means'): the TRE's output checker rejected this node's egress"


def _reject(run: SessionRun, node_id: str, round_index: int) -> None:
    """As the node's output checker: sign and write a rejection of its bundle."""
    folder = run.at_gate(node_id, round_index)
    signed = sign_approval(
        run.federation.checker(node_id),
        EgressBundle.manifest_sha256(folder),
        "reject",
        reviewer="output checker",
        comment=COMMENT,
    )
    write_approval(folder, signed)


def _status_as(run: SessionRun, node_id: str) -> object:
    nodes = run.federation.root / "nodes" / node_id
    with GrpcGateway.from_files(
        run.address,
        node_id=node_id,
        ca_certificate=run.federation.root / run.federation.config.ca_certificate,
        client_certificate=nodes / "client.pem",
        client_key=nodes / "client.key",
    ) as client:
        return client.status("")


def test_a_rejected_node_withdraws_and_the_others_finish_long_before_the_deadline(
    tmp_path: Path, processes: Processes
) -> None:
    fed = init_federation(
        tmp_path / "fed",
        ("a", "b", "c", "d"),
        cohort_sizes=(150, 120, 130, 140),
        join_deadline=30.0,
        round_deadline=ROUND_DEADLINE,
    )
    run = SessionRun(fed, tmp_path / "withdraw", processes)
    started = time.monotonic()
    run.start_coordinator()
    run.start_node("a", approve="manual")
    run.start_node("b", approve="auto")
    run.start_node("c", approve="manual")
    run.start_node("d", approve="auto")

    _reject(run, "c", 0)
    rejected_at = time.monotonic()
    assert run.nodes["c"].wait(QUICK) == 1, run.describe()
    run.approve("a", 0)
    run.at_gate("a", 1)

    # a waits at its round-1 gate: round 0 was aggregated without c, and the
    # status names c's reason.
    status = _status_as(run, "a")
    dropped = [(d.node_id, d.round_index, d.reason) for d in status.dropped]  # type: ignore[attr-defined]
    assert dropped == [("c", 0, WITHDREW)]
    assert COMMENT not in str(status)

    run.approve("a", 1)
    codes = {"coordinator": run.coordinator.wait(QUICK)}
    finished = time.monotonic()
    codes.update({n: run.nodes[n].wait(QUICK) for n in SURVIVORS})
    assert codes == {"coordinator": 0, "a": 0, "b": 0, "d": 0}, run.describe()
    # Measured from the rejection: the deadline is 120 s away when it comes.
    assert finished - rejected_at < QUICK, run.describe()
    assert finished - started < QUICK, f"the session took {finished - started:.1f} s"

    c_log = run.nodes["c"].stderr()
    assert "withdrew from round 0: the TRE's output checker rejected this node's egress" in c_log
    assert "Traceback" not in c_log
    assert f"node 'c' {WITHDREW}" in run.coordinator.stderr()
    assert COMMENT not in run.coordinator.stderr()
    assert run.state.members() == {"a": "live", "b": "live", "c": "dropped", "d": "live"}
    assert run.state.unmask_attempts(0) == [(SURVIVORS, ("c",))]
    # Nothing of c was released: its ledger holds no release (it was never written at all).
    ledger = run.out("c") / "ledger.json"
    assert not ledger.exists() or not [
        e for e in run.ledger("c")["entries"] if e["kind"] == "release"
    ]

    for round_index in (0, 1):
        published = run.state.result(round_index)
        assert published is not None and published[0] == SURVIVORS
        assert np.array_equal(published[1], run.audit_sum(SURVIVORS, round_index))
    reference = reference_model(fed, SURVIVORS, SURVIVORS)
    for node in SURVIVORS:
        assert relative_difference(run.model(node), reference, fed.holdout()) <= 1e-9
