"""Privacy-ledger entries written in one line: the round as (session, index, name), then the facts.

:meth:`PrivacyLedger.record_release` and its siblings take keyword arguments
only; the tests that fill a ledger before reading it back write many of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from node.records.ledger import PrivacyLedger

# (session_id, round_index, round_name)
Round = tuple[str, int, str]


def _of(at: Round) -> dict[str, Any]:
    session_id, round_index, round_name = at
    return {"session_id": session_id, "round_index": round_index, "round_name": round_name}


def release(
    ledger: PrivacyLedger,
    at: Round,
    mu: Mapping[str, float],
    manifest: str,
    payload: str,
    **more: Any,
) -> None:
    """A release of round ``at`` with its manifest and payload digests (more: tensors, noise)."""
    ledger.record_release(
        **_of(at), mu=mu, manifest_sha256=manifest, payload_sha256=payload, **more
    )


def unmask(
    ledger: PrivacyLedger,
    at: Round,
    dropped: Sequence[str],
    survivors: Sequence[str],
    mu: Mapping[str, float],
) -> None:
    """The answer to an unmask request of round ``at``, raising its costs to ``mu``."""
    ledger.record_unmask(**_of(at), dropped=dropped, survivors=survivors, mu=mu)


def refusal(
    ledger: PrivacyLedger, at: Round, dropped: Sequence[str], survivors: Sequence[str], reason: str
) -> None:
    """The node's refusal of an unmask request of round ``at``, and why."""
    ledger.record_refusal(**_of(at), dropped=dropped, survivors=survivors, reason=reason)
