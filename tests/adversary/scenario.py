"""One attack: a federation, a lying coordinator, real node processes, and their outputs.

:class:`Attack` starts the :class:`~tests.adversary.lying_server.LyingCoordinator`
in the test process and the nodes as ``zerosum node`` processes on 127.0.0.1
(the integration tests' :class:`~tests.support.processes.Processes`, which
kills whatever still runs when the test ends). It reads the nodes' outputs as
ground truth — the un-noised audit payloads, the egress manifests with their
declared noise, the saved session key, CAPE draws and the ledger — which only
the test may see, never the coordinator.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from noise.keys import EphemeralKey
from noise.self_mask import self_mask_seed
from tests.adversary.lying_server import LyingCoordinator, Script
from tests.adversary.serving import Serving, serve
from tests.support import processes as integration
from tests.support.processes import Federation, Spawned, init_federation, wait_until

__all__ = ["Attack", "Processes", "ledger_gaps", "make_federation"]

U64 = NDArray[np.uint64]
# Bounds on waits; they matter only when something is broken.
START_TIMEOUT = 60.0
EXIT_TIMEOUT = 30.0


class Processes(integration.Processes):
    """The integration tests' processes, and the lying coordinators served beside them.

    :meth:`close` (at each test's teardown) kills every process still running
    and stops every server, whatever happened.
    """

    def __init__(self, logs: Path) -> None:
        super().__init__(logs)
        self.servers: list[Serving] = []

    def close(self) -> None:
        super().close()
        for serving in self.servers:
            serving.stop()


def make_federation(
    root: Path,
    nodes: Sequence[str],
    *,
    residual: bool = False,
    construction: str = "pairwise",
    extra: Sequence[str] = (),
) -> Federation:
    """A synthetic federation with the one-round plan ("sums"; two rounds under CAPE)."""
    options = ["--construction", construction]
    if residual:
        options.append("--residual-dp")
    return init_federation(
        root,
        nodes,
        cohort_sizes=(150, 120, 130, 140)[: len(nodes)],
        join_deadline=30.0,
        round_deadline=5.0,
        nan_policy="drop",
        extra=[*options, *extra],
    )


@dataclass
class Attack:
    """A lying coordinator and the node processes run against it."""

    federation: Federation
    folder: Path
    processes: Processes
    script: Script
    serving: Serving = field(init=False)
    nodes: dict[str, Spawned] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.serving = serve(self.federation.config, self.federation.root, self.script)
        self.processes.servers.append(self.serving)

    @property
    def coordinator(self) -> LyingCoordinator:
        return self.serving.coordinator

    def start(self, node_ids: Iterable[str] | None = None, *, approve: str = "auto") -> None:
        for node in node_ids or self.federation.node_ids:
            self.nodes[node] = self.processes.zerosum(
                f"node-{node}",
                "node",
                "--federation",
                str(self.federation.toml),
                "--node-id",
                node,
                "--out",
                str(self.out(node)),
                "--approve",
                approve,
                "--coordinator",
                self.serving.address,
            )

    def wait_for(self, what: str, condition: Any, *, timeout: float = START_TIMEOUT) -> Any:
        """Poll ``condition`` (under the server's lock) until it holds."""

        def check() -> Any:
            with self.coordinator.lock:
                return condition()

        return wait_until(check, what=what, timeout=timeout)

    def end(self, reason: str) -> dict[str, int]:
        """Abort the session, wait for every node to exit; their exit statuses."""
        self.coordinator.abort(reason)
        codes = {node: spawned.wait(EXIT_TIMEOUT) for node, spawned in self.nodes.items()}
        self.serving.stop()
        return codes

    def exits(self) -> dict[str, int]:
        """Wait for every node to exit on its own; their exit statuses."""
        return {node: spawned.wait(EXIT_TIMEOUT) for node, spawned in self.nodes.items()}

    def describe(self) -> str:
        return "\n".join(s.describe() for s in self.nodes.values())

    # ------------------------------------------------------------ ground truth

    def out(self, node: str) -> Path:
        return self.folder / f"out-{node}"

    def audit(self, node: str, round_index: int) -> U64:
        """q(x_k): the node's un-noised fixed-point payload of the round."""
        path = self.out(node) / "audit" / f"round-{round_index}" / "payload.npy"
        return np.asarray(np.load(path, allow_pickle=False), dtype=np.uint64)

    def manifest(self, node: str, round_index: int) -> dict[str, Any]:
        path = self.out(node) / "egress" / f"round-{round_index}" / "manifest.json"
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def ledger(self, node: str) -> dict[str, Any]:
        path = self.out(node) / "ledger.json"
        if not path.exists():
            return {"entries": []}
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def session_key(self, node: str) -> EphemeralKey:
        """The node's saved X25519 session key (exists while its session runs)."""
        return EphemeralKey.from_private_bytes((self.out(node) / "session.key").read_bytes())

    def self_mask_seed(self, node: str, round_index: int, key: EphemeralKey) -> bytes:
        """β_k of the round, derived from the node's session key as the node derives it."""
        return self_mask_seed(
            key,
            config_hash=self.coordinator.config_hash,
            session_id=self.coordinator.session_id,
            node_id=node,
            round_index=round_index,
        )

    def cape_draws(self, node: str, model_round: str) -> U64:
        """q(ê_k): the node's private CAPE draws for ``model_round``."""
        path = self.out(node) / "audit" / f"cape-{model_round}" / "draws.npy"
        return np.asarray(np.load(path, allow_pickle=False), dtype=np.uint64)


def _sha256_file(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def ledger_gaps(attack: Attack) -> list[str]:
    """Everything the server received that a node's ledger does not count (empty: none).

    Every model-round upload must be a release entry of that round naming the
    manifest of the bundle sent, every answer carrying pair terms (or CAPE-sum
    pads) an unmask entry covering its dropped set, and every refusal a
    refusal entry.
    """
    server = attack.coordinator
    gaps = []
    for node in attack.nodes:
        entries = [
            e for e in attack.ledger(node)["entries"] if e.get("session_id") == server.session_id
        ]

        def has(kind: str, index: int, entries: list[dict[str, Any]] = entries) -> list[Any]:
            return [e for e in entries if e["kind"] == kind and e["round_index"] == index]

        for record in server.rounds:
            if node in record.uploads and not record.name.startswith("cape-sum/"):
                folder = attack.out(node) / "egress" / f"round-{record.index}"
                digest = _sha256_file(folder / "manifest.json")
                if not [
                    e
                    for e in has("release", record.index)
                    if e["details"].get("manifest_sha256") == digest
                ]:
                    gaps.append(f"{node}: no release entry for its round-{record.index} upload")
            answer = record.answers.get(node)
            if answer is not None and answer.corrections is not None:
                covered = [
                    e
                    for e in has("unmask", record.index)
                    if set(answer.dropped) <= set(e["details"]["dropped"])
                ]
                if not covered:
                    gaps.append(
                        f"{node}: no unmask entry for its round-{record.index} pair terms "
                        f"with {list(answer.dropped)}"
                    )
            if node in record.refusals and not has("refusal", record.index):
                gaps.append(f"{node}: no refusal entry for round {record.index}")
    return gaps
