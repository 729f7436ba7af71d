"""A coordinator reports an uploaded node as dropped to the others, and as survived to it.

With both stories believed, the others would reveal their pair terms with the
victim (its zero-sum mask) and the victim its self-mask seed: its upload minus
both is its clean values (plus residual noise, if any). The survivor-set
attestations stop that: the victim reveals its seed only once it sees every
survivor's signature of *its* survivor set, which the others never give, so
its upload stays a one-time pad (docs/design.md §4.6, Bonawitz et al. 2017,
ACM CCS §4). The others' answers cost them no more than their floor.

Each test reconstructs, from everything the server received, what it can of
each node's clean values (tests/adversary/reconstruct.py) and compares with
the nodes' own audit payloads, then does the same with the victim's seed
re-derived from its saved session key — which the server never had — to show
what the lie would have given it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from proto.zerosum.v1 import session_pb2 as pb
from tests.adversary.lying_server import LyingCoordinator, RoundRecord, Script, Shown
from tests.adversary.reconstruct import floors, leftover, stripped
from tests.adversary.scenario import Attack, Processes, ledger_gaps, make_federation

pytestmark = pytest.mark.integration

# Four nodes: with T = 1 a round needs T + 2 = 3 survivors (min_nodes), so that
# revealing pair terms with the one dropped node leaves every class some noise.
NODES = ("a", "b", "c", "d")
VICTIM = "a"
OTHERS = ("b", "c", "d")
# GetResult polls of the victim after the others answered: it had every
# chance to see what it would ever see (nodes poll every 0.2 s).
VICTIM_POLLS = 6
END = "the test coordinator ends the session after its false dropout"


class FalseDropout(Script):
    """In round ``index``: D = {victim} for the others, D = ∅ for the victim.

    With ``relabel`` the victim is also shown the others' attestations of
    their set with the survivor hash rewritten to the victim's (a signature
    the coordinator cannot make, passed off as one).
    """

    def __init__(self, victim: str, index: int = 0, *, relabel: bool = False) -> None:
        self.victim = victim
        self.index = index
        self.relabel = relabel

    def attestations(
        self, server: LyingCoordinator, record: RoundRecord, caller: str, shown: Shown
    ) -> list[pb.SurvivorAttestation]:
        honest = super().attestations(server, record, caller, shown)
        if not self.relabel or caller != self.victim:
            return honest
        relabelled = []
        for theirs in record.attestations.values():
            for node, attestation in sorted(theirs.items()):
                if node != self.victim:
                    copy = pb.SurvivorAttestation()
                    copy.CopyFrom(attestation)
                    copy.survivor_hash = shown.survivor_hash
                    relabelled.append(copy)
        return honest + relabelled

    def shown(
        self, server: LyingCoordinator, record: RoundRecord, caller: str
    ) -> tuple[Sequence[str], Sequence[str]]:
        if record.index != self.index or caller == self.victim:
            return super().shown(server, record, caller)
        return [n for n in record.participants if n != self.victim], [self.victim]


def _lie_played_out(attack: Attack, index: int) -> RoundRecord:
    """Wait until the others answered and the victim polled VICTIM_POLLS times more."""
    record: RoundRecord = attack.wait_for(
        "the others' unmask answers",
        lambda: (
            (r := attack.coordinator.round(index)) is not None
            and set(OTHERS) <= set(r.answers)
            and r
        ),
    )
    seen = record.polls[VICTIM]
    attack.wait_for(
        "the victim to poll after the others answered",
        lambda: record.polls[VICTIM] >= seen + VICTIM_POLLS,
    )
    return record


def _assert_ended_cleanly(attack: Attack, codes: dict[str, int]) -> None:
    assert codes == dict.fromkeys(NODES, 1), attack.describe()
    for node in NODES:
        text = attack.nodes[node].stderr()
        assert "Traceback" not in text, text
        assert f"the session failed: {END}" in text, text
    assert ledger_gaps(attack) == []


@pytest.mark.parametrize("residual", [False, True], ids=["no-residual", "residual"])
def test_false_dropout_leaves_the_victims_upload_padded(
    tmp_path: Path, processes: Processes, residual: bool
) -> None:
    federation = make_federation(tmp_path / "fed", NODES, residual=residual)
    attack = Attack(federation, tmp_path / "run", processes, FalseDropout(VICTIM))
    attack.start()
    record = _lie_played_out(attack, 0)
    key = attack.session_key(VICTIM)
    bits = federation.config.fixed_point_bits
    clean = {n: attack.audit(n, 0) for n in NODES}
    floor = {n: floors(attack.manifest(n, 0)) for n in NODES}
    codes = attack.end(END)

    # The victim attested the set it was shown and never answered.
    shown = record.shown[VICTIM][-1]
    assert shown.dropped == ()
    assert record.attested(VICTIM) == {shown.survivor_hash}
    assert VICTIM not in record.answers and VICTIM not in record.refusals
    beta = attack.self_mask_seed(VICTIM, 0, key)
    assert all(bytes(a.header.self_mask_seed) != beta for a in record.answers.values())
    # The others were told the victim dropped and sent their pair terms with it.
    for node in OTHERS:
        assert record.answers[node].dropped == (VICTIM,)

    # What the server holds of the victim is still a one-time pad ...
    padded = leftover(stripped(record, VICTIM), clean[VICTIM], record, floor[VICTIM], bits)
    assert padded.rms > 1e6, padded
    # ... which its seed alone would have lifted: the lie would have worked.
    lifted = leftover(
        stripped(record, VICTIM, seed=beta), clean[VICTIM], record, floor[VICTIM], bits
    )
    if residual:
        # Only q(r_victim) would be left: measured at about 0.58 of the floor,
        # so 0.8 sits six standard errors from it and below the floor test's bound.
        assert not lifted.exact and lifted.rms < 0.8 and not lifted.keeps_floor, lifted
    else:
        assert lifted.exact, lifted
    # The others' answers leave them their floor.
    for node in OTHERS:
        kept = leftover(stripped(record, node), clean[node], record, floor[node], bits)
        assert kept.keeps_floor, (node, kept)
    print(
        f"false dropout ({'residual' if residual else 'no residual'}): victim left "
        f"{padded.rms:.3g}× its floor (with its seed: {lifted.rms:.3g}×); others "
        + ", ".join(
            f"{n} {leftover(stripped(record, n), clean[n], record, floor[n], bits).rms:.3f}×"
            for n in OTHERS
        )
    )
    _assert_ended_cleanly(attack, codes)


def test_false_dropout_in_a_cape_sum_round_keeps_the_victims_draw_hidden(
    tmp_path: Path, processes: Processes
) -> None:
    federation = make_federation(tmp_path / "fed", NODES, construction="cape")
    attack = Attack(federation, tmp_path / "run", processes, FalseDropout(VICTIM))
    attack.start()
    record = _lie_played_out(attack, 0)
    assert record.name == "cape-sum/sums"
    key = attack.session_key(VICTIM)
    bits = federation.config.fixed_point_bits
    draws = {n: attack.cape_draws(n, "sums") for n in NODES}
    codes = attack.end(END)

    assert VICTIM not in record.answers and VICTIM not in record.refusals
    beta = attack.self_mask_seed(VICTIM, 0, key)
    assert all(bytes(a.header.self_mask_seed) != beta for a in record.answers.values())
    for node in OTHERS:
        assert record.answers[node].dropped == (VICTIM,)
    unit = {slot.name: 1.0 for slot in record.layout}
    # q(ê_victim) + b_victim: the draw is still under the self-mask ...
    hidden = leftover(stripped(record, VICTIM), draws[VICTIM], record, unit, bits)
    assert hidden.rms > 1e6, hidden
    # ... and only under it: with the seed the server would hold q(ê_victim) exactly.
    lifted = leftover(stripped(record, VICTIM, seed=beta), draws[VICTIM], record, unit, bits)
    assert lifted.exact, lifted
    # The others' draws stay under their pads with each other.
    for node in OTHERS:
        left = leftover(stripped(record, node), draws[node], record, unit, bits)
        assert left.rms > 1e6, (node, left)
    print(f"CAPE false dropout: victim's draw under noise of rms {hidden.rms:.3g} (units)")
    _assert_ended_cleanly(attack, codes)


def test_relabelled_attestations_are_refused_by_the_victim(
    tmp_path: Path, processes: Processes
) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    attack = Attack(federation, tmp_path / "run", processes, FalseDropout(VICTIM, relabel=True))
    attack.start()
    victim = attack.nodes[VICTIM]
    assert victim.wait(60) == 1, attack.describe()
    record = attack.coordinator.round(0)
    assert record is not None
    attack.wait_for("the others' unmask answers", lambda: set(OTHERS) <= set(record.answers))
    clean = attack.audit(VICTIM, 0)
    floor = floors(attack.manifest(VICTIM, 0))
    codes = attack.end(END)

    text = victim.stderr()
    assert "Traceback" not in text, text
    # The victim refuses at the first relabelled attestation it is shown; which of
    # the others attested first is a race, so any of them may be the one named.
    assert any(
        f"refused to unmask round 0 ('sums'): the attestation of node {node!r} does not "
        "verify against its pinned identity key" in text
        for node in OTHERS
    ), text
    assert "does not verify" in record.refusals[VICTIM]
    assert VICTIM not in record.answers
    bits = federation.config.fixed_point_bits
    padded = leftover(stripped(record, VICTIM), clean, record, floor, bits)
    assert padded.rms > 1e6, padded
    assert codes == dict.fromkeys(NODES, 1), attack.describe()
    for node in OTHERS:
        assert f"the session failed: {END}" in attack.nodes[node].stderr()
    assert ledger_gaps(attack) == []
