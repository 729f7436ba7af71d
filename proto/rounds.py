"""Which round a round name refers to: a model round of the plan, or the CAPE secure sum before one.

On the wire and in every state file a round is its name: a model round is
named as the plan names it (``"sums"``), and under the CAPE construction
(docs/design.md §6.1) each model round is preceded by a secure-sum round
named ``"cape-sum/<model round>"``. Both ends parse that name here, once,
into a :class:`RoundRef` (its kind and its model round) instead of testing
and stripping the prefix where they need to know.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["CAPE_SUM_PREFIX", "RoundKind", "RoundRef"]

#: The prefix of a CAPE secure-sum round's name; the rest is its model round's name.
CAPE_SUM_PREFIX = "cape-sum/"


class RoundKind(enum.Enum):
    """What a round computes."""

    MODEL = "model"  # the plan's tensors, noised and masked
    CAPE_SUM = "cape-sum"  # the CAPE secure sum of the draws for the model round after it


@dataclass(frozen=True)
class RoundRef:
    """A round's kind and the plan's model round it belongs to."""

    kind: RoundKind
    model_round: str

    @classmethod
    def parse(cls, name: str) -> RoundRef:
        """The round named ``name`` (a CAPE sum if it carries the prefix, else a model round)."""
        if name.startswith(CAPE_SUM_PREFIX):
            return cls(RoundKind.CAPE_SUM, name.removeprefix(CAPE_SUM_PREFIX))
        return cls(RoundKind.MODEL, name)

    @classmethod
    def cape_sum(cls, model_round: str) -> RoundRef:
        """The CAPE secure sum that precedes ``model_round``."""
        return cls(RoundKind.CAPE_SUM, model_round)

    @property
    def is_cape_sum(self) -> bool:
        return self.kind is RoundKind.CAPE_SUM

    @property
    def name(self) -> str:
        """The round's name, as it travels and is stored."""
        if self.kind is RoundKind.CAPE_SUM:
            return CAPE_SUM_PREFIX + self.model_round
        return self.model_round

    def __str__(self) -> str:
        return self.name
