"""A member that sends a wrong layout header first cannot spoil the round for the others.

Every round's payload layout is public, fixed by the federation config; the
coordinator compares each upload header with it and refuses a different one
to the node that sent it (INVALID_ARGUMENT), before storing a byte. Here node
d joins like everyone else, then uploads round 0 with a layout of its own
before any honest node uploads (the honest nodes wait until it has). The
honest nodes finish with the exact model over their own data; d alone was
refused, and is dropped at the round deadline for never sending a valid
upload.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from coordinator.config import SessionConfig
from coordinator.server import RunningServer, ServerTLS, start_server
from coordinator.session import Session
from coordinator.store import Store
from node.deltab import plan as deltab_plan
from node.deltab.persist import load_model
from node.egress.audit import read_audit
from node.egress.receipt import entries_layout
from node.errors import CoordinatorRefused
from node.plans.deltab.cohort import load_cohort
from node.plans.deltab.plan import plan_settings
from node.protocol.client import GrpcGateway, RetryPolicy
from node.protocol.gateway import CoordinatorGateway
from node.protocol.roster import verify_roster
from node.protocol.statements import sign_upload_statement
from node.runner import NodeOptions, NodeRunner, grpc_gateway
from node.session.context import NodeOptions as Options
from node.session.setup import LocalSetup
from noise.fixed_point import FixedPointCodec
from noise.keys import EphemeralKey, IdentityKey, sign_key_bundle
from noise.layout import Layout, payload_digest
from proto.chunks import payload_spec
from proto.federation import FederationConfig, config_hash, load_federation
from proto.messages import UploadHeader
from tests.node.gateways import FaultyGateway
from tests.support.sealed_sets import signed_set
from tests.support.synthetic_init import init_synthetic

pytestmark = pytest.mark.integration

HONEST = "abc"


def _federation(out: Path) -> Path:
    return init_synthetic(
        out,
        ("a", "b", "c", "d"),
        seed=9,
        n_features=5,
        n_components=2,
        cohort_sizes="120,130,140,150",
        options=[
            "--coordinator",
            "127.0.0.1:1",
            "--round-deadline",
            "3",
            "--join-deadline",
            "30",
        ],
    )


def test_a_wrong_layout_sent_first_is_refused_to_its_sender_alone(tmp_path: Path) -> None:
    fed = _federation(tmp_path / "fed")
    config = load_federation(fed / "federation.toml")
    session = Session(
        Store(tmp_path / "state.sqlite"), SessionConfig.from_federation(config, config_hash(config))
    )
    tls = ServerTLS(
        (fed / "coordinator" / "server.pem").read_bytes(),
        (fed / "coordinator" / "server.key").read_bytes(),
        (fed / "ca" / "ca.pem").read_bytes(),
    )
    server: RunningServer = start_server(session, tls, listen="127.0.0.1:0", tick_seconds=0.05)
    address = f"127.0.0.1:{server.port}"
    sent_first = threading.Event()

    def after_the_attack(round_name: str) -> None:
        assert sent_first.wait(30), "the attacker never sent its header"

    def honest_gateway(setup: LocalSetup, options: Options, say: object) -> CoordinatorGateway:
        return FaultyGateway(grpc_gateway(setup, options, say), after_the_attack)  # type: ignore[arg-type, return-value]

    outcomes: dict[str, object] = {}

    def run(node: str) -> None:
        runner = NodeRunner(
            fed,
            node,
            out=tmp_path / f"out-{node}",
            options=NodeOptions(approve="auto", poll_seconds=0.05, address=address),
            progress=lambda _line: None,
            gateway=honest_gateway,
        )
        try:
            outcomes[node] = runner.run()
        except BaseException as error:
            outcomes[node] = error

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in HONEST]
    for thread in threads:
        thread.start()
    refusal = _attack(fed, config, address, session_id=session.session_id)
    sent_first.set()
    for thread in threads:
        thread.join(timeout=90)
    server.stop(grace=None)

    assert refusal.code == "INVALID_ARGUMENT"
    assert "upload of node 'd' for round 0" in refusal.details
    assert "in this round's layout" in refusal.details
    for node in HONEST:
        assert not isinstance(outcomes[node], BaseException), outcomes[node]
    (dropped,) = session.status().dropped
    assert (dropped.node_id, dropped.round_index) == ("d", 0)

    # The model is the exact fit over the honest nodes' own (audited) sums.
    settings = plan_settings(config)
    aggregates = {}
    for index, name in enumerate(config.plan.round_names):
        records = [read_audit(tmp_path / f"out-{n}", index) for n in HONEST]
        total = records[0].payload.copy()
        for record in records[1:]:
            total += record.payload
        layout = entries_layout(records[0].tensors)
        aggregates[name] = layout.decode(total, FixedPointCodec(config.fixed_point_bits))
    reference = deltab_plan.finish(aggregates, settings)
    cohort = load_cohort(fed / "nodes" / "a" / "data.csv", config)
    features, age = cohort.features, cohort.age
    for node in HONEST:
        model = load_model(tmp_path / f"out-{node}" / "model.json")
        np.testing.assert_allclose(
            model.predict_delta(features, age), reference.predict_delta(features, age), atol=1e-6
        )


def _attack(
    fed: Path, config: FederationConfig, address: str, *, session_id: str
) -> CoordinatorRefused:
    """Node d joins honestly, then uploads round 0 with a layout of its own; the refusal."""
    folder = fed / "nodes" / "d"
    identity = IdentityKey.read_pem(folder / "identity.pem")
    gateway = GrpcGateway.from_files(
        address,
        node_id="d",
        ca_certificate=fed / "ca" / "ca.pem",
        client_certificate=folder / "client.pem",
        client_key=folder / "client.key",
        retry=RetryPolicy(total_seconds=30.0),
    )
    fed_hash = config_hash(config)
    key = EphemeralKey.generate()
    gateway.join(
        sign_key_bundle(
            identity,
            config_hash=fed_hash,
            session_id=session_id,
            node_id="d",
            public_key=key.public_bytes(),
        )
    )
    while not (roster := gateway.roster(session_id)).final:
        threading.Event().wait(0.05)
    verified = verify_roster(
        roster,
        node_id="d",
        own_public_key=key.public_bytes(),
        session_id=session_id,
        config_hash=fed_hash,
        identity_keys=config.identity_keys,
    )
    name = config.plan.round_names[0]
    bogus = Layout.of({"n": (), "everything": (4096,)})
    payload = np.zeros(bogus.size, dtype=np.uint64)
    try:
        gateway.upload(
            UploadHeader(
                session_id=session_id,
                round_index=0,
                round_name=name,
                node_id="d",
                payload=payload_spec(payload, bogus, config.fixed_point_bits),
                roster_hash=verified.roster_hash,
                statement_signature=sign_upload_statement(
                    identity,
                    config_hash=fed_hash,
                    session_id=session_id,
                    round_index=0,
                    round_name=name,
                    roster_hash=verified.roster_hash,
                    payload_digest=payload_digest(payload),
                ),
                self_mask_commitment=bytes(32),
                challenge=signed_set(
                    identity,
                    config_hash=fed_hash,
                    session_id=session_id,
                    round_index=0,
                    kind="contribution",
                    binding=bytes(32),
                    sender="d",
                    bodies={peer: bytes(48) for peer in verified.node_ids if peer != "d"},
                ),
            ),
            payload,
        )
    except CoordinatorRefused as error:
        return error
    finally:
        gateway.close()
    raise AssertionError("the coordinator took an upload with a layout of the uploader's own")
