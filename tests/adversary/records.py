"""What the lying coordinator holds about a round, and the script of its lie.

:class:`RoundRecord` keeps everything nodes sent for one round — uploads,
attestations, unmask answers and refusals — and everything the coordinator
showed each node, so a test can reconstruct afterwards what a coordinator
could learn (tests/adversary/reconstruct.py). :class:`Script` holds the
choices of an honest coordinator; each attack overrides one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from numpy.typing import NDArray

from noise.layout import Layout
from noise.transcript import sealed_tree
from proto.zerosum.v1 import session_pb2 as pb

_S = TypeVar("_S", pb.SealedContribution, pb.SealedTags)

if TYPE_CHECKING:
    from tests.adversary.lying_server import LyingCoordinator

__all__ = [
    "FAILED",
    "OPEN",
    "READY",
    "UNMASK",
    "Answer",
    "RoundRecord",
    "Script",
    "Shown",
    "Upload",
]

U64 = NDArray[np.uint64]
OPEN, UNMASK, READY, FAILED = "open", "unmask", "ready", "failed"


@dataclass(frozen=True)
class Upload:
    """One node's upload of one round, as received: y_k = z_k + b_k."""

    node_id: str
    header: pb.UploadHeader
    words: U64


@dataclass(frozen=True)
class Answer:
    """One node's unmask answer: its self-mask seed and, if D ≠ ∅, its pair terms with D."""

    node_id: str
    header: pb.UnmaskHeader
    corrections: U64 | None

    @property
    def dropped(self) -> tuple[str, ...]:
        return tuple(self.header.dropped_node_ids)


@dataclass(frozen=True)
class Shown:
    """The survivor set, dropped set and survivor-set hash shown to one node."""

    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    survivor_hash: bytes


@dataclass
class RoundRecord:
    """Everything the server holds about one round."""

    index: int
    name: str
    participants: tuple[str, ...]
    layout: Layout
    opened_ms: int
    status: str = OPEN
    reason: str = ""
    uploads: dict[str, Upload] = field(default_factory=dict)
    # survivor hash -> node -> its attestation of that hash
    attestations: dict[bytes, dict[str, pb.SurvivorAttestation]] = field(default_factory=dict)
    answers: dict[str, Answer] = field(default_factory=dict)
    refusals: dict[str, str] = field(default_factory=dict)
    # Every (S, D) shown to each node, in order.
    shown: dict[str, list[Shown]] = field(default_factory=dict)
    # GetResult calls per node while the round awaited its unmask answers.
    polls: Counter[str] = field(default_factory=Counter)
    aggregate: U64 | None = None
    result: Shown | None = None
    # Nodes dropped from the session in this round after its unmask request
    # (a survivor named by another): the status reports them dropped here.
    excluded: tuple[str, ...] = ()

    def attested(self, node_id: str) -> set[bytes]:
        """The survivor hashes ``node_id`` attested in this round."""
        return {h for h, by in self.attestations.items() if node_id in by}


def relayed(copies: Sequence[_S], caller: str) -> list[_S]:
    """The copy a sender sealed for ``caller`` (if any), as the coordinator relays it: with
    its place and audit path in the sender's tree (what the one signature covers)."""
    mine = next((c for c in copies if c.recipient_node_id == caller), None)
    if mine is None:
        return []
    tree = sealed_tree({c.recipient_node_id: bytes(c.sealed) for c in copies})
    leaf, path = tree.proof(caller)
    out = type(mine)()
    out.CopyFrom(mine)
    out.leaf_index, out.leaf_count = leaf, tree.count
    out.path.extend(path)
    return [out]


class Script:
    """The choices of an honest coordinator; a test's lie overrides one of them."""

    def roster(self, server: LyingCoordinator, caller: str, roster: pb.Roster) -> pb.Roster:
        """The roster shown to ``caller`` (honest: the one built from the joins)."""
        return roster

    def shown(
        self, server: LyingCoordinator, record: RoundRecord, caller: str
    ) -> tuple[Sequence[str], Sequence[str]]:
        """(S, D) shown to ``caller`` in the round's unmask step (honest: all survived)."""
        return record.participants, ()

    def attestations(
        self, server: LyingCoordinator, record: RoundRecord, caller: str, shown: Shown
    ) -> list[pb.SurvivorAttestation]:
        """The attestations relayed to ``caller`` (honest: every one of its survivor hash)."""
        by_node = record.attestations.get(shown.survivor_hash, {})
        return [by_node[n] for n in sorted(by_node)]

    def answered(self, server: LyingCoordinator, record: RoundRecord, answer: Answer) -> None:
        """Called as ``answer`` arrives, before its node gets the receipt (honest: nothing)."""

    def publish(
        self, server: LyingCoordinator, record: RoundRecord, view: Shown, *, unanimous: bool
    ) -> bool:
        """Whether to publish ``view``, whose every survivor answered it (honest: if unanimous).

        ``unanimous``: every participant was shown ``view``.
        """
        return unanimous

    def contributions(
        self, server: LyingCoordinator, record: RoundRecord, caller: str, shown: Shown
    ) -> list[pb.SealedContribution]:
        """The sealed contributions relayed to ``caller`` (honest: those sealed for it)."""
        return [
            copy
            for node in shown.survivors
            if node != caller and node in record.uploads
            for copy in relayed(record.uploads[node].header.challenge, caller)
        ]

    def tags(
        self, server: LyingCoordinator, record: RoundRecord, caller: str, survivor_hash: bytes
    ) -> list[pb.SealedTags]:
        """The sealed tags relayed to ``caller``, with the request and the result.

        Honest: those every other survivor that attested ``survivor_hash`` sealed for it.
        """
        by_node = record.attestations.get(survivor_hash, {})
        return [
            copy
            for node in sorted(by_node)
            if node != caller
            for copy in relayed(by_node[node].sealed_tags, caller)
        ]

    def refused(
        self, server: LyingCoordinator, record: RoundRecord, refusal: pb.UnmaskRefusal
    ) -> None:
        """A refusal arrived (honest: one naming a survivor reruns the round without it)."""
        accused = refusal.accused_node_id
        if accused and accused in record.participants and record.status == UNMASK:
            rest = tuple(n for n in record.participants if n != accused)
            server.supersede(
                record,
                f"survivor {accused!r} was named by {refusal.node_id!r}: {refusal.reason}",
                participants=rest,
            )
