"""The events that change a session's state or a round's status, as plain data.

A step (coordinator/steps/) decides which event happened and phrases why;
the table of coordinator/transitions.py says what each event does to the
state it arrives in. An event is a frozen dataclass carrying what its handler
needs to write, and a class-level ``sentence`` naming it for people: refusals
and the printed table use it.

Session events change the session row (joining, running, completed, failed);
round events change the current round (open, unmask, ready, failed,
superseded), and may end or continue the session through a session event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "ROUND_EVENTS",
    "SESSION_EVENTS",
    "AttestationsComplete",
    "CapeModelDropout",
    "CorrectionsComplete",
    "EveryoneJoined",
    "FinalRoundReady",
    "JoinDeadlinePassed",
    "JoinResumed",
    "MemberNamed",
    "NextRound",
    "NobodyAwaited",
    "NodeWithdrew",
    "ResultFile",
    "RoundDeadlinePassed",
    "RoundEvent",
    "RoundFailed",
    "RoundResumed",
    "SessionEvent",
    "TooFewAnswered",
    "TooFewJoined",
    "TooFewUploaded",
    "UnmaskRefused",
    "UnmaskStalled",
    "UploadsComplete",
    "WithdrawalLeftTooFew",
]


@dataclass(frozen=True)
class ResultFile:
    """A round's aggregate, already placed in the payload directory under ``name``."""

    name: str
    digest: bytes


@dataclass(frozen=True)
class SessionEvent:
    """Something that changes the session row."""

    sentence: ClassVar[str]


@dataclass(frozen=True)
class RoundEvent:
    """Something that changes the current round."""

    sentence: ClassVar[str]


# ---------------------------------------------------------------- session events


@dataclass(frozen=True)
class EveryoneJoined(SessionEvent):
    """Every federation node has joined: the roster is final and round 0 opens."""

    sentence = "every federation node joined"


@dataclass(frozen=True)
class JoinDeadlinePassed(SessionEvent):
    """The join deadline passed with at least ``min_nodes`` joined: round 0 opens."""

    sentence = "the join deadline passed with enough nodes joined"


@dataclass(frozen=True)
class TooFewJoined(SessionEvent):
    """The join deadline passed with fewer than ``min_nodes`` joined."""

    sentence = "the join deadline passed with too few nodes joined"
    reason: str


@dataclass(frozen=True)
class JoinResumed(SessionEvent):
    """The coordinator restarted during the join phase; its downtime does not count."""

    sentence = "the coordinator restarted during the join phase"


@dataclass(frozen=True)
class NextRound(SessionEvent):
    """The current round ended and the plan goes on with round ``round_index``."""

    sentence = "a round ended and the plan goes on"
    round_index: int
    name: str
    participants: tuple[str, ...]


@dataclass(frozen=True)
class FinalRoundReady(SessionEvent):
    """The last round of the plan is ready."""

    sentence = "the final round is ready"
    round_index: int


@dataclass(frozen=True)
class RoundFailed(SessionEvent):
    """The current round failed, and with it the session."""

    sentence = "the current round failed"
    reason: str


# ---------------------------------------------------------------- round events


@dataclass(frozen=True)
class UploadsComplete(RoundEvent):
    """The last participant's upload is in: everyone is asked to unmask (reveal self-masks)."""

    sentence = "an upload completed the round"
    survivors: tuple[str, ...]

    @property
    def dropped(self) -> tuple[str, ...]:
        """Nobody: every participant uploaded."""
        return ()


@dataclass(frozen=True)
class RoundDeadlinePassed(RoundEvent):
    """The round deadline passed with enough survivors: they are asked to unmask."""

    sentence = "the round deadline passed with enough survivors"
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]


@dataclass(frozen=True)
class NobodyAwaited(RoundEvent):
    """Every participant without an upload withdrew: the survivors are asked to unmask."""

    sentence = "a withdrawal left nobody awaited"
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]


@dataclass(frozen=True)
class TooFewUploaded(RoundEvent):
    """The round closed with fewer than ``min_nodes`` uploads."""

    sentence = "the round closed with too few survivors"
    reason: str


@dataclass(frozen=True)
class CapeModelDropout(RoundEvent):
    """Nodes dropped from a CAPE model round: its CAPE sum and the round are rerun."""

    sentence = "the round closed after nodes dropped from a CAPE model round"
    survivors: tuple[str, ...]
    rerun: str
    reason: str


@dataclass(frozen=True)
class NodeWithdrew(RoundEvent):
    """A participant withdrew and enough remain; ``notes`` names every withdrawal so far."""

    sentence = "a participant withdrew"
    notes: str


@dataclass(frozen=True)
class WithdrawalLeftTooFew(RoundEvent):
    """A withdrawal left fewer than ``min_nodes`` participants."""

    sentence = "a withdrawal left too few participants"
    reason: str


@dataclass(frozen=True)
class AttestationsComplete(RoundEvent):
    """Every survivor has attested the survivor set: corrections may now be sent."""

    sentence = "every survivor attested the survivor set"


@dataclass(frozen=True)
class CorrectionsComplete(RoundEvent):
    """The last survivor's correction completed the unmask; ``result`` is the exact sum."""

    sentence = "a correction completed the unmask"
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    result: ResultFile


@dataclass(frozen=True)
class UnmaskStalled(RoundEvent):
    """Survivors were silent at the unmask deadline; the round is rerun among those that spoke.

    One unmask request per round index, ever: a survivor set, once signed, is
    never changed, so the rerun is a new round (``rerun`` names it, under the
    next index, with fresh keys) among ``survivors``.
    """

    sentence = "the unmask deadline passed with enough survivors"
    survivors: tuple[str, ...]
    rerun: str
    reason: str


@dataclass(frozen=True)
class MemberNamed(RoundEvent):
    """A survivor named another whose signed sealed message does not open for it.

    The named survivor is dropped and the round rerun without it (``rerun``,
    under the next index, with fresh keys) among ``survivors``; nothing of this
    index is completed, so no seed that was sent helps anyone.
    """

    sentence = "a survivor named another as the cause of its refusal"
    survivors: tuple[str, ...]
    rerun: str
    reason: str


@dataclass(frozen=True)
class TooFewAnswered(RoundEvent):
    """The unmask deadline passed with fewer than ``min_nodes`` survivors answering."""

    sentence = "the unmask deadline passed with too few survivors"
    reason: str


@dataclass(frozen=True)
class UnmaskRefused(RoundEvent):
    """A survivor refused to unmask; nothing can finish the round without its noise."""

    sentence = "a survivor refused to unmask"
    reason: str


@dataclass(frozen=True)
class RoundResumed(RoundEvent):
    """The coordinator restarted during the round; its downtime does not count."""

    sentence = "the coordinator restarted during the round"


SESSION_EVENTS: tuple[type[SessionEvent], ...] = (
    EveryoneJoined,
    JoinDeadlinePassed,
    TooFewJoined,
    JoinResumed,
    NextRound,
    FinalRoundReady,
    RoundFailed,
)
ROUND_EVENTS: tuple[type[RoundEvent], ...] = (
    UploadsComplete,
    RoundDeadlinePassed,
    NobodyAwaited,
    TooFewUploaded,
    CapeModelDropout,
    NodeWithdrew,
    WithdrawalLeftTooFew,
    AttestationsComplete,
    CorrectionsComplete,
    UnmaskStalled,
    MemberNamed,
    TooFewAnswered,
    UnmaskRefused,
    RoundResumed,
)
