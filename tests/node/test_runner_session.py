"""NodeRunner against a real coordinator on 127.0.0.1 (in-process server, nodes in threads).

The lead's integration suite runs the same protocol with separate processes;
these two sessions pin the runner's own behaviour: the exact aggregate, the
files a node writes, and a survivor's unmask answer when a node drops.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from coordinator.config import SessionConfig
from coordinator.server import RunningServer, ServerTLS, start_server
from coordinator.session import Session
from coordinator.store import Store
from node.deltab import plan as deltab_plan
from node.deltab.model import BrainAgeModel
from node.deltab.persist import load_model
from node.egress.audit import read_audit
from node.egress.bundle import EgressBundle
from node.egress.receipt import entries_layout
from node.plans.deltab.cohort import load_cohort
from node.plans.deltab.plan import plan_settings
from node.runner import GatewayFactory, NodeOptions, NodeRunner, SessionFailed, grpc_gateway
from noise.fixed_point import FixedPointCodec
from proto.federation import config_hash, load_federation
from tests.node.gateways import failing_before_upload
from tests.support.synthetic_init import init_synthetic

pytestmark = pytest.mark.integration


def _federation(out: Path, nodes: str, round_deadline: float, nan_policy: str = "drop") -> Path:
    return init_synthetic(
        out,
        nodes.split(","),
        seed=4,
        n_features=6,
        n_components=3,
        cohort_sizes=",".join(["120", "150", "130", "140"][: len(nodes.split(","))]),
        options=[
            "--coordinator",
            "127.0.0.1:1",
            "--round-deadline",
            str(round_deadline),
            "--join-deadline",
            "30",
            "--nan-policy",
            nan_policy,
        ],
    )


def _serve(fed: Path, state: Path) -> RunningServer:
    config = load_federation(fed / "federation.toml")
    session = Session(
        Store(state / "coordinator.db"), SessionConfig.from_federation(config, config_hash(config))
    )
    tls = ServerTLS(
        (fed / "coordinator" / "server.pem").read_bytes(),
        (fed / "coordinator" / "server.key").read_bytes(),
        (fed / "ca" / "ca.pem").read_bytes(),
    )
    return start_server(session, tls, listen="127.0.0.1:0", tick_seconds=0.1)


@pytest.fixture
def server_factory() -> Iterator[list[RunningServer]]:
    servers: list[RunningServer] = []
    yield servers
    for server in servers:
        server.stop(grace=None)


def _run_nodes(runners: list[NodeRunner]) -> dict[str, object]:
    outcomes: dict[str, object] = {}

    def go(runner: NodeRunner) -> None:
        try:
            outcomes[runner.node_id] = runner.run()
        except BaseException as error:
            outcomes[runner.node_id] = error

    threads = [threading.Thread(target=go, args=(r,)) for r in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def _runner(
    fed: Path, node: str, port: int, tmp: Path, gateway: GatewayFactory = grpc_gateway
) -> NodeRunner:
    return NodeRunner(
        fed,
        node,
        out=tmp / f"out-{node}",
        options=NodeOptions(approve="auto", poll_seconds=0.05, address=f"127.0.0.1:{port}"),
        progress=lambda _line: None,
        gateway=gateway,
    )


def _reference(fed: Path, tmp: Path, rounds: dict[int, tuple[str, list[str]]]) -> BrainAgeModel:
    """The model from Σ of the nodes' un-noised audit payloads (what the aggregate must equal)."""
    config = load_federation(fed / "federation.toml")
    aggregates = {}
    for index, (name, nodes) in rounds.items():
        records = [read_audit(tmp / f"out-{n}", index) for n in nodes]
        total = records[0].payload.copy()
        for record in records[1:]:
            total += record.payload
        layout = entries_layout(records[0].tensors)
        aggregates[name] = layout.decode(total, FixedPointCodec(config.fixed_point_bits))
    return deltab_plan.finish(aggregates, plan_settings(config))


def test_three_nodes_reach_the_exact_pooled_model(
    tmp_path: Path, server_factory: list[RunningServer]
) -> None:
    fed = _federation(tmp_path / "fed", "a,b,c", round_deadline=30.0)
    server = _serve(fed, tmp_path / "state")
    server_factory.append(server)
    runners = [_runner(fed, n, server.port, tmp_path) for n in "abc"]
    outcomes = _run_nodes(runners)
    assert all(not isinstance(o, BaseException) for o in outcomes.values()), outcomes
    # The one round's mask was drawn ahead, right after the roster.
    assert all(
        (o.masks_drawn_ahead, o.masks_drawn_in_round) == (1, 0)  # type: ignore[attr-defined]
        for o in outcomes.values()
    )
    config = load_federation(fed / "federation.toml")
    cohorts = [load_cohort(fed / "nodes" / n / "data.csv", config) for n in "abc"]
    pooled = deltab_plan.run_in_process(
        [(c.features, c.age) for c in cohorts], plan_settings(config)
    )
    model = load_model(tmp_path / "out-a" / "model.json")
    x, age = cohorts[0].features, cohorts[0].age
    assert np.allclose(model.predict_delta(x, age), pooled.predict_delta(x, age), atol=1e-6)
    # Every node holds the same model; each predicts its own cohort only.
    text = (tmp_path / "out-a" / "model.json").read_text()
    assert all((tmp_path / f"out-{n}" / "model.json").read_text() == text for n in "bc")
    lines = (tmp_path / "out-b" / "predictions.csv").read_text().splitlines()
    assert lines[0] == "id,age,brain_age,delta" and len(lines) == 151
    for n in "abc":
        for r in (0,):
            EgressBundle.verify(tmp_path / f"out-{n}" / "egress" / f"round-{r}")
    ledger = json.loads((tmp_path / "out-a" / "ledger.json").read_text())
    assert [e["kind"] for e in ledger["entries"]] == ["release"]
    assert ledger["totals"]["outsider"]["epsilon"] <= config.privacy.epsilon_budget


def _outage_at_scatter(round_name: str) -> None:
    """A node that vanishes after the moments round (as if its TRE went offline)."""
    if round_name == "sums":
        raise SessionFailed("simulated outage")


def test_survivors_unmask_a_dropped_node_and_finish_exactly(
    tmp_path: Path, server_factory: list[RunningServer]
) -> None:
    # Four nodes: with T = 1 a round needs T + 2 = 3 survivors (init's min_nodes).
    fed = _federation(tmp_path / "fed", "a,b,c,d", round_deadline=2.0, nan_policy="mean")
    server = _serve(fed, tmp_path / "state")
    server_factory.append(server)
    runners = [_runner(fed, n, server.port, tmp_path) for n in "abd"]
    runners.append(
        _runner(fed, "c", server.port, tmp_path, failing_before_upload(_outage_at_scatter))
    )
    outcomes = _run_nodes(runners)
    assert isinstance(outcomes["c"], SessionFailed)
    for node in "abd":
        assert not isinstance(outcomes[node], BaseException), outcomes[node]
    reference = _reference(fed, tmp_path, {0: ("means", list("abcd")), 1: ("sums", list("abd"))})
    config = load_federation(fed / "federation.toml")
    cohort = load_cohort(fed / "nodes" / "a" / "data.csv", config)
    model = load_model(tmp_path / "out-a" / "model.json")
    assert np.allclose(
        model.predict_delta(cohort.features, cohort.age),
        reference.predict_delta(cohort.features, cohort.age),
        atol=1e-6,
    )
    ledger = json.loads((tmp_path / "out-a" / "ledger.json").read_text())
    unmask = [e for e in ledger["entries"] if e["kind"] == "unmask"]
    assert len(unmask) == 1 and unmask[0]["details"]["dropped"] == ["c"]
