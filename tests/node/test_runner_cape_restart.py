"""A CAPE node that crashes mid-session resumes from its saved CAPE material.

A real coordinator serves on 127.0.0.1 in this process and each node runs in
a thread, as in tests/node/test_runner_session.py. The victim ``a`` crashes
(an exception from inside its own session, at a chosen step, after which
nothing of that runner is used again) and a fresh runner over the same output
folder takes over, holding nothing in memory from the first: it has only what
``OUT`` holds, as after ``kill -9``. Each scenario checks that the session
completes with one model for every node, that ``a`` released each model
round once, sent the coordinator the same bytes it had sent before the
crash, and reused its very CAPE draws and residual noise. The real-process
counterpart is tests/integration/test_cape_restart.py.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from coordinator.config import SessionConfig
from coordinator.server import RunningServer, ServerTLS, start_server
from coordinator.session import Session
from coordinator.store import Store
from node.audit import read_audit
from node.egress import EgressBundle
from node.masking import cape_masks
from node.release import ReleaseNoise
from node.runner import NodeOptions, NodeRefused, NodeRunner, RunOutcome, _CapeState
from noise.layout import Layout, payload_digest
from proto.federation import config_hash, load_federation
from zerosum.commands import federation as federation_command

pytestmark = pytest.mark.integration

NODES = "abcd"


class Crash(Exception):
    """Stands for the process dying at this point (never caught by the runner)."""


def _federation(out: Path) -> Path:
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    args = parser.parse_args(
        [
            "init",
            "--nodes",
            ",".join(NODES),
            "--out",
            str(out),
            "--synthetic",
            "--seed",
            "5",
            "--n-features",
            "6",
            "--n-components",
            "3",
            "--cohort-sizes",
            "120,150,130,140",
            "--coordinator",
            "127.0.0.1:1",
            "--construction",
            "cape",
            "--residual-dp",
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
        ]
    )
    assert federation_command.run(args) == 0
    return out


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

    def out(self, node: str) -> Path:
        return self.folder / f"out-{node}"

    def runner(self, node: str, cls: type[NodeRunner] = NodeRunner) -> NodeRunner:
        lines = self.logs.setdefault(node, [])
        return cls(
            self.fed,
            node,
            out=self.out(node),
            options=NodeOptions(poll_seconds=0.05, address=f"127.0.0.1:{self.server.port}"),
            progress=lines.append,
        )

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

    def stored_sha256(self, round_index: int, node: str) -> list[str]:
        return [u.sha256.hex() for u in self.store.uploads(round_index) if u.node_id == node]


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


def _crashing(step: str, when: Callable[[int, str], bool]) -> type[NodeRunner]:
    """A runner that crashes the first time ``step`` is reached with ``when(index, name)``."""

    class Crashing(NodeRunner):
        crashed = False

        def _check(self, index: int, name: str) -> None:
            if not self.crashed and when(index, name):
                self.crashed = True
                raise Crash(f"{step} of round {index} ({name!r})")

        def _await_result(
            self,
            index: int,
            name: str,
            layout: Layout,
            participants: tuple[str, ...],
            noise: ReleaseNoise,
            *,
            own_sha256: bytes | None = None,
        ) -> NDArray[np.uint64] | None:
            if step == "after-upload":
                self._check(index, name)
            return super()._await_result(
                index, name, layout, participants, noise, own_sha256=own_sha256
            )

        def _approve_and_record(self, *, index: int, name: str, **kw: object) -> Path:
            if step == "at-gate":
                self._check(index, name)
            return super()._approve_and_record(index=index, name=name, **kw)  # type: ignore[arg-type]

    return Crashing


class HeldShare(NodeRunner):
    """Sends its first CAPE-sum share only once ``release`` is set."""

    release = threading.Event()

    def _cape_sum_round(self, index: int, name: str, participants: tuple[str, ...]) -> None:
        if index == 0:
            assert self.release.wait(60), "the test never released the held share"
        super()._cape_sum_round(index, name, participants)


class LeavesBeforeMoments(NodeRunner):
    """Withdraws from the first model round, after the CAPE sum it took part in."""

    def _model_round(self, index: int, name: str, participants: tuple[str, ...]) -> None:
        if name == "moments":
            self._unsent_round = index
            raise NodeRefused("this test's node leaves before the moments round")
        super()._model_round(index, name, participants)


def _completed(session: CapeSession, nodes: Sequence[str] = NODES) -> None:
    for node in nodes:
        assert isinstance(session.outcomes[node], RunOutcome), session.outcomes[node]
    model = (session.out(nodes[0]) / "model.json").read_bytes()
    assert all((session.out(n) / "model.json").read_bytes() == model for n in nodes)
    out = session.out("a")
    # The secrets went with the session key.
    assert not (out / "session.key").exists()
    assert not list((out / "audit").glob("cape-*"))


def _residual(session: CapeSession, index: int, state: _CapeState) -> np.ndarray:
    """egress − audit − e_k of a's model round ``index`` with S of ``state``: its residual noise."""
    assert state.total is not None
    bundle = EgressBundle.read(session.out("a") / "egress" / f"round-{index}")
    clean = read_audit(session.out("a"), index).payload
    return bundle.payload - clean - cape_masks(state.draws, state.total, state.participants, "a")


def test_a_share_sent_before_the_crash_is_sent_again_byte_for_byte(session: CapeSession) -> None:
    HeldShare.release = threading.Event()
    victim = session.runner("a", _crashing("after-upload", lambda i, n: i == 0))
    session.start(victim)
    session.start(session.runner("b", HeldShare))
    session.start(session.runner("c"))
    session.start(session.runner("d"))
    session.crashed("a")
    note = json.loads((session.out("a") / "egress" / "round-0" / "cape-sum.json").read_text())
    draws = victim._cape["moments"].draws.copy()
    restarted = session.runner("a")
    session.start(restarted)
    # Round 0 is still open (b holds its share): the restart must send its share again.
    session.said("a", "CAPE sum share noted, sending it again")
    session.said("a", "round 0 ('cape-sum/moments') CAPE sum share uploaded", times=2)
    HeldShare.release.set()
    session.finish()
    _completed(session)
    assert np.array_equal(restarted._cape["moments"].draws, draws)
    assert session.stored_sha256(0, "a") == [note["payload_sha256"]]
    assert session.ledger_releases("a") == [1, 3]


def test_a_bundle_left_at_the_gate_is_checked_against_the_material_and_resubmitted(
    session: CapeSession,
) -> None:
    victim = session.runner("a", _crashing("at-gate", lambda i, n: n == "scatter"))
    for runner in (victim, session.runner("b"), session.runner("c"), session.runner("d")):
        session.start(runner)
    session.crashed("a")
    folder = session.out("a") / "egress" / "round-3"
    payload = (folder / "payload.npy").read_bytes()
    state = victim._cape["scatter"]
    session.start(session.runner("a"))
    session.finish()
    _completed(session)
    log = "\n".join(session.logs["a"])
    assert "resuming session" in log and "rounds 0, 1, 2 aggregated" in log
    assert "round 3 ('scatter') bundle found, resubmitting" in log
    assert (folder / "payload.npy").read_bytes() == payload
    assert session.ledger_releases("a") == [1, 3]
    bundle = EgressBundle.read(folder)
    assert session.stored_sha256(3, "a") == [bundle.payload_sha256]
    # The bundle is the clean values plus exactly the saved noise.
    assert state.total is not None and state.residual is not None
    assert np.array_equal(_residual(session, 3, state), state.residual)


def test_a_rerun_after_the_restart_reuses_the_draws_and_the_residual(session: CapeSession) -> None:
    # c leaves after the first CAPE sum, so round 1 (moments) is superseded and
    # rerun among a, b and d from round 2; a crashes once its rerun share is sent.
    victim = session.runner("a", _crashing("after-upload", lambda i, n: i == 2))
    others = (session.runner("b"), session.runner("c", LeavesBeforeMoments), session.runner("d"))
    for runner in (victim, *others):
        session.start(runner)
    session.crashed("a")
    before = victim._cape["moments"]
    assert before.residual is not None and before.participants == ("a", "b", "c", "d")
    assert np.count_nonzero(before.residual) > before.residual.size // 2  # residual noise is on
    restarted = session.runner("a")
    session.start(restarted)
    session.finish()
    assert isinstance(session.outcomes["c"], NodeRefused)
    _completed(session, "abd")
    after = restarted._cape["moments"]
    assert np.array_equal(after.draws, before.draws)
    assert after.residual is not None and np.array_equal(after.residual, before.residual)
    assert after.participants == ("a", "b", "d")
    # Both egresses of the moments round carry the same residual noise.
    assert np.array_equal(_residual(session, 1, before), before.residual)
    assert np.array_equal(_residual(session, 3, after), before.residual)
    # The rerun counts as a release: moments twice, then scatter.
    assert session.ledger_releases("a") == [1, 3, 5]
    for index in (1, 3, 5):
        bundle = EgressBundle.read(session.out("a") / "egress" / f"round-{index}")
        assert session.stored_sha256(index, "a") == [payload_digest(bundle.payload).hex()]
