"""The rows of the state file as frozen dataclasses, and how their columns are encoded.

One dataclass per table; a store query returns them and a store write takes
them, so nothing outside coordinator/store/ sees SQL tuples. Node-id lists are
stored as sorted compact JSON arrays, layouts as the compact JSON of
:meth:`noise.layout.Layout.to_json`; both encodings are part of the on-disk
format and must not change within a schema version.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from noise.layout import Layout

__all__ = [
    "ROUND_STATUSES",
    "SESSION_STATES",
    "AttestationRow",
    "CorrectionRow",
    "MemberRow",
    "RefusalRow",
    "ResultRow",
    "RoundRow",
    "SessionRow",
    "UnmaskRow",
    "UploadRow",
    "ids_from_json",
    "ids_json",
    "layout_from_json",
    "layout_json",
]

# The values the schema's CHECK constraints allow (coordinator/store/schema.py).
SESSION_STATES = ("joining", "running", "completed", "failed")
ROUND_STATUSES = ("open", "unmask", "ready", "failed", "superseded")


@dataclass(frozen=True)
class SessionRow:
    """The one session this state file belongs to."""

    session_id: str
    config_hash: bytes
    federation_id: str
    state: str  # joining | running | completed | failed
    current_round: int | None
    reason: str
    created_ms: int
    join_deadline_ms: int
    roster_final: bool
    roster_version: int
    ended_ms: int | None


@dataclass(frozen=True)
class MemberRow:
    """A joined node: its signed ephemeral key and whether it is still live."""

    node_id: str
    public_key: bytes
    signature: bytes
    joined_ms: int
    status: str  # live | dropped
    dropped_round: int | None
    dropped_reason: str


@dataclass(frozen=True)
class RoundRow:
    """One round: ``participants`` are the live nodes when it opened."""

    round_index: int
    name: str
    status: str  # open | unmask | ready | failed | superseded
    participants: tuple[str, ...]
    opened_ms: int
    deadline_ms: int
    layout: Layout | None
    fixed_point_bits: int | None
    unmask_attempt: int
    reason: str


@dataclass(frozen=True)
class UploadRow:
    """A node's stored payload for a round and its signed upload statement.

    The statement's other fields are the round's name, the session's final
    roster hash and ``digest``, so only the signature needs storing.
    """

    round_index: int
    node_id: str
    digest: bytes
    size: int
    path: str
    layout: Layout
    fixed_point_bits: int
    received_ms: int
    statement_signature: bytes
    self_mask_commitment: bytes
    # (recipient, sealed, the node's signature) of every challenge contribution it sealed.
    challenge: tuple[tuple[str, bytes, bytes], ...] = ()


@dataclass(frozen=True)
class ResultRow:
    """The published aggregate of a round and the survivor set it covers."""

    round_index: int
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    digest: bytes
    size: int
    path: str
    computed_ms: int


@dataclass(frozen=True)
class UnmaskRow:
    """One attempt at unmasking a round: survivors S, dropped D and the hash binding them."""

    round_index: int
    attempt: int
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    survivor_hash: bytes
    opened_ms: int
    deadline_ms: int


@dataclass(frozen=True)
class AttestationRow:
    """A survivor's signature over the survivor set of an unmask attempt."""

    round_index: int
    attempt: int
    node_id: str
    signature: bytes
    received_ms: int
    # (recipient, sealed, the node's signature) of its aggregate-check tags for each other survivor.
    tags: tuple[tuple[str, bytes, bytes], ...] = ()


@dataclass(frozen=True)
class CorrectionRow:
    """A survivor's unmask answer: its self-mask seed and, after a dropout, its pair terms.

    ``path`` is None (``digest`` empty, ``size`` 0) when nobody dropped and the
    answer is the seed alone.
    """

    round_index: int
    attempt: int
    node_id: str
    digest: bytes
    size: int
    path: str | None
    received_ms: int
    self_mask_seed: bytes


@dataclass(frozen=True)
class RefusalRow:
    """A survivor's refusal to unmask, with its reason."""

    round_index: int
    attempt: int
    node_id: str
    reason: str
    received_ms: int


def ids_from_json(text: str) -> tuple[str, ...]:
    """A stored node-id list."""
    return tuple(str(x) for x in json.loads(text))


def ids_json(ids: Sequence[str]) -> str:
    """How a node-id list is stored: sorted, compact JSON."""
    return json.dumps(sorted(ids), separators=(",", ":"))


def layout_from_json(text: str) -> Layout:
    """A stored layout."""
    return Layout.from_json(json.loads(text))


def layout_json(layout: Layout) -> str:
    """How a layout is stored: compact JSON."""
    return json.dumps(layout.to_json(), separators=(",", ":"))
