"""What this node has done in the session so far, as one object the round steps share.

* ``done`` — round indices taken in (aggregated, or superseded by a rerun);
* ``cape`` / ``cape_sent`` — the CAPE material of each model round, and the
  model rounds of which a CAPE-sum share was sent before a restart;
* ``survivor_sets`` — the one survivor set this node signed per round index
  (``node.records.survivor_sets``, kept in STATE across restarts; opened on first use);
* ``attested`` / ``answered`` — survivor-set hashes this process has signed
  (or said it signed before a restart), and those it sent unmask answers for;
* ``revealed`` — per round index, every node whose pair terms (or pads) this
  node's answers revealed and every survivor it answered for
  (``node.protocol.unmask.RevealedTerms``), restored from the ledger after a restart;
* ``unsent`` — the round in progress whose upload has not been made (what a
  deliberate stop withdraws from).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from node.protocol.unmask import RevealedTerms
from node.records.ledger import PrivacyLedger
from node.records.survivor_sets import SurvivorSets
from node.session.cape_material import CapeState

__all__ = ["RoundProgress"]


@dataclass
class RoundProgress:
    """This node's progress through the rounds of one session (see the module docstring)."""

    done: set[int] = field(default_factory=set)
    cape: dict[str, CapeState] = field(default_factory=dict)
    cape_sent: set[str] = field(default_factory=set)
    survivor_sets: SurvivorSets | None = None
    attested: set[bytes] = field(default_factory=set)
    answered: set[bytes] = field(default_factory=set)
    # The challenge vectors ρ of the round last answered (index, ρ), kept in memory
    # so that checking its aggregate need not expand them again.
    challenge: tuple[int, NDArray[np.uint64]] | None = None
    revealed: dict[int, RevealedTerms] = field(default_factory=dict)
    unsent: int | None = None

    @classmethod
    def from_ledger(cls, ledger: PrivacyLedger, session_id: str) -> RoundProgress:
        """A fresh start, bound by the unmask answers the ledger records for ``session_id``.

        The ledger records each answer before it leaves, also those of a
        process that crashed: they bind a restarted node as they bound that
        one, so it never answers what the uninterrupted node would refuse.
        The survivor sets it signed are read from STATE on first use
        (``node.records.survivor_sets``): one per round index, whatever happens.
        """
        revealed = {
            index: RevealedTerms(set(dropped), set(survivors))
            for index, (dropped, survivors) in ledger.revealed(session_id).items()
        }
        return cls(revealed=revealed)
