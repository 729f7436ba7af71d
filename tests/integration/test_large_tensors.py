"""Payloads of about 21 MB per node reach a real coordinator process in chunks and sum exactly.

gRPC refuses single messages above 4 MiB by default (the coordinator sets
2 MiB), so a 2.6·10^6-word uint64 payload can only arrive as a stream of
chunks. Three clients — node/protocol/client.py's GrpcGateway, with the
federation's TLS certificates and identity keys — join with signed key
bundles and upload full-range random words laid out as two named tensors;
the coordinator knows nothing of their meaning and only sums them. Each
upload carries the node's signed upload statement over the roster it
verified, and every node checks the statements that come back with the
aggregate (node/protocol/statements.py). The downloaded aggregate must equal the
wrapping sum bit for bit, a repeated upload must be acknowledged as a
duplicate, and the session must complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from node.protocol.client import CHUNK_BYTES, GrpcGateway, RetryPolicy
from node.protocol.roster import VerifiedRoster, verify_roster
from node.protocol.statements import check_statements, sign_upload_statement
from node.protocol.unmask import attestation_signature
from noise.fixed_point import wrapping_sum
from noise.keys import EphemeralKey, sign_key_bundle
from noise.layout import Layout, TensorSlot, payload_digest
from noise.self_mask import self_mask, self_mask_commitment
from proto.chunks import payload_spec
from proto.federation import RoundSpec, config_hash, dump_federation, load_federation
from proto.messages import Attestation, RoundState, Sealed, UploadHeader, UploadReceipt
from tests.support.federations import three_cohort_federation
from tests.support.processes import Federation, Processes
from tests.support.sealed_sets import signed_set
from tests.support.sessions import SessionRun

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")
WORDS = 2_600_000
LAYOUT = Layout(
    (
        TensorSlot("block", (1000, 1300), 0, 1_300_000),
        TensorSlot("tail", (1_300_000,), 1_300_000, 1_300_000),
    )
)


SMALL = Layout.of({"v": (8,)})


@pytest.fixture
def session(tmp_path: Path, processes: Processes) -> SessionRun:
    made = three_cohort_federation(tmp_path / "federation", NODES, 120)
    # The coordinator takes every round's layout from the config: a plan of a
    # 20 MB round and a small last one.
    plan = dataclasses.replace(
        made.config.plan, rounds=(RoundSpec("means", LAYOUT), RoundSpec("sums", SMALL))
    )
    config = dataclasses.replace(made.config, plan=plan)
    made.toml.write_text(dump_federation(config))
    federation = Federation(made.root, load_federation(made.toml))
    run = SessionRun(federation, tmp_path / "session", processes)
    run.start_coordinator()
    return run


@pytest.fixture
def clients(session: SessionRun) -> Iterator[dict[str, GrpcGateway]]:
    root = session.federation.root
    made = {
        node: GrpcGateway.from_files(
            session.address,
            node_id=node,
            ca_certificate=root / "ca" / "ca.pem",
            client_certificate=root / "nodes" / node / "client.pem",
            client_key=root / "nodes" / node / "client.key",
            retry=RetryPolicy(total_seconds=60.0),
        )
        for node in NODES
    }
    yield made
    for client in made.values():
        client.close()


def _join(federation: Federation, client: GrpcGateway, session_id: str) -> EphemeralKey:
    key = EphemeralKey.generate()
    bundle = sign_key_bundle(
        federation.identity(client.node_id),
        config_hash=config_hash(federation.config),
        session_id=session_id,
        node_id=client.node_id,
        public_key=key.public_bytes(),
    )
    client.join(bundle)
    return key


def _roster(
    federation: Federation, client: GrpcGateway, session_id: str, key: EphemeralKey
) -> VerifiedRoster:
    return verify_roster(
        client.roster(session_id),
        node_id=client.node_id,
        own_public_key=key.public_bytes(),
        session_id=session_id,
        config_hash=config_hash(federation.config),
        identity_keys=federation.config.identity_keys,
        min_nodes=federation.config.min_nodes,
    )


def _seed(node: str, round_index: int) -> bytes:
    return hashlib.sha256(f"self-mask of {node} in round {round_index}".encode()).digest()


def test_twenty_megabyte_payloads_sum_exactly(  # noqa: PLR0915 - one session end to end; its steps are closures over its clients
    session: SessionRun, clients: dict[str, GrpcGateway]
) -> None:
    federation = session.federation
    bits = federation.config.fixed_point_bits
    fed_hash = config_hash(federation.config)
    session_id = clients["a"].status("").session_id
    keys = {node: _join(federation, client, session_id) for node, client in clients.items()}
    rosters = {node: _roster(federation, clients[node], session_id, keys[node]) for node in NODES}
    current = clients["a"].status(session_id).current
    assert current is not None and (current.index, current.name) == (0, "means")

    rng = np.random.default_rng(20240611)
    payloads = {
        node: rng.integers(0, 2**64 - 1, WORDS, dtype=np.uint64, endpoint=True) for node in NODES
    }
    assert payloads["a"].nbytes >= 20_000_000 > 4 * CHUNK_BYTES

    def _signed(
        node: str, round_index: int, kind: str, binding: bytes, *, size: int
    ) -> tuple[Sealed, ...]:
        """``size`` zero bytes for every other node under ``node``'s one signature."""
        return signed_set(
            federation.identity(node),
            config_hash=fed_hash,
            session_id=session_id,
            round_index=round_index,
            kind=kind,
            binding=binding,
            sender=node,
            bodies={peer: bytes(size) for peer in NODES if peer != node},
        )

    def send(
        node: str,
        round_index: int,
        round_name: str,
        payload: NDArray[np.uint64],
        layout: Layout,
    ) -> UploadReceipt:
        roster = rosters[node].roster_hash
        # As a node does: the payload leaves under its self-mask.
        seed = _seed(node, round_index)
        sent = payload + self_mask(seed, layout, round_index=round_index)
        digest = payload_digest(sent)
        return clients[node].upload(
            UploadHeader(
                session_id=session_id,
                round_index=round_index,
                round_name=round_name,
                node_id=node,
                payload=payload_spec(None, layout, bits, digest=digest),
                roster_hash=roster,
                statement_signature=sign_upload_statement(
                    federation.identity(node),
                    config_hash=fed_hash,
                    session_id=session_id,
                    round_index=round_index,
                    round_name=round_name,
                    roster_hash=roster,
                    payload_digest=digest,
                ),
                self_mask_commitment=self_mask_commitment(seed),
                # The coordinator relays these unread; this test checks no aggregate tags.
                challenge=_signed(node, round_index, "contribution", bytes(32), size=48),
            ),
            sent,
        )

    def unmask(round_index: int, layout: Layout) -> None:
        """The round's unmask step: every node signs the survivor set, then reveals its seed."""
        for node in NODES:
            ask = clients[node].result(session_id, round_index).unmask_request
            assert ask is not None and ask.dropped == ()
            clients[node].attest(
                Attestation(
                    node,
                    ask.survivor_hash,
                    attestation_signature(
                        federation.identity(node),
                        config_hash=fed_hash,
                        session_id=session_id,
                        round_index=round_index,
                        survivor_hash=ask.survivor_hash,
                    ),
                    session_id=session_id,
                    round_index=round_index,
                    tags=_signed(node, round_index, "tags", ask.survivor_hash, size=80),
                )
            )
        for node in NODES:
            ask = clients[node].result(session_id, round_index).unmask_request
            assert ask is not None and len(ask.attestations) == len(NODES)
            clients[node].submit_unmask(ask.answer(node, _seed(node, round_index), None), None)

    def upload(node: str) -> UploadReceipt:
        return send(node, 0, "means", payloads[node], LAYOUT)

    started = time.monotonic()
    with ThreadPoolExecutor(len(NODES)) as pool:
        receipts = dict(zip(NODES, pool.map(upload, NODES), strict=True))
    upload_seconds = time.monotonic() - started
    for node, receipt in receipts.items():
        assert receipt.received_bytes == payloads[node].nbytes
        assert not receipt.duplicate
    # Every upload is on disk and in the state file before it is acknowledged.
    assert session.state.uploads(0) == set(NODES)
    unmask(0, LAYOUT)

    expected = wrapping_sum(list(payloads.values()))
    for node in NODES:
        header = clients[node].result(session_id, 0)
        aggregate = header.aggregate
        assert header.state == RoundState.READY
        assert header.survivors == NODES
        assert header.layout == LAYOUT
        assert aggregate is not None and np.array_equal(aggregate, expected)
        # Every contributor signed for the roster this node verified, and the
        # aggregate counts exactly the payload this node sent.
        check_statements(
            header,
            config_hash=fed_hash,
            session_id=session_id,
            round_index=0,
            roster_hash=rosters[node].roster_hash,
            identity_keys=federation.config.identity_keys,
            own_node_id=node,
            own_digest=clients[node].uploaded_digest(session_id, 0),
            participants=NODES,
        )
        assert [s.node_id for s in header.statements] == list(NODES)
    stored = session.state.result(0)
    assert stored is not None and np.array_equal(stored[1], expected)

    # The same 21 MB again: acknowledged as already received, nothing changes.
    again = upload("b")
    assert again.duplicate and again.digest == receipts["b"].digest
    unchanged = clients["c"].result(session_id, 0).aggregate
    assert unchanged is not None and np.array_equal(unchanged, expected)

    # A small last round lets the session complete and the coordinator exit.
    small = SMALL
    for node in NODES:
        send(node, 1, "sums", np.full(8, ord(node), dtype=np.uint64), small)
    unmask(1, small)
    for node in NODES:
        header = clients[node].result(session_id, 1)
        last = header.aggregate
        assert header.state == RoundState.READY
        assert last is not None and np.array_equal(
            last, np.full(8, sum(ord(n) for n in NODES), dtype=np.uint64)
        )
    assert session.coordinator.wait(60) == 0
    assert "completed" in session.coordinator.stderr()
    # Three 21 MB streams over mutual TLS on loopback: seconds, not minutes.
    assert upload_seconds < 60
