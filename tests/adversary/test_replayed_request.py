"""A coordinator asks again for a round it already unmasked, with another survivor set.

Round 0 runs honestly up to its unmask answers: everyone survived (D = ∅),
every node attests that set and sends its self-mask seed. The coordinator
does not publish; it issues a second request for the same round index to b,
c and d, now saying a dropped (D = {a}). Had they answered, their pair terms
with a plus a's seed already received would strip a's upload to its clean
values. A node signs one survivor set per round index, ever, and keeps it in
STATE/survivor-sets.json (node/records/survivor_sets.py), so all three refuse ("signed once
per round"); b is killed and restarted between the two requests, so its
refusal comes from that file, not from memory. In the *restored* variant b's
OUT folder is also put back as it was before b signed anything (a copy taken
once its upload was in): it still holds b's session key, so b resumes the
session, and the record in STATE alone makes it refuse.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from node.egress.approval import sign_approval, write_approval
from node.egress.bundle import EgressBundle
from tests.adversary.lying_server import LyingCoordinator, RoundRecord, Script, Shown
from tests.adversary.reconstruct import floors, leftover, stripped
from tests.adversary.scenario import Attack, Processes, ledger_gaps, make_federation

pytestmark = pytest.mark.integration

# Four nodes: with T = 1 a round needs T + 2 = 3 survivors (min_nodes), so the
# second request's set of three is refused for being a second set, not a small one.
NODES = ("a", "b", "c", "d")
VICTIM = "a"
ASKED_AGAIN = ("b", "c", "d")
RESTARTED = "b"
HELD = "c"
END = "the test coordinator ends the session after asking twice"


def _approve(attack: Attack, node: str) -> None:
    """As the node's output checker: approve its round-0 bundle once it is written."""
    folder = attack.out(node) / "egress" / "round-0"
    attack.wait_for(f"{node}'s round-0 bundle", (folder / "manifest.json").exists)
    signed = sign_approval(
        attack.federation.checker(node),
        EgressBundle.manifest_sha256(folder),
        "approve",
        reviewer="output checker",
    )
    write_approval(folder, signed)


class SecondRequest(Script):
    """Round 0: all survived, never published; then D = {victim} for the nodes in ``again``."""

    def __init__(self) -> None:
        self.again: set[str] = set()

    def shown(
        self, server: LyingCoordinator, record: RoundRecord, caller: str
    ) -> tuple[Sequence[str], Sequence[str]]:
        if record.index == 0 and caller in self.again:
            return [n for n in record.participants if n != VICTIM], [VICTIM]
        return super().shown(server, record, caller)

    def publish(
        self, server: LyingCoordinator, record: RoundRecord, view: Shown, *, unanimous: bool
    ) -> bool:
        return record.index != 0


@pytest.mark.parametrize("restored", [False, True], ids=["restarted", "restored"])
def test_a_second_survivor_set_for_an_answered_round_is_refused(
    tmp_path: Path, processes: Processes, restored: bool
) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    script = SecondRequest()
    attack = Attack(federation, tmp_path / "run", processes, script)
    backup = tmp_path / "backup"
    if restored:
        # c waits at its approval gate until b's OUT is copied: b has uploaded,
        # and the round cannot reach its unmask step, so b has signed nothing yet.
        attack.start([n for n in NODES if n != HELD])
        attack.start([HELD], approve="manual")
        attack.wait_for(
            "b's upload",
            lambda: (r := attack.coordinator.round(0)) is not None and RESTARTED in r.uploads,
        )
        shutil.copytree(attack.out(RESTARTED), backup, ignore=shutil.ignore_patterns("node.lock"))
        _approve(attack, HELD)
    else:
        attack.start()
    record: RoundRecord = attack.wait_for(
        "every node's answer to the first request",
        lambda: (
            (r := attack.coordinator.round(0)) is not None and set(NODES) <= set(r.answers) and r
        ),
    )
    first = record.shown[VICTIM][0]
    assert first.dropped == () and all(record.attested(n) == {first.survivor_hash} for n in NODES)

    # b is killed after its answer and started again; then b, c and d are asked again.
    attack.nodes[RESTARTED].kill()
    if restored:
        shutil.rmtree(attack.out(RESTARTED))
        shutil.copytree(backup, attack.out(RESTARTED))
    polled = record.polls[RESTARTED]
    attack.start([RESTARTED])
    attack.wait_for(
        "the restarted node to await round 0 again",
        lambda: record.polls[RESTARTED] > polled,
    )
    with attack.coordinator.lock:
        script.again = set(ASKED_AGAIN)
    asked = {n: attack.nodes[n] for n in ASKED_AGAIN}
    codes = {n: spawned.wait(30) for n, spawned in asked.items()}
    clean = {n: attack.audit(n, 0) for n in NODES}
    floor = {n: floors(attack.manifest(n, 0)) for n in NODES}
    codes.update(attack.end(END))

    second = record.shown[RESTARTED][-1]
    assert second.dropped == (VICTIM,)
    for node in ASKED_AGAIN:
        assert record.shown[node][-1] == second
        # Neither signed the second set nor sent pair terms with the victim.
        assert record.attested(node) == {first.survivor_hash}
        assert record.answers[node].header.survivor_hash == first.survivor_hash
        assert record.answers[node].corrections is None
        why = record.refusals[node]
        assert "A survivor set is signed once per round" in why, why
        text = attack.nodes[node].stderr()
        assert "Traceback" not in text, text
        assert (
            f"zerosum node {node}: failed: refused to unmask round 0 ('sums'): I already "
            "signed survivors {a, b, c, d} (dropped {}) for round 0" in text
        ), text
    assert codes == dict.fromkeys(NODES, 1), attack.describe()
    # Every seed reached the server, no pair term did: each upload keeps its mask.
    bits = federation.config.fixed_point_bits
    for node in NODES:
        kept = leftover(stripped(record, node), clean[node], record, floor[node], bits)
        assert kept.keeps_floor, (node, kept)
        print(f"replayed request: {node} left {kept.rms:.3f}× its floor")
    assert ledger_gaps(attack) == []
