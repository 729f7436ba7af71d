"""A scripted coordinator for node tests: it answers what a test sets, and keeps what it is sent.

:class:`FakeCoordinator` satisfies ``node.protocol.gateway.CoordinatorGateway``. A test
sets the session status the node sees (``status_reply``), the result of each
round (``results``; asking for another fails the test), the other nodes'
signed keys for the roster (``peers``) and, where the coordinator is to
refuse or be unreachable, the error a join or a refusal raises
(``join_error``, ``refuse_error``).
Everything the node tells the coordinator is kept in order in ``sent`` —
``("attest", round)``, ``("answer", round, dropped)``, ``("refuse", round,
reason)``, ``("upload", round)``, ``("withdraw", round, reason)`` — and in
full in ``attestations``, ``answers``, ``refusals``, ``uploads`` and
``withdrawals``; the keys it joins with in ``joined``. ``calls`` names every
method called, questions included. :meth:`FakeCoordinator.factory` hands it
to a ``NodeRunner`` (its ``gateway=`` parameter).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from node.errors import GatewayError
from node.runner import GatewayFactory
from node.session.context import NodeOptions
from node.session.setup import LocalSetup
from noise.keys import KeyBundle
from noise.layout import Layout, payload_digest
from noise.transcript import roster_hash
from proto.messages import (
    Attestation,
    JoinReceipt,
    RosterView,
    RoundResult,
    RoundSummary,
    Sealed,
    SessionState,
    SessionStatus,
    UnmaskHeader,
    UnmaskRefusal,
    UploadHeader,
    UploadReceipt,
    WithdrawReceipt,
)

__all__ = ["FakeCoordinator", "UnmaskAnswer", "Upload", "running"]

U64 = NDArray[np.uint64]


@dataclass(frozen=True)
class Upload:
    """One upload as the coordinator received it."""

    session_id: str
    round_index: int
    round_name: str
    payload: U64
    layout: Layout
    fixed_point_bits: int
    roster_hash: bytes
    statement_signature: bytes


@dataclass(frozen=True)
class UnmaskAnswer:
    """One unmask answer: its header and the corrections sent."""

    header: UnmaskHeader
    payload: bytes  # the corrections, as uint64 bytes (empty when nobody dropped)

    @property
    def self_mask_seed(self) -> bytes:
        return self.header.self_mask_seed


@dataclass
class FakeCoordinator:
    """A coordinator that answers from what the test set and records what it is sent."""

    node: str
    status_reply: SessionStatus
    results: dict[int, RoundResult] = field(default_factory=dict)
    peers: Sequence[KeyBundle] = ()  # the other nodes' bundles on the roster, all final
    uploaded: dict[int, bytes] = field(default_factory=dict)  # digests of this node's uploads
    join_error: GatewayError | None = None
    refuse_error: GatewayError | None = None
    joined_count: int = 1

    sent: list[tuple[object, ...]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    joined: list[KeyBundle] = field(default_factory=list)
    attestations: list[tuple[int, Attestation]] = field(default_factory=list)
    # The sealed aggregate-check tags sent with each attestation.
    sealed_tags: list[tuple[int, tuple[Sealed, ...]]] = field(default_factory=list)
    answers: list[UnmaskAnswer] = field(default_factory=list)
    refusals: list[tuple[UnmaskRefusal, str]] = field(default_factory=list)
    accused: list[str] = field(default_factory=list)  # per refusal: the survivor it names
    uploads: list[Upload] = field(default_factory=list)
    withdrawals: list[tuple[int, str]] = field(default_factory=list)
    closed: bool = False

    @property
    def node_id(self) -> str:
        return self.node

    def factory(self) -> GatewayFactory:
        """A gateway factory for ``NodeRunner(..., gateway=...)`` that hands it this coordinator."""

        def make(
            setup: LocalSetup, options: NodeOptions, say: Callable[[str], None]
        ) -> FakeCoordinator:
            return self

        return make

    def sent_answers(self) -> list[tuple[object, ...]]:
        """The unmask answers among ``sent``: ``("answer", round, dropped)``."""
        return [s for s in self.sent if s[0] == "answer"]

    # ------------------------------------------------------------ questions

    def status(self, session_id: str = "") -> SessionStatus:
        self.calls.append("status")
        return self.status_reply

    def roster(self, session_id: str) -> RosterView:
        """The final roster: the key this node joined with last, and ``peers``."""
        self.calls.append("roster")
        mine = self.joined[-1]
        bundles = (mine, *self.peers)
        return RosterView(
            session_id=session_id,
            config_hash=mine.config_hash,
            bundles=bundles,
            roster_hash=roster_hash(mine.config_hash, session_id, bundles),
            final=True,
            excluded=(),
        )

    def result(self, session_id: str, round_index: int) -> RoundResult:
        """The result the test set for the round; asking for another fails the test at once.

        (A node would poll an open round forever: failing here turns a node
        that goes further than the test expects into a failure, not a hang.)
        """
        self.calls.append("result")
        found = self.results.get(round_index)
        if found is None:
            raise AssertionError(f"the node asked for round {round_index}'s result; none was set")
        return found

    def uploaded_digest(self, session_id: str, round_index: int) -> bytes | None:
        self.calls.append("uploaded_digest")
        return self.uploaded.get(round_index)

    # ------------------------------------------------------------ what the node sends

    def join(self, bundle: KeyBundle) -> JoinReceipt:
        self.calls.append("join")
        if self.join_error is not None:
            raise self.join_error
        rejoined = any(
            (b.public_key, b.signature) == (bundle.public_key, bundle.signature)
            for b in self.joined
        )
        self.joined.append(bundle)
        return JoinReceipt(
            rejoined=rejoined,
            joined_count=self.joined_count,
            federation_size=1 + len(self.peers),
        )

    def upload(self, header: UploadHeader, payload: U64) -> UploadReceipt:
        self.calls.append("upload")
        digest = payload_digest(payload)
        assert header.payload.digest == digest, "the digest given is not the payload's"
        assert header.node_id == self.node, "an upload header for another node"
        index = header.round_index
        duplicate = self.uploaded.get(index) == digest
        self.sent.append(("upload", index))
        self.uploads.append(
            Upload(
                header.session_id,
                index,
                header.round_name,
                np.array(payload, dtype=np.uint64),
                Layout(header.payload.tensors),
                header.payload.fixed_point_bits,
                header.roster_hash,
                header.statement_signature,
            )
        )
        self.uploaded[index] = digest
        return UploadReceipt(
            duplicate=duplicate,
            submitted_count=1,
            expected_count=1 + len(self.peers),
            digest=digest,
            received_bytes=int(np.asarray(payload).nbytes),
        )

    def attest(self, attestation: Attestation) -> None:
        self.calls.append("attest")
        self.sent.append(("attest", attestation.round_index))
        self.attestations.append(
            (
                attestation.round_index,
                Attestation(self.node, attestation.survivor_hash, attestation.signature),
            )
        )
        self.sealed_tags.append((attestation.round_index, attestation.tags))

    def submit_unmask(self, header: UnmaskHeader, payload: U64 | None) -> None:
        self.calls.append("submit_unmask")
        self.sent.append(("answer", header.round_index, tuple(header.dropped)))
        self.answers.append(
            UnmaskAnswer(
                header,
                b"" if payload is None else np.asarray(payload, dtype=np.uint64).tobytes(),
            )
        )

    def refuse_unmask(self, refusal: UnmaskRefusal) -> None:
        self.calls.append("refuse_unmask")
        if self.refuse_error is not None:
            raise self.refuse_error
        self.sent.append(("refuse", refusal.round_index, refusal.reason))
        self.refusals.append((refusal, refusal.reason))
        self.accused.append(refusal.accused)

    def withdraw(self, session_id: str, round_index: int, reason: str) -> WithdrawReceipt:
        self.calls.append("withdraw")
        self.sent.append(("withdraw", round_index, reason))
        self.withdrawals.append((round_index, reason))
        return WithdrawReceipt(dropped=(self.node,))

    def close(self) -> None:
        self.calls.append("close")
        self.closed = True


def running(session_id: str, *rounds: RoundSummary, config_hash: bytes = b"") -> SessionStatus:
    """A running session's status with ``rounds`` opened so far (the last is the current one)."""
    return SessionStatus(
        session_id=session_id,
        state=SessionState.RUNNING,
        config_hash=config_hash,
        reason="",
        rounds=rounds,
    )
