"""A resuming node is shown another roster than it verified: a key swapped, validly signed.

Round 0 runs honestly up to its unmask answers and is never published, so
every node waits. Node a is killed and started again. From then on the roster
shown to a carries, for node c, a fresh session key signed with c's own
identity key — what a lying coordinator holds if c ever joined again with a
new key (say, after losing its OUT folder), and which verifies against the
pinned identity. Were a to take it, its pairwise seed with c would change in
mid-session. a recorded the roster it verified in STATE/sessions.json before
its first upload, so it stops on resuming, naming c and both key
fingerprints, and sends nothing more.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from noise.keys import EphemeralKey, IdentityKey, key_fingerprint
from proto.zerosum.v1 import session_pb2 as pb
from tests.adversary.forged_rosters import rehashed, signed_by
from tests.adversary.lying_server import LyingCoordinator, RoundRecord, Script, Shown
from tests.adversary.scenario import Attack, Processes, make_federation

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")
RESUMED, SWAPPED = "a", "c"
END = "the test coordinator ends the session after the resumed node stopped"


class SwapOnResume(Script):
    """Round 0 never published; once ``swap`` is set, a sees c under another signed key."""

    def __init__(self, identity_of_c: IdentityKey) -> None:
        self.identity = identity_of_c
        self.key = EphemeralKey.generate()
        self.swap = False

    def roster(self, server: LyingCoordinator, caller: str, roster: pb.Roster) -> pb.Roster:
        if not self.swap or caller != RESUMED:
            return roster
        bundles = [
            signed_by(self.identity, self.key, server, SWAPPED) if b.node_id == SWAPPED else b
            for b in roster.bundles
        ]
        return rehashed(server, roster, bundles)

    def publish(
        self, server: LyingCoordinator, record: RoundRecord, view: Shown, *, unanimous: bool
    ) -> bool:
        return False


def test_a_swapped_roster_key_stops_the_resuming_node(tmp_path: Path, processes: Processes) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    script = SwapOnResume(federation.identity(SWAPPED))
    attack = Attack(federation, tmp_path / "run", processes, script)
    attack.start()
    record: RoundRecord = attack.wait_for(
        "every node's unmask answer",
        lambda: (
            (r := attack.coordinator.round(0)) is not None and set(NODES) <= set(r.answers) and r
        ),
    )
    honest = {b.node_id: bytes(b.public_key) for b in attack.coordinator.honest_roster().bundles}
    attack.nodes[RESUMED].kill()
    with attack.coordinator.lock:
        script.swap = True
        uploads, attested = dict(record.uploads), record.attested(RESUMED)
    attack.start([RESUMED])
    assert attack.nodes[RESUMED].wait(30) == 1, attack.describe()
    text = attack.nodes[RESUMED].stderr()
    assert "Traceback" not in text, text
    last = text.strip().splitlines()[-1]
    assert last.startswith(f"zerosum node {RESUMED}: failed: the roster of session "), last
    assert (
        f"differs from the one this node verified before the restart ({SWAPPED}'s session key "
        f"is {key_fingerprint(script.key.public_bytes())}, verified as "
        f"{key_fingerprint(honest[SWAPPED])})"
    ) in last, last
    assert "nothing more was sent" in last, last
    with attack.coordinator.lock:
        # Nothing after the restart: no new upload, attestation or answer from a.
        assert record.uploads[RESUMED] is uploads[RESUMED]
        assert record.attested(RESUMED) == attested
    attack.end(END)
