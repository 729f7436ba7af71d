"""A coordinator takes every seed of a round, then supersedes it, again and again.

Each attempt runs honestly up to its unmask answers (all survived, every node
sends its self-mask seed), so the coordinator holds every node's released
egress z_k; instead of publishing it declares the round superseded and opens
the rerun, where every node releases its values again with fresh masks and
residual noise. Averaging k such releases shrinks the noise by √k, so every
release must be counted (μ-GDP composition, Dong, Roth & Su 2022), and the
number of attempts is capped: with ``session.max_reruns`` R a node releases a
plan round at most R + 1 times and stops before the next attempt, naming the
nodes the coordinator called silent (node/session/reruns.py). The budget
(4, the default, which 12 releases would nearly exhaust) is never reached:
the ledger holds exactly R + 1 releases, and the session's worst case was
charged by the budget check before the first of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.adversary.lying_server import LyingCoordinator, RoundRecord, Script, Shown
from tests.adversary.reconstruct import floors, leftover, stripped
from tests.adversary.scenario import Attack, Processes, ledger_gaps, make_federation

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")
BUDGET = 4.0
END = "the test coordinator ends the session after its reruns"


class SupersedeAfterSeeds(Script):
    """Every round, once all its seeds are in: superseded, rerun among the same nodes."""

    def publish(
        self, server: LyingCoordinator, record: RoundRecord, view: Shown, *, unanimous: bool
    ) -> bool:
        server.supersede(record, f"round {record.index} ({record.name!r}) is rerun")
        return False


@pytest.mark.parametrize("reruns", [0, 2])
def test_reruns_after_the_seeds_are_counted_and_stop_at_the_cap(
    tmp_path: Path, processes: Processes, reruns: int
) -> None:
    federation = make_federation(
        tmp_path / "fed",
        NODES,
        residual=True,
        extra=["--epsilon-budget", str(BUDGET), "--max-reruns", str(reruns)],
    )
    attack = Attack(federation, tmp_path / "run", processes, SupersedeAfterSeeds())
    attack.start()
    codes = attack.exits()
    server = attack.coordinator
    rounds = list(server.rounds)
    completed = [r for r in rounds if set(r.answers) == set(NODES)]
    clean = attack.audit("a", 0)
    floor = floors(attack.manifest("a", 0))
    attack.serving.stop()

    # Every node stopped on its own at the same attempt, before sending it.
    assert codes == dict.fromkeys(NODES, 1), attack.describe()
    last = rounds[-1]
    assert last.uploads == {} and len(completed) == len(rounds) - 1 == reruns + 1
    earlier = ", ".join(str(r.index) for r in completed)
    for node in NODES:
        text = attack.nodes[node].stderr()
        assert "Traceback" not in text, text
        assert (
            f"failed: round {last.index} ('sums') would be attempt {reruns + 2} of plan round "
            f"'sums': this node released its {reruns + 1} earlier attempts (rounds {earlier}) "
            f"and each was superseded, while session.max_reruns = {reruns} allows at most "
            f"{reruns} rerun"
        ) in text, text
        silent = "; ".join(f"round {r.index}: nobody ({r.reason})" for r in completed)
        assert f"Silent, as the coordinator reported: {silent}; nothing was sent" in text, text
        ledger = attack.ledger(node)
        releases = [e for e in ledger["entries"] if e["kind"] == "release"]
        assert sorted(e["round_index"] for e in releases) == [r.index for r in completed]
        assert ledger["totals"]["outsider"]["epsilon"] <= BUDGET
    assert ledger_gaps(attack) == []

    # The same clean values under len(completed) independent noises: their mean
    # has the noise shrunk by √k, which the ledger's composition accounts for.
    bits = federation.config.fixed_point_bits
    one = leftover(stripped(completed[0], "a"), clean, completed[0], floor, bits)
    words = [stripped(r, "a").view(np.int64) for r in completed]
    mean = np.mean(np.stack(words).astype(np.float64), axis=0)
    k = len(completed)
    offsets = (mean - clean.view(np.int64)) / 2**bits
    scaled = np.concatenate(
        [offsets[s.offset : s.offset + s.size] / floor[s.name] for s in completed[0].layout]
    )
    averaged = float(np.sqrt(np.mean(np.square(scaled))))
    ledger = attack.ledger("a")["totals"]
    print(
        f"superseded reruns (max_reruns {reruns}): {k} releases before the cap stopped them; "
        f"one egress keeps "
        f"{one.rms:.3f}× the floor, the mean of {k} {averaged:.3f}× (1/√k = {k**-0.5:.3f}); "
        f"ledger ε outsider {ledger['outsider']['epsilon']:.3f}, coordinator "
        f"{ledger['coordinator']['epsilon']:.3f}"
    )
