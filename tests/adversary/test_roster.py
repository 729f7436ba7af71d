"""A coordinator alters the roster: a substituted key, a changed roster hash, an earlier roster.

A coordinator that could put a key of its own in the roster would share every
"pairwise" seed with the node it impersonates, and so could strip every mask;
one that shows a roster from an earlier session, or one whose hash does not
match its bundles, could make nodes derive seeds or sign statements for keys
nobody holds now. Each node verifies every bundle against the identity key
pinned for it in the federation config, for this config hash and this session,
and recomputes the roster hash (docs/design.md §4.2), so every node refuses
before any upload: nothing is released, the ledgers stay empty and the exit
status and last line name the node whose entry was rejected and why.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from noise.keys import EphemeralKey, IdentityKey
from proto.zerosum.v1 import session_pb2 as pb
from tests.adversary.forged_rosters import rehashed, relabelled, signed_by
from tests.adversary.lying_server import LyingCoordinator, Script
from tests.adversary.scenario import Attack, Processes, ledger_gaps, make_federation

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")
TARGET = "b"


class SubstituteKey(Script):
    """The roster carries, for TARGET, a key the coordinator chose.

    ``forged``: a fresh X25519 key signed with an Ed25519 key the coordinator
    made; ``borrowed``: node c's key and its genuine signature (by another
    identity), relabelled as TARGET's.
    """

    def __init__(self, how: str) -> None:
        self.how = how
        self.identity = IdentityKey.generate()
        self.key = EphemeralKey.generate()

    def roster(self, server: LyingCoordinator, caller: str, roster: pb.Roster) -> pb.Roster:
        bundles = [
            self._substitute(server, roster) if b.node_id == TARGET else b for b in roster.bundles
        ]
        return rehashed(server, roster, bundles)

    def _substitute(self, server: LyingCoordinator, roster: pb.Roster) -> pb.KeyBundle:
        if self.how == "forged":
            return signed_by(self.identity, self.key, server, TARGET)
        other = next(b for b in roster.bundles if b.node_id == "c")
        return relabelled(other, TARGET)


class AlteredHash(Script):
    """The honest bundles with a roster hash that is not theirs."""

    def roster(self, server: LyingCoordinator, caller: str, roster: pb.Roster) -> pb.Roster:
        altered = pb.Roster()
        altered.CopyFrom(roster)
        altered.roster_hash = hashlib.sha256(b"another roster").digest()
        return altered


class EarlierRoster(Script):
    """The bundles the nodes signed for the server's previous session, rehashed for this one."""

    def roster(self, server: LyingCoordinator, caller: str, roster: pb.Roster) -> pb.Roster:
        _, earlier = server.earlier[-1]
        return rehashed(server, roster, [earlier[n] for n in sorted(earlier)])


def _last_run(attack: Attack) -> dict[str, int]:
    """Start the nodes, take their exit codes, then stop the lying coordinator."""
    attack.start()
    codes = attack.exits()
    attack.serving.stop()
    return codes


def _assert_refused(attack: Attack, codes: dict[str, int], *needles: str) -> None:
    """Every node exited 1 before uploading, its last line naming the fault."""
    assert codes == dict.fromkeys(NODES, 1), attack.describe()
    for record in attack.coordinator.rounds:
        assert record.uploads == {}
    for node in NODES:
        text = attack.nodes[node].stderr()
        assert "Traceback" not in text, text
        last = text.strip().splitlines()[-1]
        assert last.startswith(f"zerosum node {node}: failed: "), last
        for needle in needles:
            assert needle in last, last
        assert not (attack.out(node) / "egress").exists()
        releases = [e for e in attack.ledger(node)["entries"] if e["kind"] == "release"]
        assert releases == []
    assert ledger_gaps(attack) == []


@pytest.mark.parametrize("how", ["forged", "borrowed"])
def test_a_substituted_key_is_refused_by_every_node(
    tmp_path: Path, processes: Processes, how: str
) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    attack = Attack(federation, tmp_path / "run", processes, SubstituteKey(how))
    codes = _last_run(attack)
    _assert_refused(
        attack,
        codes,
        f"roster entry of node {TARGET!r} rejected: ",
        "the signature does not verify against the pinned identity key",
    )


def test_an_altered_roster_hash_or_an_earlier_roster_is_refused(
    tmp_path: Path, processes: Processes
) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    script: Script = AlteredHash()
    attack = Attack(federation, tmp_path / "run", processes, script)
    attack.start()
    codes = attack.exits()
    _assert_refused(attack, codes, "the roster hash does not match the bundles it lists")

    # The same nodes start again; the coordinator runs a new session but shows
    # the bundles they signed for the one before.
    earlier = attack.coordinator.session_id
    attack.coordinator.new_session()
    attack.coordinator.script = EarlierRoster()
    codes = _last_run(attack)
    _assert_refused(
        attack,
        codes,
        f"it was signed for session {earlier!r}, not the current session "
        f"{attack.coordinator.session_id!r}; it is replayed from another session",
    )
