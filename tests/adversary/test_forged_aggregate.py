"""A coordinator publishes a round's "sum" that is not the sum of what the nodes sent.

Every upload is y_k = z_k + b_k with b_k a uniform pad whose seed β_k leaves
the node only in its unmask answer. Until a node sent β_k, no aggregate that
counts its upload can be a sum of what it released: the coordinator cannot
take b_k out. The statements a node checks (node/protocol/statements.py) bind which
payloads an aggregate claims to count, not its arithmetic (docs/design.md §5
lists that as not yet defended), so two forgeries are tried:

* *before the seeds*: every node uploads and attests the honest survivor set,
  and the coordinator, without relaying the attestations (so nobody answers),
  publishes a plausible but wrong sum — 2·q(x_a) + q(x_b) + q(x_c), made here
  from the audit payloads — with every genuine upload statement. A node that
  never sent its seed can tell that this cannot be the sum of its upload.
* *after the seeds*: every node answered, and the coordinator publishes Σ y_k
  without taking the self-masks out, a uniform word per entry;
* *the true sum, altered*: every node answered, the coordinator takes the
  self-masks out as it should, then adds 1000 subjects to ``n`` and scales
  ``sum_y`` by 1.5 before publishing — an aggregate that decodes to plausible
  sums.

The aggregate check (docs/design.md §4.5: challenge contributions sealed in
the uploads fix a random vector only after every upload, the blinded tags in
the answers sum to the tags of the true aggregate) refuses all three with a
sentence.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from noise.fixed_point import FixedPointCodec, wrapping_sum
from proto.zerosum.v1 import session_pb2 as pb
from tests.adversary.lying_server import LyingCoordinator, RoundRecord, Script, Shown
from tests.adversary.reconstruct import stripped
from tests.adversary.scenario import Attack, Processes, ledger_gaps, make_federation

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")


class OwnAttestationsOnly(Script):
    """Relays each node only its own attestation, so no node ever answers."""

    def attestations(
        self, server: LyingCoordinator, record: RoundRecord, caller: str, shown: Shown
    ) -> list[pb.SurvivorAttestation]:
        relayed = super().attestations(server, record, caller, shown)
        return [a for a in relayed if a.node_id == caller]


class NeverPublish(Script):
    """Honest up to every answer, then publishes nothing on its own."""

    def publish(
        self, server: LyingCoordinator, record: RoundRecord, view: Shown, *, unanimous: bool
    ) -> bool:
        return False


def _assert_stopped_with_a_sentence(
    attack: Attack, codes: dict[str, int], because: str = ""
) -> None:
    for node in NODES:
        text = attack.nodes[node].stderr()
        assert "Traceback" not in text, text
        last = text.strip().splitlines()[-1]
        assert last.startswith(f"zerosum node {node}: failed: "), last
        assert because in last, last
    assert codes == dict.fromkeys(NODES, 1), attack.describe()
    assert ledger_gaps(attack) == []


def test_a_sum_published_before_any_seed_is_refused(tmp_path: Path, processes: Processes) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    attack = Attack(federation, tmp_path / "run", processes, OwnAttestationsOnly())
    attack.start()
    record: RoundRecord = attack.wait_for(
        "every node to attest round 0",
        lambda: (
            (r := attack.coordinator.round(0)) is not None
            and all(r.attested(n) for n in NODES)
            and r
        ),
    )
    clean = {n: attack.audit(n, 0) for n in NODES}
    forged = wrapping_sum([clean["a"], *clean.values()])
    attack.coordinator.publish_forged(record, forged)
    codes = attack.exits()

    assert record.answers == {}
    assert not np.array_equal(forged, wrapping_sum(clean.values()))
    _assert_stopped_with_a_sentence(attack, codes, "the aggregate of round 0 ('sums') fails ")


def test_a_sum_with_the_self_masks_left_in_stops_the_nodes_with_a_sentence(
    tmp_path: Path, processes: Processes
) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    attack = Attack(federation, tmp_path / "run", processes, NeverPublish())
    attack.start()
    record: RoundRecord = attack.wait_for(
        "every node's unmask answer",
        lambda: (
            (r := attack.coordinator.round(0)) is not None and set(NODES) <= set(r.answers) and r
        ),
    )
    attack.coordinator.publish_forged(
        record, wrapping_sum([record.uploads[n].words for n in NODES])
    )
    codes = attack.exits()
    _assert_stopped_with_a_sentence(attack, codes, "the aggregate of round 0 ('sums') fails ")


def test_the_true_sum_altered_after_the_seeds_is_refused(
    tmp_path: Path, processes: Processes
) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    attack = Attack(federation, tmp_path / "run", processes, NeverPublish())
    attack.start()
    record: RoundRecord = attack.wait_for(
        "every node's unmask answer",
        lambda: (
            (r := attack.coordinator.round(0)) is not None and set(NODES) <= set(r.answers) and r
        ),
    )
    clean = {n: attack.audit(n, 0) for n in NODES}
    # What an honest coordinator publishes: Σ y_k − Σ b_k, the clean sum
    # (no residual noise, no dropout).
    true = wrapping_sum([stripped(record, n) for n in NODES])
    assert np.array_equal(true, wrapping_sum(clean.values()))
    codec = FixedPointCodec(federation.config.fixed_point_bits)
    values = codec.decode(true)
    slots = {slot.name: slot for slot in record.layout}
    n, sum_y = slots["n"], slots["sum_y"]
    values[n.offset : n.offset + n.size] += 1000.0
    values[sum_y.offset : sum_y.offset + sum_y.size] *= 1.5
    forged = codec.encode(values)
    attack.coordinator.publish_forged(record, forged)
    codes = attack.exits()
    _assert_stopped_with_a_sentence(attack, codes, "the aggregate of round 0 ('sums') fails ")
