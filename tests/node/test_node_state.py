"""A node's state folder across sessions: the budget binds over them, replayed ids are refused.

Real coordinators (SQLite state, gRPC over mutual TLS on 127.0.0.1) and real
node runners in threads. Every node keeps one state folder (the federation
folder's default ``nodes/<id>/state/``) over several sessions, each with its
own output folder. A replaying coordinator is one whose state file was
created with the id of a session the node took part in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from coordinator.config import SessionConfig
from coordinator.server import RunningServer, ServerTLS, start_server
from coordinator.session import Session
from coordinator.store import Store
from node.egress.bundle import EgressBundle
from node.errors import NodeRefused, SessionFailed
from node.protocol.gateway import CoordinatorGateway
from node.records.state_folder import NodeState
from node.runner import GatewayFactory, NodeOptions, NodeRunner, RunOutcome, grpc_gateway
from node.session.setup import LocalSetup
from noise.accounting import gaussian_epsilon, gaussian_mu
from noise.keys import KeyBundle
from proto.federation import config_hash, load_federation
from proto.messages import JoinReceipt, UploadHeader, UploadReceipt
from tests.node.gateways import failing_before_upload
from tests.support.runner_threads import run_side_by_side
from tests.support.synthetic_init import init_synthetic
from zerosum import cli

NODES = ("a", "b", "c", "d")
DELTA = 1e-6
MU_STAR = gaussian_mu(1.0, DELTA)


def _federation(out: Path, budget: float) -> Path:
    return init_synthetic(
        out,
        NODES,
        seed=11,
        n_features=5,
        n_components=2,
        cohort_sizes="120,130,140,150",
        options=[
            "--coordinator",
            "127.0.0.1:1",
            "--nan-policy",
            "drop",  # one release per session
            "--delta",
            str(DELTA),
            "--epsilon-budget",
            str(budget),
            "--round-deadline",
            "60",
            "--join-deadline",
            "60",
            # One release per session exactly: the tests count sessions against the budget.
            "--max-reruns",
            "0",
        ],
    )


@dataclass
class Coordinator:
    session: Session
    server: RunningServer
    store: Store

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def uploaders(self, round_index: int) -> set[str]:
        return {u.node_id for u in self.store.uploads(round_index)}


@contextmanager
def _coordinator(fed: Path, state: Path, *, session_id: str | None = None) -> Iterator[Coordinator]:
    """A coordinator on a fresh state file; with ``session_id`` it presents that id again."""
    config = load_federation(fed / "federation.toml")
    session_config = SessionConfig.from_federation(config, config_hash(config))
    store = Store(state)
    if session_id is not None:
        now = int(time.time() * 1000)
        with store.transaction():
            store.create_session(
                session_id=session_id,
                config_hash=session_config.config_hash,
                federation_id=config.federation_id,
                created_ms=now,
                join_deadline_ms=now + session_config.join_timeout_ms,
            )
    session = Session(store, session_config)
    tls = ServerTLS(
        (fed / "coordinator" / "server.pem").read_bytes(),
        (fed / "coordinator" / "server.key").read_bytes(),
        (fed / "ca" / "ca.pem").read_bytes(),
    )
    server = start_server(session, tls, listen="127.0.0.1:0", tick_seconds=0.05)
    try:
        yield Coordinator(session, server, store)
    finally:
        server.stop(grace=None)
        store.close()


def _run(
    fed: Path,
    coordinator: Coordinator,
    folder: Path,
    *,
    fresh_state: Sequence[str] = (),
    gateways: dict[str, GatewayFactory] | None = None,
    nodes: Sequence[str] = NODES,
) -> dict[str, object]:
    """Every node of ``nodes`` through one session; OUT in ``folder``, STATE the default one.

    Nodes in ``fresh_state`` use a state folder of their own in ``folder``
    (a node with nothing spent yet).
    """

    def runner_for(node: str) -> NodeRunner:
        return NodeRunner(
            fed,
            node,
            out=folder / f"out-{node}",
            state=folder / f"state-{node}" if node in fresh_state else None,
            options=NodeOptions(approve="auto", poll_seconds=0.02, address=coordinator.address),
            progress=lambda _line: None,
            gateway=(gateways or {}).get(node, grpc_gateway),
        )

    outcomes = run_side_by_side(nodes, runner_for, timeout=120)
    return outcomes


def _completed(outcomes: dict[str, object]) -> str:
    for node, outcome in outcomes.items():
        assert isinstance(outcome, RunOutcome), (node, outcome)
    (session_id,) = {o.session_id for o in outcomes.values() if isinstance(o, RunOutcome)}
    return session_id


def _state(fed: Path, node: str = "a") -> NodeState:
    return NodeState(fed / "nodes" / node / "state", node)


def _epsilon(sessions: int) -> float:
    """ε after ``sessions`` releases that each meet (1, δ) against 1 colluding node."""
    return gaussian_epsilon(MU_STAR * sessions**0.5, DELTA)


def test_the_budget_binds_across_sessions_and_the_second_is_refused_at_start(
    tmp_path: Path,
) -> None:
    fed = _federation(tmp_path / "fed", budget=1.2)
    with _coordinator(fed, tmp_path / "s1.sqlite") as first:
        done = _completed(_run(fed, first, tmp_path / "s1"))
    ledger = json.loads(_state(fed).ledger_path.read_text())
    assert ledger["totals"]["colluders:1"]["epsilon"] == pytest.approx(1.0, rel=1e-9)
    assert [s.stage for s in _state(fed).sessions()] == ["completed"]
    # The session's OUT keeps a copy of the node's ledger.
    assert (
        json.loads((tmp_path / "s1" / "out-a" / "ledger.json").read_text())["entries"]
        == (ledger["entries"])
    )

    with _coordinator(fed, tmp_path / "s2.sqlite") as second:
        outcomes = _run(fed, second, tmp_path / "s2", fresh_state=("b", "c", "d"))
        refused = outcomes["a"]
        assert isinstance(refused, NodeRefused), refused
        text = str(refused)
        session_id = second.session.session_id
        assert session_id != done
        assert f"session {session_id} (1 release among 4 nodes: sums)" in text
        assert (
            f"against an outsider with 1 colluding node (colluders:1) to ε = {_epsilon(2):.4g} "
            "over 2 releases (1 new; the ledger holds ε = 1 over 1)"
        ) in text
        assert "above the budget of 1.2 (privacy.epsilon_budget, over every session" in text
        # Without residual noise the coordinator is unbounded by design: listed, not checked.
        assert "not held to the budget: coordinator, coalition:1" in text
        assert "nothing was sent" in text
        # Nothing of a's data left; it withdrew. The others, fresh ledgers and all, do
        # not reveal their pair terms with a either: one colluder holding an answer
        # would know two of a survivor's three terms, ε = _epsilon(2) > 1.2 for one release.
        assert "a" not in second.uploaders(0)
        assert _epsilon(2) > 1.2
        assert not [n for n in "bcd" if isinstance(outcomes[n], RunOutcome)], outcomes
        reasons = [str(outcomes[n]) for n in "bcd" if isinstance(outcomes[n], NodeRefused)]
        assert reasons, outcomes
        for reason in reasons:
            assert "revealing my pair terms with {a} in round 0" in reason, reason
            assert "(colluders:1)" in reason and "above the budget of 1.2" in reason
        dropped = {d.node_id: d.reason for d in second.session.status().dropped}
        assert "above the budget" in dropped["a"]
    record = _state(fed).entry(session_id)
    assert record is not None and record.stage == "failed" and record.released == ()
    assert "above the budget" in record.reason
    # The ledger still holds the first session's one release only.
    assert json.loads(_state(fed).ledger_path.read_text())["totals"]["outsider"]["releases"] == 1


def test_a_cap_that_admits_two_sessions_refuses_the_third(tmp_path: Path) -> None:
    fed = _federation(tmp_path / "fed", budget=1.6)
    assert _epsilon(2) < 1.6 < _epsilon(3)
    for label in ("s1", "s2"):
        with _coordinator(fed, tmp_path / f"{label}.sqlite") as coordinator:
            _completed(_run(fed, coordinator, tmp_path / label))
    assert [s.stage for s in _state(fed).sessions()] == ["completed", "completed"]
    with _coordinator(fed, tmp_path / "s3.sqlite") as third:
        outcomes = _run(fed, third, tmp_path / "s3", fresh_state=("b", "c", "d"))
        refused = outcomes["a"]
        assert isinstance(refused, NodeRefused), refused
        assert (
            f"to ε = {_epsilon(3):.4g} over 3 releases (1 new; the ledger holds "
            f"ε = {_epsilon(2):.4g} over 2)"
        ) in str(refused)
        assert "a" not in third.uploaders(0)


def _node_command(fed: Path, out: Path, address: str, capsys: pytest.CaptureFixture[str]) -> str:
    """``zerosum node`` for node a, expected to exit 1; its stderr."""
    capsys.readouterr()
    args = ["--federation", str(fed), "--node-id", "a", "--out", str(out)]
    code = cli.main(["node", *args, "--coordinator", address])
    assert code == 1
    return capsys.readouterr().err


def test_a_completed_session_presented_again_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fed = _federation(tmp_path / "fed", budget=4.0)
    with _coordinator(fed, tmp_path / "s1.sqlite") as first:
        done = _completed(_run(fed, first, tmp_path / "s1"))
    joined = _state(fed).entry(done)
    assert joined is not None
    with _coordinator(fed, tmp_path / "replay.sqlite", session_id=done) as replay:
        assert replay.session.session_id == done
        for out in (tmp_path / "s1" / "out-a", tmp_path / "fresh-out"):
            err = _node_command(fed, out, replay.address, capsys)
            assert f"refusing session {done}: this node took part in it from {joined.joined}" in err
            assert "a completed session is never taken part in again" in err
            assert "replaying that session" in err
            assert "Nothing was sent" in err
        # The node never joined the replayed session.
        assert replay.session.status().joined == ()
    assert len(json.loads(_state(fed).ledger_path.read_text())["entries"]) == 1


def test_a_session_the_node_released_in_presented_again_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fed = _federation(tmp_path / "fed", budget=4.0)

    def outage(round_name: str) -> None:
        raise SessionFailed("the TRE lost its connection")  # after the release was recorded

    with _coordinator(fed, tmp_path / "s1.sqlite") as first:
        # Every node loses its connection, so none waits for a round deadline.
        lost = {node: failing_before_upload(outage) for node in NODES}
        outcomes = _run(fed, first, tmp_path / "s1", gateways=lost)
        assert isinstance(outcomes["a"], SessionFailed), outcomes["a"]
        session_id = first.session.session_id
    record = _state(fed).entry(session_id)
    assert record is not None and record.released == (0,) and record.stage == "failed"
    with _coordinator(fed, tmp_path / "replay.sqlite", session_id=session_id) as replay:
        err = _node_command(fed, tmp_path / "fresh-out", replay.address, capsys)
        assert f"refusing session {session_id}: this node took part in it" in err
        assert "released round 0" in err
        assert f"{tmp_path / 'fresh-out'} holds no saved session key for it" in err
        assert "replaying that session" in err
        assert replay.session.status().joined == ()
    releases = [
        e
        for e in json.loads(_state(fed).ledger_path.read_text())["entries"]
        if e["kind"] == "release"
    ]
    assert len(releases) == 1


def test_the_state_folder_admits_one_running_node(tmp_path: Path) -> None:
    fed = _federation(tmp_path / "fed", budget=4.0)
    with _coordinator(fed, tmp_path / "s1.sqlite") as coordinator, _state(fed).exclusive():
        outcome = _run(fed, coordinator, tmp_path / "s1", nodes=("a",))["a"]
        assert isinstance(outcome, SessionFailed), outcome
        assert f"the state folder {fed / 'nodes' / 'a' / 'state'} is in use" in str(outcome)
        assert coordinator.session.status().joined == ()


class _Witness:
    """The real gateway; before a join and an upload it reads what the state folder holds."""

    def __init__(self, inner: CoordinatorGateway, state: NodeState, out: Path) -> None:
        self._inner = inner
        self._state = state
        self._out = out
        self.seen: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def join(self, bundle: KeyBundle) -> JoinReceipt:
        entry = self._state.entry(bundle.session_id)
        assert entry is not None and entry.public_key == bundle.public_key.hex()
        self.seen.append("session recorded before its key was sent")
        return self._inner.join(bundle)

    def upload(self, header: UploadHeader, payload: NDArray[np.uint64]) -> UploadReceipt:
        # The ledger keys the release on its egress (the bundle's payload); what
        # leaves is that egress under the round's self-mask.
        bundle = EgressBundle.read(self._out / "egress" / f"round-{header.round_index}")
        digest = bundle.payload_sha256
        ledger = json.loads(self._state.ledger_path.read_text())
        assert digest in [e["details"].get("payload_sha256") for e in ledger["entries"]]
        entry = self._state.entry(header.session_id)
        assert entry is not None and header.round_index in entry.released
        self.seen.append("release recorded before its bytes left")
        return self._inner.upload(header, payload)


def test_the_records_are_on_disk_before_the_key_and_the_bytes_leave(tmp_path: Path) -> None:
    fed = _federation(tmp_path / "fed", budget=4.0)
    witnesses: list[_Witness] = []

    def witnessed(
        setup: LocalSetup, options: NodeOptions, say: Callable[[str], None]
    ) -> CoordinatorGateway:
        witness = _Witness(
            grpc_gateway(setup, options, say), NodeState(setup.state, "a"), setup.out
        )
        witnesses.append(witness)
        return witness  # type: ignore[return-value]

    with _coordinator(fed, tmp_path / "s1.sqlite") as coordinator:
        _completed(_run(fed, coordinator, tmp_path / "s1", gateways={"a": witnessed}))
    (witness,) = witnesses
    assert witness.seen == [
        "session recorded before its key was sent",
        "release recorded before its bytes left",
    ]


def test_a_ledger_or_session_list_lost_after_a_session_stops_the_node(tmp_path: Path) -> None:
    """STATE/ledger.json deleted (a) or STATE/sessions.json deleted (b): refused before joining.

    Each OUT is made afresh for the second session, so no copy of the ledger
    in OUT can stand in for the lost file.
    """
    fed = _federation(tmp_path / "fed", budget=4.0)
    with _coordinator(fed, tmp_path / "s1.sqlite") as first:
        done = _completed(_run(fed, first, tmp_path / "s1"))
    _state(fed, "a").ledger_path.unlink()
    _state(fed, "b").sessions_path.unlink()
    with _coordinator(fed, tmp_path / "s2.sqlite") as second:
        outcomes = _run(fed, second, tmp_path / "s2", nodes=("a", "b"))
        assert second.store.members() == []
    lost_ledger, lost_sessions = outcomes["a"], outcomes["b"]
    assert isinstance(lost_ledger, SessionFailed), lost_ledger
    text = str(lost_ledger)
    assert f"records that this node released round 0 of session {done} " in text, text
    assert "does not exist, and so holds no release of it" in text, text
    assert "the ε budget would start again below what this node has spent" in text, text
    assert isinstance(lost_sessions, SessionFailed), lost_sessions
    text = str(lost_sessions)
    assert f"holds entries of session {done}, but " in text, text
    assert "sessions.json does not exist" in text and "Nothing was sent" in text, text
    # Neither file was rewritten to fit the other.
    assert not _state(fed, "a").ledger_path.exists()
    assert not _state(fed, "b").sessions_path.exists()
