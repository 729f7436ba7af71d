"""Whole sessions through the in-process gateway: real node runners, a real coordinator, no network.

The node runs exactly as it does over gRPC (``node.runner.NodeRunner`` with
``zerosum.inprocess.InProcessGateway``); the coordinator is the real session
state machine over a real SQLite file. A plain session reaches the pooled
model; a node that vanishes is unmasked by the survivors; a refusal of the
coordinator reaches the node as the same status and sentence as over gRPC.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from coordinator.config import SessionConfig
from coordinator.session import Session
from coordinator.store import Store
from node.deltab import plan as deltab_plan
from node.deltab.persist import load_model
from node.errors import CoordinatorRefused, SessionFailed
from node.plans.deltab.cohort import load_cohort
from node.plans.deltab.plan import plan_settings
from node.protocol.gateway import CoordinatorGateway
from node.runner import NodeOptions, NodeRunner
from node.session.setup import LocalSetup
from noise.keys import EphemeralKey, IdentityKey, sign_key_bundle
from proto.federation import config_hash, load_federation
from proto.messages import RoundResult
from tests.node.gateways import FaultyGateway
from tests.support.runner_threads import run_side_by_side
from tests.support.synthetic_init import init_synthetic
from zerosum.inprocess import InProcessGateway, Ticker


def _federation(out: Path, *extra: str) -> Path:
    return init_synthetic(
        out,
        ("a", "b", "c", "d"),
        seed=21,
        n_features=5,
        n_components=2,
        cohort_sizes="120,130,140,150",
        options=[
            # The lost node's round waits this long; the three others must
            # submit within it on a loaded machine too (2 s was not always enough).
            "--round-deadline",
            "4",
            "--join-deadline",
            "30",
            *extra,
        ],
    )


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[tuple[Path, Session]]:
    fed = _federation(tmp_path / "fed", "--nan-policy", "mean")
    config = load_federation(fed / "federation.toml")
    session = Session(
        Store(tmp_path / "state.sqlite"), SessionConfig.from_federation(config, config_hash(config))
    )
    ticker = Ticker(session)
    ticker.start()
    yield fed, session
    ticker.stop()
    session.store.close()


def _run(
    fed: Path,
    session: Session,
    tmp_path: Path,
    nodes: str,
    wrap: Callable[[CoordinatorGateway], CoordinatorGateway] = lambda g: g,
) -> dict[str, object]:
    def gateway(
        setup: LocalSetup, options: NodeOptions, say: Callable[[str], None]
    ) -> CoordinatorGateway:
        return wrap(InProcessGateway(session, setup.node_id))

    def runner_for(node: str) -> NodeRunner:
        return NodeRunner(
            fed,
            node,
            out=tmp_path / f"out-{node}",
            options=NodeOptions(approve="auto", poll_seconds=0.02),
            progress=lambda _line: None,
            gateway=gateway,
        )

    return run_side_by_side(nodes, runner_for, timeout=60)


def _pooled(fed: Path, nodes: str) -> deltab_plan.BrainAgeModel:
    config = load_federation(fed / "federation.toml")
    cohorts = [load_cohort(fed / "nodes" / n / "data.csv", config) for n in nodes]
    return deltab_plan.run_in_process([(c.features, c.age) for c in cohorts], plan_settings(config))


def test_four_nodes_in_process_reach_the_pooled_model(
    coordinator: tuple[Path, Session], tmp_path: Path
) -> None:
    fed, session = coordinator
    outcomes = _run(fed, session, tmp_path, "abcd")
    assert all(not isinstance(o, BaseException) for o in outcomes.values()), outcomes
    assert session.state() == "completed"
    pooled = _pooled(fed, "abcd")
    cohort = load_cohort(fed / "nodes" / "a" / "data.csv", load_federation(fed / "federation.toml"))
    for node in "abcd":
        model = load_model(tmp_path / f"out-{node}" / "model.json")
        np.testing.assert_allclose(
            model.predict_delta(cohort.features, cohort.age),
            pooled.predict_delta(cohort.features, cohort.age),
            atol=1e-6,
        )


def test_a_node_lost_after_the_first_round_is_unmasked_in_process(
    coordinator: tuple[Path, Session], tmp_path: Path
) -> None:
    fed, session = coordinator

    def outage(round_name: str) -> None:
        if round_name == "sums":
            raise SessionFailed("simulated outage")

    def wrap(gateway: CoordinatorGateway) -> CoordinatorGateway:
        if gateway.node_id == "d":
            return FaultyGateway(gateway, outage)  # type: ignore[return-value]
        return gateway

    outcomes = _run(fed, session, tmp_path, "abcd", wrap)
    assert isinstance(outcomes["d"], SessionFailed)
    for node in "abc":
        assert not isinstance(outcomes[node], BaseException), outcomes[node]
    (dropped,) = session.status().dropped
    assert (dropped.node_id, dropped.round_index) == ("d", 1)
    ledger = (tmp_path / "out-a" / "ledger.json").read_text()
    assert '"kind": "unmask"' in ledger


def test_a_refusal_reaches_the_node_with_its_status_and_sentence(
    coordinator: tuple[Path, Session],
) -> None:
    fed, session = coordinator
    gateway = InProcessGateway(session, "a")
    config = load_federation(fed / "federation.toml")
    stranger = sign_key_bundle(
        IdentityKey.generate(),
        config_hash=config_hash(config),
        session_id=session.session_id,
        node_id="a",
        public_key=EphemeralKey.generate().public_bytes(),
    )
    with pytest.raises(CoordinatorRefused) as caught:
        gateway.join(stranger)
    assert caught.value.code == "UNAUTHENTICATED"
    assert "does not verify against the pinned identity key" in caught.value.details
    assert gateway.status(session.session_id).joined == ()


class Forging:
    """What a lying coordinator shows: the genuine statements with a forged aggregate.

    The first round's published sum has its count raised by 1000 and its age sum
    times 1.5, everything else (survivors, statements, tags) left as published.
    """

    def __init__(self, inner: CoordinatorGateway) -> None:
        self._inner = inner
        self.node_id = inner.node_id

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def result(self, session_id: str, round_index: int) -> RoundResult:
        result = self._inner.result(session_id, round_index)
        if result.aggregate is None or result.layout is None or round_index != 0:
            return result
        forged = result.aggregate.copy()
        first = next(iter(result.layout))
        forged[first.offset] += np.uint64(1000 << 32)
        return dataclasses.replace(result, aggregate=forged)


def test_a_forged_aggregate_with_the_genuine_statements_is_refused_by_every_node(
    coordinator: tuple[Path, Session], tmp_path: Path
) -> None:
    fed, session = coordinator
    outcomes = _run(fed, session, tmp_path, "abcd", Forging)  # type: ignore[arg-type]
    for node in "abcd":
        outcome = outcomes[node]
        assert isinstance(outcome, SessionFailed), outcome
        assert "fails 4 of 4 secret checks" in str(outcome)
        assert "the coordinator is at fault (forged or corrupted sum)" in str(outcome)
        assert not (tmp_path / f"out-{node}" / "model.json").exists()
