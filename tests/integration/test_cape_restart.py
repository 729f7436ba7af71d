"""kill -9 of a CAPE node three times in one session; the same command again finishes it.

A real coordinator process and three node processes run a CAPE session
(``zerosum federation init --construction cape --residual-dp``): rounds
0 ``cape-sum/means``, 1 ``moments``, 2 ``cape-sum/sums``, 3 ``scatter``.
Node ``a`` runs with ``--approve manual`` and is SIGKILLed

1. once the coordinator has recorded its first CAPE-sum share (round 0),
2. at its round-1 approval gate (bundle written, not approved), and
3. at its round-3 approval gate (rounds 0–2 aggregated meanwhile),

and is started again each time with exactly the same command line. Its private
CAPE draws, the secure sums and its residual noise come back from
``OUT/audit/cape-<round>/``: the session completes, every node holds the same
model.json bytes, the coordinator holds exactly the shares and payloads ``a``
noted and wrote before each kill (no conflicting upload), the victim's ledger
holds one release per model round, and the CAPE material is private while it
exists and gone, with the session key, once the session is over.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from node.egress.bundle import EgressBundle
from tests.support.federations import CAPE_EXTRA, three_cohort_federation
from tests.support.processes import Processes, wait_until
from tests.support.sessions import SessionRun

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")
VICTIM = "a"
# Only bounds a failure: the session never waits for a deadline when it works.
DEADLINE = 30.0


def _restart(run: SessionRun) -> str:
    """SIGKILL the victim, start it again with the same command; its log once it resumed."""
    assert run.nodes[VICTIM].kill() == -9
    spawned = run.start_node(VICTIM, approve="manual")
    wait_until(
        lambda: "resuming session" in spawned.stderr(),
        what="the restarted node a to resume",
        alive=[spawned, run.coordinator],
    )
    return spawned.name


def _facts(run: SessionRun, round_index: int) -> tuple[bytes, int, str]:
    folder = run.egress(VICTIM, round_index)
    payload = folder / "payload.npy"
    return payload.read_bytes(), payload.stat().st_mtime_ns, EgressBundle.manifest_sha256(folder)


def _modes(folder: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(folder.stat().st_mode)}
    found.update({p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()})
    return found


def test_a_killed_cape_node_resumes_its_session(tmp_path: Path, processes: Processes) -> None:
    federation = three_cohort_federation(tmp_path / "fed", NODES, DEADLINE, extra=CAPE_EXTRA)
    run = SessionRun(federation, tmp_path / "run", processes)
    run.start_coordinator()
    run.start_node(VICTIM, approve="manual")
    for node in NODES[1:]:
        run.start_node(node)
    wait_until(run.state.roster_final, what="every node to join", alive=run.everyone())

    # 1: the first CAPE-sum share is recorded by the coordinator.
    wait_until(
        lambda: VICTIM in run.state.uploads(0), what="node a's round-0 share", alive=run.everyone()
    )
    restarts = [_restart(run)]
    # 2 and 3: at the approval gates of the two model rounds.
    written = {}
    modes = {}
    for round_index, model_round in ((1, "means"), (3, "sums")):
        run.at_gate(VICTIM, round_index)
        written[round_index] = _facts(run, round_index)
        modes[model_round] = _modes(run.out(VICTIM) / "audit" / f"cape-{model_round}")
        restarts.append(_restart(run))
        run.approve(VICTIM, round_index)
    codes = run.wait_all()
    assert codes == dict.fromkeys(["coordinator", *NODES], 0), run.describe()

    # One model, the same bytes at every node.
    model = (run.out(VICTIM) / "model.json").read_bytes()
    assert all((run.out(n) / "model.json").read_bytes() == model for n in NODES[1:])
    # The coordinator counted exactly what a noted (shares) and wrote (bundles) before the kills.
    for round_index in (0, 1, 2, 3):
        published = run.state.result(round_index)
        assert published is not None and published[0] == NODES
        folder = run.egress(VICTIM, round_index)
        if round_index % 2 == 0:
            sent = json.loads((folder / "cape-sum.json").read_text())["payload_sha256"]
        else:
            sent = EgressBundle.read(folder).payload_sha256
        # Stored less the self-mask the victim revealed: the very share or bundle.
        assert run.state.unmasked_sha256(round_index, VICTIM) == sent
    assert "conflicting" not in run.coordinator.stderr()
    # Nothing written before a kill was recomputed; one release per model round.
    for round_index, facts in written.items():
        assert _facts(run, round_index) == facts
    ledger = run.ledger(VICTIM)["entries"]
    releases = [e for e in ledger if e["kind"] == "release"]
    assert [e["round_index"] for e in releases] == [1, 3]
    for entry in releases:
        folder = run.egress(VICTIM, entry["round_index"])
        assert entry["details"]["manifest_sha256"] == EgressBundle.manifest_sha256(folder)

    # The CAPE material was private while it existed and is gone with the session key.
    for found in modes.values():
        assert found.pop(".") == 0o700
        assert {"cape.json", "draws.npy", "residual.npy"} <= set(found)
        assert set(found.values()) == {0o600}
    out = run.out(VICTIM)
    assert not list((out / "audit").glob("cape-*"))
    assert not (out / "session.key").exists()

    logs = {s.name: s.stderr() for s in processes.spawned}
    first, second, third = (logs[name] for name in restarts)
    assert (
        "round 0 ('cape-sum/means') CAPE sum share noted, sending it again" in first
        or "round 0 aggregated, round 1 ('means') not written yet here" in first
    )
    assert "round 0 aggregated, round 1 ('means') bundle found, resubmitting" in second
    assert "CAPE material of 'means' loaded from" in second
    assert "rounds 0, 1, 2 aggregated, round 3 ('sums') bundle found, resubmitting" in third
    assert "CAPE material of 'sums' loaded from" in third
    assert "completed" in third
