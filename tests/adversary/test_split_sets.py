"""A coordinator shows two groups of survivors two different survivor sets of one round.

Nodes a and b are told c survived and d dropped (S₁ = {a, b, c}, D₁ = {d});
c and d are told b survived and a dropped (S₂ = {b, c, d}, D₂ = {a}). Were
both groups to answer, the coordinator would hold every seed and the pair
terms of a with the others and of d with the others: a's and d's uploads
stripped. Each survivor answers only after every member of the S it was shown
has signed that same S (Bonawitz et al. 2017, ACM CCS §4), and each S contains
a node of the other group, which signed the other set. Two ways to lie:

* *withheld*: the coordinator relays only the attestations of the set each
  node was shown. Nobody's set is ever fully attested; nobody answers.
* *relayed*: it relays every attestation it holds, hoping a node does not
  look closely. Every node sees a signature of a different set (or by a node
  outside its S) and refuses, naming the inconsistency.

Either way no self-mask seed and no pair term reaches the coordinator, so
every upload stays a one-time pad.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from proto.zerosum.v1 import session_pb2 as pb
from tests.adversary.lying_server import LyingCoordinator, RoundRecord, Script, Shown
from tests.adversary.reconstruct import floors, leftover, stripped
from tests.adversary.scenario import Attack, Processes, ledger_gaps, make_federation

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c", "d")
SETS = {
    "a": (("a", "b", "c"), ("d",)),
    "b": (("a", "b", "c"), ("d",)),
    "c": (("b", "c", "d"), ("a",)),
    "d": (("b", "c", "d"), ("a",)),
}
POLLS = 6
END = "the test coordinator ends the session after showing two survivor sets"


class SplitSets(Script):
    """Round 0's unmask step shows SETS; ``relay_all`` relays every attestation to everyone."""

    def __init__(self, relay_all: bool) -> None:
        self.relay_all = relay_all

    def shown(
        self, server: LyingCoordinator, record: RoundRecord, caller: str
    ) -> tuple[Sequence[str], Sequence[str]]:
        return SETS[caller]

    def attestations(
        self, server: LyingCoordinator, record: RoundRecord, caller: str, shown: Shown
    ) -> list[pb.SurvivorAttestation]:
        if not self.relay_all:
            return super().attestations(server, record, caller, shown)
        return [
            record.attestations[h][n]
            for h in sorted(record.attestations)
            for n in sorted(record.attestations[h])
        ]


def _assert_all_padded(
    attack: Attack,
    record: RoundRecord,
    clean: dict[str, NDArray[np.uint64]],
    floor: dict[str, dict[str, float]],
) -> None:
    assert record.answers == {}
    bits = attack.federation.config.fixed_point_bits
    for node in NODES:
        left = leftover(stripped(record, node), clean[node], record, floor[node], bits)
        assert left.rms > 1e6, (node, left)


@pytest.mark.parametrize("relay_all", [False, True], ids=["withheld", "relayed"])
def test_two_survivor_sets_for_one_round_reveal_nothing(
    tmp_path: Path, processes: Processes, relay_all: bool
) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    attack = Attack(federation, tmp_path / "run", processes, SplitSets(relay_all))
    attack.start()
    record: RoundRecord = attack.wait_for(
        "every node to attest the set it was shown",
        lambda: (
            (r := attack.coordinator.round(0)) is not None
            and all(r.attested(n) for n in NODES)
            and r
        ),
    )
    if relay_all:
        codes = attack.exits()
        clean = {n: attack.audit(n, 0) for n in NODES}
        floor = {n: floors(attack.manifest(n, 0)) for n in NODES}
        attack.serving.stop()
    else:
        seen = dict(record.polls)
        attack.wait_for(
            "every node to poll again",
            lambda: all(record.polls[n] >= seen.get(n, 0) + POLLS for n in NODES),
        )
        clean = {n: attack.audit(n, 0) for n in NODES}
        floor = {n: floors(attack.manifest(n, 0)) for n in NODES}
        codes = attack.end(END)

    # Each node signed exactly the set it was shown, once.
    for node in NODES:
        (shown,) = set(record.shown[node])
        assert (shown.survivors, shown.dropped) == SETS[node]
        assert record.attested(node) == {shown.survivor_hash}
    _assert_all_padded(attack, record, clean, floor)
    assert codes == dict.fromkeys(NODES, 1), attack.describe()
    for node in NODES:
        text = attack.nodes[node].stderr()
        assert "Traceback" not in text, text
        if relay_all:
            assert "refused to unmask round 0 ('sums'): survivor set inconsistent: " in text, text
            assert "survivor set inconsistent" in record.refusals[node]
        else:
            assert record.refusals == {}
            assert f"the session failed: {END}" in text, text
    assert ledger_gaps(attack) == []
