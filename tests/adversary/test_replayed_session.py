"""A coordinator replays a whole session id to collect what one run of it withheld.

First run: the coordinator tells b, c and d that a dropped (they send their
seeds and pair terms with a) and tells a that everyone survived (a attests,
but never sees the others' signatures of that set, so it keeps its seed). It
publishes the sum over {b, c, d}, so b, c and d complete the session. Second run,
under the *same* session id: the nodes are started again and the coordinator
shows everyone the set "all survived" for round 0 — if a now revealed the
seed of an upload carrying the same egress, the pair terms from the first run
would strip it. What b, c and d recorded of the session in their node state
folders stops them: they refuse the replayed session id at the join
(node/records/state_folder.py), so a never sees the signatures it waits for. (Were they to
rejoin, the record of pair terms already revealed would still stop a second,
smaller dropped set: node/protocol/unmask.py, check_against_revealed.)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.adversary.lying_server import LyingCoordinator, RoundRecord, Script, Shown
from tests.adversary.reconstruct import floors, leftover, stripped
from tests.adversary.scenario import Attack, Processes, ledger_gaps, make_federation

pytestmark = pytest.mark.integration

# Four nodes: with T = 1 a round needs T + 2 = 3 survivors (min_nodes), so the
# others answer a dropped set of one.
NODES = ("a", "b", "c", "d")
VICTIM = "a"
OTHERS = ("b", "c", "d")
END = "the test coordinator ends the replayed session"


class DropThenPublish(Script):
    """Round 0: D = {victim} for the others, D = ∅ for the victim; the others' set is published."""

    def shown(
        self, server: LyingCoordinator, record: RoundRecord, caller: str
    ) -> tuple[Sequence[str], Sequence[str]]:
        if caller == VICTIM:
            return super().shown(server, record, caller)
        return OTHERS, (VICTIM,)

    def publish(
        self, server: LyingCoordinator, record: RoundRecord, view: Shown, *, unanimous: bool
    ) -> bool:
        return view.dropped == (VICTIM,)


def test_a_replayed_session_id_gets_no_second_survivor_set(
    tmp_path: Path, processes: Processes
) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    attack = Attack(federation, tmp_path / "run", processes, DropThenPublish())
    attack.start()
    first_codes = attack.exits()
    server = attack.coordinator
    session_id = server.session_id
    first = server.rounds[0]
    clean = attack.audit(VICTIM, 0)
    floor = floors(attack.manifest(VICTIM, 0))
    key = attack.session_key(VICTIM)
    beta = attack.self_mask_seed(VICTIM, 0, key)
    assert first_codes == {"a": 1, **dict.fromkeys(OTHERS, 0)}, attack.describe()
    assert first.result is not None and first.result.survivors == OTHERS
    assert VICTIM not in first.answers
    # The victim learnt that its upload was left out of the published sum.
    text = attack.nodes[VICTIM].stderr()
    assert "Traceback" not in text
    assert (
        "failed: the aggregate of round 0 ('sums') carries no statement of my own upload; "
        "it does not count what I sent" in text
    ), text

    attack.coordinator.new_session(session_id)
    attack.coordinator.script = Script()
    attack.start()
    # b, c and d stop on their own, at the join or at the unmask step.
    others = {n: attack.nodes[n].wait(60) for n in OTHERS}
    record = attack.coordinator.round(0)
    if record is not None:
        seen = record.polls[VICTIM]
        attack.wait_for(
            "the victim to poll after the refusals", lambda: record.polls[VICTIM] >= seen + 6
        )
    codes = {**attack.end(END), **others}

    for node in OTHERS:
        text = attack.nodes[node].stderr()
        assert "Traceback" not in text, text
        last = text.strip().splitlines()[-1]
        # Their state folders record the session as completed: they refuse
        # the replayed id at the join, before any key or upload.
        assert f"refusing session {session_id}: " in last, last
        assert "a completed session is never taken part in again" in last, last
        assert record is None or node not in record.uploads
    assert codes == dict.fromkeys(NODES, 1), attack.describe()
    runs = [first] if record is None else [first, record]
    seeds = [bytes(a.header.self_mask_seed) for r in runs for a in r.answers.values()]
    assert beta not in seeds
    # Both runs' uploads of the victim, with everything both runs revealed, stay padded.
    bits = federation.config.fixed_point_bits
    padded = leftover(stripped(first, VICTIM), clean, first, floor, bits)
    assert padded.rms > 1e6, padded
    if record is not None and VICTIM in record.uploads:
        again = leftover(stripped(record, VICTIM), clean, record, floor, bits)
        assert again.rms > 1e6, again
    assert ledger_gaps(attack) == []
