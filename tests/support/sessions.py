"""One whole session as the integration tests drive it, and the value it must give.

* :class:`CoordinatorState`: the coordinator's SQLite file opened read-only,
  to see the moments a test acts on (roster final, an upload recorded, a round
  aggregated, an unmask attempt issued);
* :class:`SessionRun`: one session's coordinator and nodes, with approvals
  signed by the test for nodes started with ``--approve manual``;
* :func:`reference_model`: the brain-age model from plain sums over exactly
  the cohorts each round aggregated, the value an exact secure sum must give.
"""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.store import payload_dir_for
from coordinator.store.rows import layout_from_json
from node.deltab.io import Table
from node.deltab.model import BrainAgeModel
from node.deltab.persist import load_model
from node.deltab.plan import NodeMemory, finish, receive, round_tensors
from node.deltab.stats import combine
from node.deltab.sums import MEANS, SUMS
from node.plans.deltab.plan import plan_settings
from noise.fixed_point import wrapping_sum
from noise.layout import payload_sha256
from noise.self_mask import self_mask
from tests.support.processes import (
    SESSION_TIMEOUT,
    U64,
    Federation,
    Processes,
    Spawned,
    free_port,
    wait_until,
)
from zerosum.cli import main as zerosum_main


class CoordinatorState:
    """The coordinator's SQLite state, opened read-only for each query.

    A missing file, a missing table or a locked database reads as "nothing
    yet": the coordinator may be starting, or being restarted.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if not self.path.exists():
            return []
        try:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=1.0)
        except sqlite3.Error:
            return []
        try:
            return list(db.execute(sql, tuple(params)).fetchall())
        except sqlite3.Error:
            return []
        finally:
            db.close()

    def session(self) -> dict[str, Any] | None:
        rows = self.query("SELECT session_id, state, reason, roster_final FROM session")
        if not rows:
            return None
        session_id, state, reason, roster_final = rows[0]
        return {
            "session_id": session_id,
            "state": state,
            "reason": reason,
            "roster_final": bool(roster_final),
        }

    def roster_final(self) -> bool:
        found = self.session()
        return bool(found and found["roster_final"])

    def members(self) -> dict[str, str]:
        """Joined node -> 'live' or 'dropped'."""
        return dict(self.query("SELECT node_id, status FROM roster"))

    def uploads(self, round_index: int) -> set[str]:
        rows = self.query("SELECT node_id FROM uploads WHERE round_index = ?", (round_index,))
        return {r[0] for r in rows}

    def round_status(self, round_index: int) -> str | None:
        rows = self.query("SELECT status FROM rounds WHERE round_index = ?", (round_index,))
        return rows[0][0] if rows else None

    def result(self, round_index: int) -> tuple[tuple[str, ...], U64] | None:
        """(survivors, aggregate) of a published round, read from the payload file."""
        rows = self.query(
            "SELECT survivors, path FROM results WHERE round_index = ?", (round_index,)
        )
        if not rows:
            return None
        survivors, name = rows[0]
        data = (payload_dir_for(self.path) / name).read_bytes()
        return tuple(json.loads(survivors)), np.frombuffer(data, dtype="<u8").astype(np.uint64)

    def unmasked_sha256(self, round_index: int, node_id: str) -> str:
        """SHA-256 of ``node_id``'s stored upload less the self-mask whose seed it revealed.

        That is the payload of its egress bundle (or its CAPE-sum share).
        """
        rows = self.query(
            "SELECT path, layout FROM uploads WHERE round_index = ? AND node_id = ?",
            (round_index, node_id),
        )
        seeds = self.query(
            "SELECT self_mask_seed FROM unmask_corrections WHERE round_index = ? AND node_id = ?",
            (round_index, node_id),
        )
        assert len(rows) == 1 and len(seeds) == 1, (rows, seeds)
        (name, layout_text), ((seed,),) = rows[0], seeds
        sent = np.frombuffer((payload_dir_for(self.path) / name).read_bytes(), dtype="<u8")
        pad = self_mask(bytes(seed), layout_from_json(layout_text), round_index=round_index)
        return payload_sha256(sent.astype(np.uint64) - pad).hex()

    def unmask_attempts(self, round_index: int) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """(survivors, dropped) of each unmask attempt of a round, in order."""
        rows = self.query(
            "SELECT survivors, dropped FROM unmask_requests WHERE round_index = ? ORDER BY attempt",
            (round_index,),
        )
        return [(tuple(json.loads(s)), tuple(json.loads(d))) for s, d in rows]

    def refusals(self) -> list[tuple[int, str, str]]:
        return [
            (int(r), n, why)
            for r, n, why in self.query("SELECT round_index, node_id, reason FROM unmask_refusals")
        ]


# ---------------------------------------------------------------- one session


@dataclass
class SessionRun:
    """A coordinator and nodes of one session, in their own folder with their own port."""

    federation: Federation
    folder: Path
    processes: Processes
    port: int = field(default_factory=free_port)
    coordinators: list[Spawned] = field(default_factory=list)
    nodes: dict[str, Spawned] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.state = CoordinatorState(self.folder / "coordinator" / "state.sqlite")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def label(self) -> str:
        return self.folder.name

    @property
    def coordinator(self) -> Spawned:
        return self.coordinators[-1]

    def everyone(self) -> list[Spawned]:
        return [self.coordinator, *self.nodes.values()]

    def start_coordinator(self) -> Spawned:
        """Start (or, after a crash, restart with the same arguments) and wait until it listens."""
        spawned = self.processes.zerosum(
            f"{self.label}-coordinator",
            "coordinator",
            "--federation",
            str(self.federation.toml),
            "--state",
            str(self.state.path),
            "--listen",
            self.address,
        )
        self.coordinators.append(spawned)
        wait_until(
            lambda: f"listening on {self.address}" in spawned.stderr(),
            what=f"{spawned.name} to listen on {self.address}",
            alive=[spawned],
        )
        return spawned

    def out(self, node_id: str) -> Path:
        return self.folder / f"out-{node_id}"

    def state_folder(self, node_id: str) -> Path:
        """The node's state folder: one per run, as the runs stand for separate deployments."""
        return self.folder / f"state-{node_id}"

    def start_node(
        self, node_id: str, *, approve: str = "auto", env: Mapping[str, str] | None = None
    ) -> Spawned:
        spawned = self.processes.zerosum(
            f"{self.label}-{node_id}",
            "node",
            "--federation",
            str(self.federation.toml),
            "--node-id",
            node_id,
            "--out",
            str(self.out(node_id)),
            "--state",
            str(self.state_folder(node_id)),
            "--approve",
            approve,
            "--coordinator",
            self.node_dials(),
            env=env,
        )
        self.nodes[node_id] = spawned
        return spawned

    def node_dials(self) -> str:
        """The address nodes dial: the coordinator's (a test may put a proxy between)."""
        return self.address

    def egress(self, node_id: str, round_index: int) -> Path:
        return self.out(node_id) / "egress" / f"round-{round_index}"

    def at_gate(self, node_id: str, round_index: int) -> Path:
        """Wait until the node has written round ``round_index``'s egress bundle."""
        folder = self.egress(node_id, round_index)
        wait_until(
            (folder / "manifest.json").exists,
            what=f"node {node_id!r} to write its round-{round_index} egress bundle",
            alive=[self.nodes[node_id]],
        )
        return folder

    def approve(self, node_id: str, round_index: int) -> None:
        """As the node's output checker: wait for the bundle, review it, sign the approval.

        ``zerosum review --audit … --approve`` re-checks the real bundle (and
        its noise against the audit record) and signs with the checker key of
        the node; it must pass every check to sign.
        """
        folder = self.at_gate(node_id, round_index)
        audit = self.out(node_id) / "audit" / f"round-{round_index}"
        # The manifest is written before the checksums, the audit record after the bundle.
        wait_until(
            lambda: (
                (folder / "checksums" / "manifest.json.txt").exists()
                and (audit / "audit.json").exists()
            ),
            what=f"node {node_id!r} to finish writing its round-{round_index} bundle",
            alive=[self.nodes[node_id]],
        )
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            code = zerosum_main(
                [
                    "review",
                    str(folder),
                    "--federation",
                    str(self.federation.toml),
                    "--audit",
                    str(audit),
                    "--approve",
                    "--key",
                    str(self.federation.root / "checkers" / node_id / "checker.pem"),
                    "--reviewer",
                    "integration test",
                    "--comment",
                    "approved by the test driving this session",
                ]
            )
        assert code == 0, f"review of {folder} refused to approve:\n{printed.getvalue()}"

    def wait_all(self, timeout: float = SESSION_TIMEOUT) -> dict[str, int]:
        """Wait for the coordinator and every node; their exit statuses by name."""
        deadline = time.monotonic() + timeout
        codes = {}
        for name, spawned in [("coordinator", self.coordinator), *self.nodes.items()]:
            codes[name] = spawned.wait(max(1.0, deadline - time.monotonic()))
        return codes

    def model(self, node_id: str) -> BrainAgeModel:
        return load_model(self.out(node_id) / "model.json")

    def audit_payload(self, node_id: str, round_index: int) -> U64:
        path = self.out(node_id) / "audit" / f"round-{round_index}" / "payload.npy"
        return np.asarray(np.load(path, allow_pickle=False), dtype=np.uint64)

    def audit_sum(self, node_ids: Iterable[str], round_index: int) -> U64:
        """Σ of the nodes' un-noised fixed-point payloads, modulo 2^64."""
        return wrapping_sum([self.audit_payload(n, round_index) for n in sorted(node_ids)])

    def ledger(self, node_id: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.out(node_id) / "ledger.json").read_text())
        return data

    def describe(self) -> str:
        return "\n".join(s.describe() for s in [*self.coordinators, *self.nodes.values()])


# ---------------------------------------------------------------- what the result must be


def reference_model(
    federation: Federation, means_nodes: Iterable[str], sums_nodes: Iterable[str]
) -> BrainAgeModel:
    """The model from plain (noise-free) sums over the cohorts each round aggregated.

    Round "means" sums over ``means_nodes``; every node of ``sums_nodes`` takes
    those global means and the "sums" round sums over them
    (node/deltab/plan.py). With every round over the same nodes this is
    ``plan.run_in_process`` on those cohorts, i.e. the pooled fit.
    """
    settings = plan_settings(federation.config)
    first, second = sorted(means_nodes), sorted(sums_nodes)
    cohorts = {n: federation.cohort(n) for n in {*first, *second}}
    states = {n: NodeMemory(settings=settings) for n in cohorts}
    means = combine(
        [round_tensors(MEANS, cohorts[n].features, cohorts[n].age, states[n]) for n in first]
    )
    for n in second:
        receive(MEANS, means, states[n])
    sums = combine(
        [round_tensors(SUMS, cohorts[n].features, cohorts[n].age, states[n]) for n in second]
    )
    return finish({MEANS: means, SUMS: sums}, settings)


def relative_difference(model: BrainAgeModel, reference: BrainAgeModel, holdout: Table) -> float:
    """max |brain age − reference brain age| / max |reference brain age| on the holdout."""
    assert holdout.age is not None
    got = np.asarray(model.predict_age(holdout.features, holdout.age))
    want = np.asarray(reference.predict_age(holdout.features, holdout.age))
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
