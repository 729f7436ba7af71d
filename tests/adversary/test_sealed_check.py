"""The aggregate check against a coordinator that learns its sum, and against a lying member.

Before the tags were sealed, each node checked only Σ_k T_k = ⟨ρ, A⟩ = V, a
value the coordinator learnt from the blinded tags it relayed: publishing m·A
and adding (m − 1)·V to one relayed tag passed every check, and in a round of
one entry ρ = V/A (two entries: a 2^16 search). Now every survivor's tags
reach each other survivor sealed under their pairwise key and signed by their
author (docs/design.md §4.5), so:

* the m·A forgery for m = 2, 0, −1, with what would have moved the tag sum
  written into one relayed tag, is refused by every node — the coordinator
  never holds V (checked here from the attacker's side: V's bytes appear
  nowhere in what it received), and a relayed tag it alters no longer
  carries its author's signature;
* an arbitrary value in a one-entry round (logreg's ``count``) and in a
  two-entry round (a one-feature logreg step) is refused by every node;
* a member that signs garbage tags, or a garbage sealed challenge
  contribution, is named by every honest node before any seed leaves; the
  round is rerun without it and the honest nodes finish with the exact sum of
  the others' contributions.
"""

from __future__ import annotations

import contextlib
import io
import secrets
from pathlib import Path

import numpy as np
import pytest

from noise.aggregate_check import (
    challenge_contribution,
    challenge_key,
    challenge_vectors,
    tags,
    tags_to_bytes,
)
from noise.fixed_point import wrapping_sum
from noise.transcript import sealed_leaf, sealed_set_message
from proto.federation import load_federation
from proto.zerosum.v1 import session_pb2 as pb
from tests.adversary.lying_server import LyingCoordinator, RoundRecord, Script, Shown
from tests.adversary.reconstruct import stripped
from tests.adversary.scenario import Attack, Processes, make_federation
from tests.support.processes import Federation, wait_until
from zerosum.cli import main as zerosum_main

pytestmark = pytest.mark.integration

NODES = ("a", "b", "c")
FOUR = ("a", "b", "c", "d")


class Withhold(Script):
    """Honest, but publishes nothing of round ``index``: the test publishes its forgery."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.alter: bytes | None = None  # XORed into the first tag relayed with the result

    def publish(
        self, server: LyingCoordinator, record: RoundRecord, view: Shown, *, unanimous: bool
    ) -> bool:
        return unanimous and record.index != self.index

    def tags(
        self, server: LyingCoordinator, record: RoundRecord, caller: str, survivor_hash: bytes
    ) -> list[pb.SealedTags]:
        relayed = super().tags(server, record, caller, survivor_hash)
        if self.alter is None or record.index != self.index or record.aggregate is None:
            return relayed
        first = pb.SealedTags()
        first.CopyFrom(relayed[0])
        mask = self.alter.ljust(len(first.sealed), b"\0")
        first.sealed = bytes(a ^ b for a, b in zip(first.sealed, mask, strict=True))
        return [first, *relayed[1:]]


def _answered(attack: Attack, index: int, nodes: tuple[str, ...]) -> RoundRecord:
    def answered() -> RoundRecord | None:
        with attack.coordinator.lock:
            r = attack.coordinator.round(index)
            return r if r is not None and set(nodes) <= set(r.answers) else None

    record: RoundRecord = wait_until(
        answered,
        what=f"every node's unmask answer in round {index}",
        alive=list(attack.nodes.values()),
    )
    return record


def _tag_sum(attack: Attack, record: RoundRecord, aggregate: np.ndarray) -> list[bytes]:
    """V = ⟨ρ^(ℓ), A⟩ mod 2^128, from the nodes' session keys (what the check compares)."""
    server = attack.coordinator
    contributions = {
        n: challenge_contribution(
            attack.session_key(n),
            config_hash=server.config_hash,
            session_id=server.session_id,
            node_id=n,
            round_index=record.index,
        )
        for n in record.participants
    }
    key = challenge_key(contributions, round_index=record.index)
    rho = challenge_vectors(key, record.layout.size, round_index=record.index)
    return tags_to_bytes(tags(aggregate, rho))


def _held_by_coordinator(record: RoundRecord) -> bytes:
    """Every byte the nodes sent the coordinator for the round."""
    parts = [u.header.SerializeToString() for u in record.uploads.values()]
    parts += [a.SerializeToString() for by in record.attestations.values() for a in by.values()]
    parts += [a.header.SerializeToString() for a in record.answers.values()]
    return b"".join(parts)


def _assert_every_node_refused(attack: Attack, codes: dict[str, int], because: str) -> None:
    for node, spawned in attack.nodes.items():
        text = spawned.stderr()
        assert "Traceback" not in text, text
        last = text.strip().splitlines()[-1]
        assert last.startswith(f"zerosum node {node}: failed: "), last
        assert because in last, last
    assert set(codes.values()) == {1}, attack.describe()


@pytest.mark.parametrize("m", [2, 0, -1])
def test_m_times_the_aggregate_with_the_tag_sum_moved_into_one_relayed_tag_is_refused(
    tmp_path: Path, processes: Processes, m: int
) -> None:
    federation = make_federation(tmp_path / "fed", NODES)
    script = Withhold()
    attack = Attack(federation, tmp_path / "run", processes, script)
    attack.start()
    record = _answered(attack, 0, NODES)
    true = wrapping_sum([stripped(record, n) for n in NODES])
    assert np.array_equal(true, wrapping_sum([attack.audit(n, 0) for n in NODES]))
    # The attacker's side: the sum V of the tags, which the forgery needs, is in
    # nothing the coordinator received.
    v = _tag_sum(attack, record, true)
    held = _held_by_coordinator(record)
    assert not any(word in held for word in v)
    # Give it V all the same: the old forgery wrote (m − 1)·V into one relayed tag.
    moved = (((m - 1) * int.from_bytes(v[0], "big")) % (1 << 128)).to_bytes(16, "big")
    script.alter = moved
    forged = (true * np.uint64(m % (1 << 64))).astype(np.uint64)
    attack.coordinator.publish_forged(record, forged)
    codes = attack.exits()
    _assert_every_node_refused(attack, codes, "the coordinator is at fault")


def _logreg_federation(root: Path, nodes: tuple[str, ...]) -> Federation:
    """A one-feature logistic regression: rounds "count" (1 entry) and "step-1" (2 entries)."""
    argv = [
        "federation",
        "init",
        "--nodes",
        ",".join(nodes),
        "--out",
        str(root),
        "--plan",
        "logreg",
        "--n-features",
        "1",
        "--feature-range=-3,3",
        "--rounds",
        "1",
        "--coordinator",
        "127.0.0.1:1",
        "--join-deadline",
        "30",
        "--round-deadline",
        "5",
    ]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        assert zerosum_main(argv) == 0, printed.getvalue()
    rng = np.random.default_rng(19)
    for node in nodes:
        x = rng.uniform(-2, 2, 120)
        labels = (x + rng.normal(0, 1, 120) > 0).astype(int)
        rows = [f"{node}{i:03d},{labels[i]},{float(x[i])!r}" for i in range(120)]
        (root / "nodes" / node / "data.csv").write_text("id,label,x\n" + "\n".join(rows) + "\n")
    return Federation(root, load_federation(root / "federation.toml"))


@pytest.mark.parametrize(("index", "entries"), [(0, 1), (1, 2)], ids=["one-entry", "two-entry"])
def test_an_arbitrary_value_in_a_short_round_is_refused(
    tmp_path: Path, processes: Processes, index: int, entries: int
) -> None:
    federation = _logreg_federation(tmp_path / "fed", NODES)
    attack = Attack(federation, tmp_path / "run", processes, Withhold(index))
    attack.start()
    record = _answered(attack, index, NODES)
    assert record.layout.size == entries
    true = wrapping_sum([stripped(record, n) for n in NODES])
    # With V = ⟨ρ, A⟩ it could solve for ρ here (ρ = V/A for one entry); it holds no V.
    assert not any(word in _held_by_coordinator(record) for word in _tag_sum(attack, record, true))
    arbitrary = true + np.frombuffer(secrets.token_bytes(8 * entries), dtype="<u8").astype(
        np.uint64
    )
    attack.coordinator.publish_forged(record, arbitrary)
    codes = attack.exits()
    _assert_every_node_refused(attack, codes, "secret checks")


class GarbageFrom(Script):
    """Honest, except that ``culprit`` signs garbage in place of its sealed ``kind`` for others.

    The test holds the culprit's identity key: from every other node's side
    this is a member that sealed and signed bytes that do not open.
    """

    def __init__(self, federation: Federation, culprit: str, kind: str) -> None:
        self.identity = federation.identity(culprit)
        self.culprit, self.kind = culprit, kind

    def _garbage(
        self, server: LyingCoordinator, record: RoundRecord, recipient: str, binding: bytes
    ) -> tuple[bytes, bytes]:
        size = 48 if self.kind == "contribution" else 80
        sealed = secrets.token_bytes(size)
        message = sealed_set_message(
            server.config_hash,
            server.session_id,
            record.index,
            kind=self.kind,
            binding=binding,
            sender=self.culprit,
            count=1,
            root=sealed_leaf(recipient, sealed),  # a tree of this one copy
        )
        return sealed, self.identity.sign(message)

    def contributions(
        self, server: LyingCoordinator, record: RoundRecord, caller: str, shown: Shown
    ) -> list[pb.SealedContribution]:
        relayed = super().contributions(server, record, caller, shown)
        if self.kind != "contribution" or record.index != 0:
            return relayed
        out = []
        for item in relayed:
            if item.sender_node_id != self.culprit:
                out.append(item)
                continue
            sealed, signature = self._garbage(server, record, caller, bytes(32))
            out.append(
                pb.SealedContribution(
                    sender_node_id=self.culprit,
                    recipient_node_id=caller,
                    sealed=sealed,
                    signature=signature,
                    leaf_count=1,
                )
            )
        return out

    def tags(
        self, server: LyingCoordinator, record: RoundRecord, caller: str, survivor_hash: bytes
    ) -> list[pb.SealedTags]:
        relayed = super().tags(server, record, caller, survivor_hash)
        if self.kind != "tags" or record.index != 0:
            return relayed
        out = []
        for item in relayed:
            if item.sender_node_id != self.culprit:
                out.append(item)
                continue
            sealed, signature = self._garbage(server, record, caller, survivor_hash)
            out.append(
                pb.SealedTags(
                    sender_node_id=self.culprit,
                    recipient_node_id=caller,
                    sealed=sealed,
                    signature=signature,
                    leaf_count=1,
                )
            )
        return out


@pytest.mark.parametrize("kind", ["tags", "contribution"])
def test_a_member_signing_garbage_is_named_and_the_rest_finish_without_it(
    tmp_path: Path, processes: Processes, kind: str
) -> None:
    federation = make_federation(tmp_path / "fed", FOUR)
    attack = Attack(federation, tmp_path / "run", processes, GarbageFrom(federation, "c", kind))
    attack.start()
    honest = ("a", "b", "d")
    codes = {n: attack.nodes[n].wait(60) for n in honest}
    server = attack.coordinator
    first, rerun = server.round(0), server.round(1)
    attack.end("the test is over")
    assert codes == dict.fromkeys(honest, 0), attack.describe()
    assert first is not None and rerun is not None
    # Named before any honest seed left: the first accusation ends round 0.
    assert set(first.answers) <= {"c"}
    assert first.refusals and set(first.refusals) <= set(honest)
    assert all("survivor 'c' is at fault" in why for why in first.refusals.values())
    assert "signed these bytes" in next(iter(first.refusals.values()))
    for node in honest:
        # Every honest node learns who was named and why (the accuser says so itself).
        assert "survivor 'c' is at fault" in attack.nodes[node].stderr(), attack.describe()
    # The rerun without c: fresh masks, and the exact sum of the others' contributions.
    assert rerun.participants == honest and rerun.aggregate is not None
    assert np.array_equal(rerun.aggregate, wrapping_sum([attack.audit(n, 1) for n in honest]))
    assert not np.array_equal(rerun.uploads["a"].words, first.uploads["a"].words)
