"""A CAPE node that crashes mid-session resumes from its saved CAPE material.

A real coordinator serves on 127.0.0.1 in this process and each node runs in
a thread, as in tests/node/test_runner_session.py. The victim ``a`` crashes
(an exception raised by its progress sink the moment it says it reached a
chosen step, after which nothing of that runner is used again) and a fresh
runner over the same output folder takes over, holding nothing in memory
from the first: it has only what ``OUT`` holds, as after ``kill -9``. Each
scenario checks that the session completes with one model for every node,
that ``a`` released each model round once, sent the coordinator the same
bytes it had sent before the crash, and reused its very CAPE draws and
residual noise (read from the CAPE material it saved in
``OUT/audit/cape-<round>/``). The real-process counterpart is
tests/integration/test_cape_restart.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from coordinator.config import SessionConfig
from coordinator.server import RunningServer, ServerTLS, start_server
from coordinator.session import Session
from coordinator.store import Store
from node.egress.audit import read_audit
from node.egress.bundle import EgressBundle
from node.protocol.masking import cape_masks
from node.records.cape_state import CapeMaterial, CapeStore
from node.records.session_state import SessionStore
from node.runner import (
    GatewayFactory,
    NodeOptions,
    NodeRefused,
    NodeRunner,
    RunOutcome,
    grpc_gateway,
)
from noise.layout import payload_sha256
from noise.self_mask import self_mask
from proto.federation import config_hash, load_federation
from tests.node.gateways import failing_before_upload
from tests.support.synthetic_init import init_synthetic

pytestmark = pytest.mark.integration

NODES = "abcd"


class Crash(Exception):
    """Stands for the process dying at this point (never caught by the runner)."""


def _federation(out: Path) -> Path:
    return init_synthetic(
        out,
        NODES,
        seed=5,
        n_features=6,
        n_components=3,
        cohort_sizes="120,150,130,140",
        options=[
            "--coordinator",
            "127.0.0.1:1",
            "--construction",
            "cape",
            "--residual-dp",
            # Two model rounds (means, then sums), so a crash can fall between them.
            "--nan-policy",
            "mean",
            # Weak privacy keeps the noisy fit well posed on these small cohorts.
            "--epsilon",
            "300",
            "--epsilon-budget",
            "3000",
            # Long enough never to pass in a passing run: only withdrawals drop a node here.
            "--round-deadline",
            "60",
            "--join-deadline",
            "200",
        ],
    )


@dataclass
class CapeSession:
    """One session: the in-process coordinator and the node runners started on it."""

    fed: Path
    folder: Path
    server: RunningServer
    store: Store
    threads: dict[str, threading.Thread] = field(default_factory=dict)
    outcomes: dict[str, object] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)
    kept: dict[str, CapeMaterial] = field(default_factory=dict)

    def out(self, node: str) -> Path:
        return self.folder / f"out-{node}"

    def runner(
        self,
        node: str,
        *,
        dies_after: str | None = None,
        keeps_material: tuple[str, str] | None = None,
        gateway: GatewayFactory = grpc_gateway,
    ) -> NodeRunner:
        """A runner of ``node`` whose lines go to ``logs[node]``.

        ``dies_after``: its process dies (:class:`Crash`) the first time it has
        said that. ``keeps_material`` = (said, round): when it has said that,
        the CAPE material of that model round it saved is read into ``kept[node]``.
        """
        lines = self.logs.setdefault(node, [])
        dead = False

        def progress(line: str) -> None:
            nonlocal dead
            lines.append(line)
            if keeps_material is not None and keeps_material[0] in line:
                self.kept[node] = self.material(node, keeps_material[1])
            if dies_after is not None and not dead and dies_after in line:
                dead = True
                raise Crash(line)

        return NodeRunner(
            self.fed,
            node,
            out=self.out(node),
            options=NodeOptions(
                approve="auto", poll_seconds=0.05, address=f"127.0.0.1:{self.server.port}"
            ),
            progress=progress,
            gateway=gateway,
        )

    def material(self, node: str, model_round: str) -> CapeMaterial:
        """The CAPE material of ``model_round`` that ``node`` saved in its session, as it is now."""
        record = SessionStore(self.out(node)).read()
        assert record is not None, f"{node} holds no session record"
        material = CapeStore(self.out(node)).load(
            model_round, session_id=record.session_id, node_id=node, config_hash=record.config_hash
        )
        assert material is not None, f"{node} saved no CAPE material of {model_round!r}"
        return material

    def start(self, runner: NodeRunner) -> None:
        def go() -> None:
            try:
                self.outcomes[runner.node_id] = runner.run()
            except BaseException as error:
                self.outcomes[runner.node_id] = error

        self.outcomes.pop(runner.node_id, None)
        thread = threading.Thread(target=go, name=f"node-{runner.node_id}", daemon=True)
        self.threads[runner.node_id] = thread
        thread.start()

    def crashed(self, node: str, timeout: float = 60.0) -> None:
        """Wait until ``node``'s runner has ended with :class:`Crash`."""
        self.threads[node].join(timeout)
        assert isinstance(self.outcomes.get(node), Crash), self.outcomes.get(node)

    def finish(self, timeout: float = 60.0) -> None:
        for thread in self.threads.values():
            thread.join(timeout)

    def said(self, node: str, text: str, *, times: int = 1, timeout: float = 60.0) -> None:
        """Wait until ``node``'s runners have said ``text`` ``times`` times in all."""
        deadline = time.monotonic() + timeout
        while sum(text in line for line in self.logs.get(node, [])) < times:
            assert time.monotonic() < deadline, f"{node} never said {text!r}: {self.logs}"
            time.sleep(0.02)

    def ledger_releases(self, node: str) -> list[int]:
        ledger = json.loads((self.out(node) / "ledger.json").read_text())
        return [e["round_index"] for e in ledger["entries"] if e["kind"] == "release"]

    def stored_digest(self, round_index: int, node: str) -> list[str]:
        return [u.digest.hex() for u in self.store.uploads(round_index) if u.node_id == node]

    def unmasked_sha256(self, round_index: int, node: str) -> str:
        """SHA-256 of ``node``'s stored upload minus the self-mask whose seed it revealed."""
        (upload,) = [u for u in self.store.uploads(round_index) if u.node_id == node]
        (answer,) = [c for c in self.store.corrections(round_index, 1) if c.node_id == node]
        sent = np.frombuffer(self.store.payload_path(upload.path).read_bytes(), dtype="<u8")
        pad = self_mask(answer.self_mask_seed, upload.layout, round_index=round_index)
        return payload_sha256(sent.astype(np.uint64) - pad).hex()


@pytest.fixture
def session(tmp_path: Path) -> Iterator[CapeSession]:
    fed = _federation(tmp_path / "fed")
    config = load_federation(fed / "federation.toml")
    store = Store(tmp_path / "state" / "coordinator.db")
    coordinator = Session(store, SessionConfig.from_federation(config, config_hash(config)))
    tls = ServerTLS(
        (fed / "coordinator" / "server.pem").read_bytes(),
        (fed / "coordinator" / "server.key").read_bytes(),
        (fed / "ca" / "ca.pem").read_bytes(),
    )
    server = start_server(coordinator, tls, listen="127.0.0.1:0", tick_seconds=0.05)
    try:
        yield CapeSession(fed, tmp_path, server, store)
    finally:
        server.stop(grace=None)


def _held_until(event: threading.Event, round_name: str) -> GatewayFactory:
    """A gateway that sends this node's upload of ``round_name`` only once ``event`` is set."""

    def hold(name: str) -> None:
        if name == round_name:
            assert event.wait(60), "the test never released the held share"

    return failing_before_upload(hold)


def _refusing_its_model_round() -> GatewayFactory:
    """A node that refuses its first model round, as a deliberate stop does, and withdraws.

    It takes part in the first CAPE sum (a share is no release), then stops
    before uploading ``means`` with :class:`NodeRefused`, which withdraws it.
    (Its ε budget is checked for the whole session before its first share,
    so an exhausted budget would keep it out of the CAPE sum as well.)
    """

    def refuse(round_name: str) -> None:
        if round_name == "means":
            raise NodeRefused("this node stops before its model round (a deliberate refusal)")

    return failing_before_upload(refuse)


def _completed(session: CapeSession, nodes: Sequence[str] = NODES) -> None:
    for node in nodes:
        assert isinstance(session.outcomes[node], RunOutcome), session.outcomes[node]
    model = (session.out(nodes[0]) / "model.json").read_bytes()
    assert all((session.out(n) / "model.json").read_bytes() == model for n in nodes)
    out = session.out("a")
    # The secrets went with the session key.
    assert not (out / "session.key").exists()
    assert not list((out / "audit").glob("cape-*"))


def _residual(session: CapeSession, index: int, material: CapeMaterial) -> np.ndarray:
    """egress − audit − e_k of a's model round ``index`` with S of ``material``: its residual."""
    assert material.sum is not None
    bundle = EgressBundle.read(session.out("a") / "egress" / f"round-{index}")
    clean = read_audit(session.out("a"), index).payload
    mask = cape_masks(material.draws, material.sum.total, material.sum.participants, "a")
    return bundle.payload - clean - mask


def test_a_share_sent_before_the_crash_is_sent_again_byte_for_byte(session: CapeSession) -> None:
    held = threading.Event()
    victim = session.runner("a", dies_after="round 0 ('cape-sum/means') CAPE sum share uploaded")
    session.start(victim)
    session.start(session.runner("b", gateway=_held_until(held, "cape-sum/means")))
    session.start(session.runner("c"))
    session.start(session.runner("d"))
    session.crashed("a")
    note = json.loads((session.out("a") / "egress" / "round-0" / "cape-sum.json").read_text())
    draws = session.material("a", "means").draws.copy()
    restarted = session.runner("a", keeps_material=("round 1 ('means') uploaded", "means"))
    session.start(restarted)
    # Round 0 is still open (b holds its share): the restart must send its share again.
    session.said("a", "CAPE sum share noted, sending it again")
    session.said("a", "round 0 ('cape-sum/means') CAPE sum share uploaded", times=2)
    held.set()
    session.finish()
    _completed(session)
    kept = session.kept["a"]
    assert np.array_equal(kept.draws, draws)
    # The restarted node's means egress is made from those very draws.
    assert kept.residual is not None
    assert np.array_equal(_residual(session, 1, kept), kept.residual)
    assert session.stored_digest(0, "a") == [note["sent_digest"]]
    assert session.unmasked_sha256(0, "a") == note["payload_sha256"]
    assert session.ledger_releases("a") == [1, 3]


def test_a_bundle_left_at_the_gate_is_checked_against_the_material_and_resubmitted(
    session: CapeSession,
) -> None:
    victim = session.runner("a", dies_after="round 3 ('sums'): egress bundle written to")
    for runner in (victim, session.runner("b"), session.runner("c"), session.runner("d")):
        session.start(runner)
    session.crashed("a")
    folder = session.out("a") / "egress" / "round-3"
    payload = (folder / "payload.npy").read_bytes()
    state = session.material("a", "sums")
    session.start(session.runner("a"))
    session.finish()
    _completed(session)
    log = "\n".join(session.logs["a"])
    assert "resuming session" in log and "rounds 0, 1, 2 aggregated" in log
    assert "round 3 ('sums') bundle found, resubmitting" in log
    assert (folder / "payload.npy").read_bytes() == payload
    assert session.ledger_releases("a") == [1, 3]
    bundle = EgressBundle.read(folder)
    # What was stored, less a's revealed self-mask, is the bundle's payload.
    assert session.unmasked_sha256(3, "a") == bundle.payload_sha256
    # The bundle is the clean values plus exactly the saved noise.
    assert state.sum is not None and state.residual is not None
    assert np.array_equal(_residual(session, 3, state), state.residual)


def test_a_rerun_draws_fresh_cape_noise_and_a_restart_keeps_it(session: CapeSession) -> None:
    # c leaves after the first CAPE sum, so round 1 (means) is superseded and
    # rerun among a, b and d from round 2; a crashes once its rerun share is sent.
    # The rerun draws afresh (an old draw could be stripped from S − S'), and
    # the restarted node goes on with the rerun's draws.
    victim = session.runner(
        "a",
        dies_after="round 2 ('cape-sum/means') CAPE sum share uploaded",
        keeps_material=("round 1 ('means') uploaded", "means"),
    )
    others = (
        session.runner("b"),
        session.runner("c", gateway=_refusing_its_model_round()),
        session.runner("d"),
    )
    for runner in (victim, *others):
        session.start(runner)
    session.crashed("a")
    first = session.kept.pop("a")
    assert first.sum is not None and first.sum.participants == ("a", "b", "c", "d")
    assert first.residual is not None
    assert np.count_nonzero(first.residual) > first.residual.size // 2  # residual noise is on
    before = session.material("a", "means")
    assert before.drawn_for == 2 and before.sum is None and before.residual is None
    assert not np.array_equal(before.draws, first.draws)
    restarted = session.runner("a", keeps_material=("round 3 ('means') uploaded", "means"))
    session.start(restarted)
    session.finish()
    assert isinstance(session.outcomes["c"], NodeRefused), session.outcomes["c"]
    assert "a deliberate refusal" in str(session.outcomes["c"])
    _completed(session, "abd")
    after = session.kept["a"]
    assert np.array_equal(after.draws, before.draws)
    assert after.residual is not None and not np.array_equal(after.residual, first.residual)
    assert after.sum is not None and after.sum.participants == ("a", "b", "d")
    # Each egress of the means round carries its own attempt's residual noise.
    assert np.array_equal(_residual(session, 1, first), first.residual)
    assert np.array_equal(_residual(session, 3, after), after.residual)
    # The rerun counts as a release: means twice, then sums.
    assert session.ledger_releases("a") == [1, 3, 5]
    for index in (3, 5):
        bundle = EgressBundle.read(session.out("a") / "egress" / f"round-{index}")
        assert session.unmasked_sha256(index, "a") == payload_sha256(bundle.payload).hex()
