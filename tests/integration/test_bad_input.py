"""Bad input at process level: what the in-process server tests cannot reach.

* A node whose own data is unusable (NaN where the policy forbids it, a
  ragged row, an infinite value) exits with status 2 and one sentence,
  without a traceback and before it opens any connection: it is pointed at a
  listening socket that must never see a connection.
* A node whose identity key is not the one pinned in the federation config
  stops before contacting anyone; a join signed with the wrong identity key
  is UNAUTHENTICATED, a node speaking for another is PERMISSION_DENIED, and a
  node holding a different federation config stops at the config hash. None
  of it changes the coordinator's state file, and afterwards the real nodes
  join and complete the session.
"""

from __future__ import annotations

import select
import shutil
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from node.errors import CoordinatorRefused
from node.protocol.client import GrpcGateway, RetryPolicy
from noise.keys import EphemeralKey, IdentityKey, KeyBundle, sign_key_bundle
from proto.federation import config_hash
from tests.support.federations import three_cohort_federation
from tests.support.processes import Federation, Processes, Spawned
from tests.support.sessions import SessionRun

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")

Rows = list[list[str]]


def _nan_age(rows: Rows) -> None:
    rows[5][1] = "NaN"


def _empty_feature(rows: Rows) -> None:
    for row in rows[1:]:
        row[4] = "NaN"


def _ragged(rows: Rows) -> None:
    rows[10].pop()


def _infinite(rows: Rows) -> None:
    rows[3][2] = "inf"


# case -> (how to spoil the cohort, what the sentence must say)
CASES: dict[str, tuple[Callable[[Rows], None], str]] = {
    "nan-age": (_nan_age, "line 6 has no age; every subject needs an age"),
    "empty-feature": (_empty_feature, "feature 'f0003' has no observed value at all"),
    "ragged": (_ragged, "line 11 has"),
    "infinite": (_infinite, "is not a finite number"),
}


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    return three_cohort_federation(tmp_path_factory.mktemp("bad-input") / "federation", NODES, 90)


@dataclass
class Refused:
    process: Spawned
    out: Path
    trap: socket.socket


def _trap() -> socket.socket:
    """A listening socket standing in for the coordinator: nothing may connect to it."""
    trap = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    trap.bind(("127.0.0.1", 0))
    trap.listen(8)
    return trap


def _stranger_federation(federation: Federation, folder: Path) -> Path:
    """A copy of the federation in which node a holds an identity key nobody pinned."""
    copy = folder / "stranger-federation"
    shutil.copytree(federation.root, copy)
    pem = copy / "nodes" / "a" / "identity.pem"
    pem.unlink()
    pem.write_bytes(IdentityKey.generate().to_pem())
    pem.chmod(0o600)
    return copy / "federation.toml"


@pytest.fixture(scope="module")
def refused(
    federation: Federation,
    module_processes: Processes,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Refused]]:
    """Node a with each spoilt cohort, and with a stranger's key; started together."""
    folder = tmp_path_factory.mktemp("bad-data")
    rows = [line.split(",") for line in federation.data("a").read_text().splitlines()]
    runs: dict[str, list[str]] = {}
    for case, (spoil, _) in CASES.items():
        spoilt = [list(row) for row in rows]
        spoil(spoilt)
        data = folder / f"{case}.csv"
        data.write_text("".join(",".join(row) + "\n" for row in spoilt))
        runs[case] = ["--federation", str(federation.toml), "--data", str(data)]
    runs["stranger"] = ["--federation", str(_stranger_federation(federation, folder))]
    started: dict[str, Refused] = {}
    try:
        for case, argv in runs.items():
            trap = _trap()
            out = folder / f"out-{case}"
            address = f"127.0.0.1:{trap.getsockname()[1]}"
            process = module_processes.zerosum(
                f"refused-{case}",
                "node",
                *argv,
                *("--node-id", "a", "--out", str(out), "--coordinator", address),
            )
            started[case] = Refused(process, out, trap)
        yield started
    finally:
        for item in started.values():
            item.trap.close()


def _one_sentence(text: str, prefix: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    assert lines[0].startswith(prefix), text
    return lines[0]


def _stopped_before_contact(item: Refused) -> str:
    """Exit status 2, one sentence on stderr, no connection, no output folder."""
    assert item.process.wait(90) == 2, item.process.describe()
    line = _one_sentence(item.process.stderr(), "zerosum node a: ")
    assert item.process.stdout() == ""
    readable, _, _ = select.select([item.trap], [], [], 0)
    assert not readable, "the node connected to the coordinator address"
    assert not item.out.exists()
    return line


@pytest.mark.parametrize("case", CASES)
def test_unusable_local_data_stops_the_node_before_any_contact(
    case: str, refused: dict[str, Refused]
) -> None:
    line = _stopped_before_contact(refused[case])
    assert f"{case}.csv" in line and CASES[case][1] in line


def test_identity_key_not_pinned_in_the_config_stops_the_node(
    refused: dict[str, Refused],
) -> None:
    line = _stopped_before_contact(refused["stranger"])
    assert "is not the identity key pinned for node 'a'" in line


def _client(federation: Federation, run: SessionRun, node: str) -> GrpcGateway:
    folder = federation.root / "nodes" / node
    return GrpcGateway.from_files(
        run.address,
        node_id=node,
        ca_certificate=federation.root / "ca" / "ca.pem",
        client_certificate=folder / "client.pem",
        client_key=folder / "client.key",
        retry=RetryPolicy(total_seconds=60.0),
    )


def _bundle(identity: IdentityKey, federation: Federation, session: str, node: str) -> KeyBundle:
    return sign_key_bundle(
        identity,
        config_hash=config_hash(federation.config),
        session_id=session,
        node_id=node,
        public_key=EphemeralKey.generate().public_bytes(),
    )


def test_rejected_joins_leave_the_session_untouched(
    federation: Federation, processes: Processes, tmp_path: Path
) -> None:
    run = SessionRun(federation, tmp_path / "session", processes)
    run.start_coordinator()

    def snapshot() -> tuple[object, ...]:
        return (
            run.state.query("SELECT * FROM session"),
            run.state.query("SELECT * FROM roster"),
            run.state.query("SELECT * FROM rounds"),
        )

    before = snapshot()
    with _client(federation, run, "a") as client:
        session = client.status("").session_id
        # Signed with an identity key the federation does not pin for 'a'.
        with pytest.raises(CoordinatorRefused) as wrong_key:
            client.join(_bundle(IdentityKey.generate(), federation, session, "a"))
        assert wrong_key.value.code == "UNAUTHENTICATED"
        assert wrong_key.value.details
        # 'b's genuine bundle, sent over 'a's certificate.
        with pytest.raises(CoordinatorRefused) as impostor:
            client.join(_bundle(federation.identity("b"), federation, session, "b"))
        assert impostor.value.code == "PERMISSION_DENIED"
        assert "'a'" in impostor.value.details and "'b'" in impostor.value.details
        assert client.status(session).joined == ()

    # A node holding a different federation config stops at the config hash.
    copy = tmp_path / "other-federation"
    shutil.copytree(federation.root, copy)
    toml = copy / "federation.toml"
    text = toml.read_text()
    assert "round_deadline_seconds = 90.0" in text
    toml.write_text(text.replace("round_deadline_seconds = 90.0", "round_deadline_seconds = 91.0"))
    other = processes.zerosum(
        "other-config",
        "node",
        "--federation",
        str(toml),
        "--node-id",
        "a",
        "--out",
        str(tmp_path / "out-other"),
        "--coordinator",
        run.address,
    )
    assert other.wait(90) == 1, other.describe()
    assert "different federation configuration" in other.stderr()
    assert "Traceback" not in other.stderr()

    assert snapshot() == before
    # The rejected attempts cost nothing: the genuine nodes join and finish.
    for node in NODES:
        run.start_node(node)
    codes = run.wait_all()
    assert codes == dict.fromkeys(["coordinator", *NODES], 0), run.describe()
    assert run.state.members() == dict.fromkeys(NODES, "live")
