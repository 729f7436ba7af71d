"""The survivor set this node signed for each round index: one, ever, kept across restarts.

In a round's unmask step every survivor signs the survivor set S (and
dropped set D) it was shown, and reveals its self-mask seed — and, if D is
not empty, its pair terms with D — only once every member of S has signed
the same set. That stops a coordinator from showing an uploaded node as
survived to that node (which then reveals its self-mask seed) and as dropped
to the others (who then reveal their pair terms with it): with both, the
node's upload would be stripped of its noise. The protection holds only if
no honest node ever signs two sets for one round index, so this node keeps
the set it signed in ``STATE/survivor-sets.json`` (written atomically *before*
the signature leaves) and refuses any other set for that index, also after a
restart (the consistency round of Bonawitz et al. 2017, ACM CCS §4, where
each user signs once).

The record lives in the node's state folder, ``STATE/survivor-sets.json``
(format ``zerosum-survivor-sets`` version 2: per session id, per round
index, the set signed and, once the answer is sent, the round's challenge
key κ), beside the ledger and ``sessions.json``, not in ``OUT``: an ``OUT``
folder restored from a backup taken before the signature still holds the
saved session key, so a node resuming from it would otherwise sign a second
set for the same index. A record version 1 kept in ``OUT`` (one session) is
read as well and its sets taken into STATE; two different sets for one
index in the two records stop the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bounded.files import LocalFileError, read_limited_text
from bounded.nesting import parse_json
from node.errors import SessionStateError
from node.records.atomic import atomic_write_json

# One signed survivor set (node ids, a hash, κ) per round of every session.
_RECORD_BYTES = 64 << 20

__all__ = ["SURVIVOR_SETS", "SignedSet", "SurvivorSets"]

SURVIVOR_SETS = "survivor-sets.json"
_FORMAT = "zerosum-survivor-sets"
_VERSION = 2


@dataclass(frozen=True)
class SignedSet:
    """The survivor set signed for one round index (and, once attested, its challenge key).

    ``own_tags``: this node's blinded aggregate-check tags for the set, which
    the aggregate's check adds to those the others sealed for it.
    """

    survivor_hash: bytes
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    challenge_key: bytes | None = None
    own_tags: tuple[int, ...] | None = None

    def same_set(self, other: SignedSet) -> bool:
        return (self.survivor_hash, self.survivors, self.dropped) == (
            other.survivor_hash,
            other.survivors,
            other.dropped,
        )


def _entry_from_json(entry: Any) -> SignedSet:
    return SignedSet(
        bytes.fromhex(entry["survivor_hash"]),
        tuple(str(n) for n in entry["survivors"]),
        tuple(str(n) for n in entry["dropped"]),
        None if entry.get("challenge_key") is None else bytes.fromhex(entry["challenge_key"]),
        None if entry.get("own_tags") is None else tuple(int(t, 16) for t in entry["own_tags"]),
    )


def _entry_to_json(entry: SignedSet) -> dict[str, Any]:
    return {
        "survivor_hash": entry.survivor_hash.hex(),
        "survivors": list(entry.survivors),
        "dropped": list(entry.dropped),
        "challenge_key": None if entry.challenge_key is None else entry.challenge_key.hex(),
        "own_tags": None if entry.own_tags is None else [format(t, "x") for t in entry.own_tags],
    }


def _read(path: Path) -> Any:
    try:
        text = read_limited_text(path, _RECORD_BYTES, what="survivor-set record")
    except FileNotFoundError:
        return None
    except LocalFileError as error:
        raise SessionStateError(str(error)) from None
    try:
        return parse_json(text, what=f"survivor-set record {path}")
    except ValueError as error:
        raise _damaged(path, error) from None


def _damaged(path: Path, error: object) -> SessionStateError:
    return SessionStateError(
        f"{path} is damaged ({error}); it records which survivor sets this node "
        "signed, so the node cannot safely answer unmask requests without it: restore it"
    )


def _rounds(document: Any, path: Path) -> dict[int, SignedSet]:
    try:
        return {int(index): _entry_from_json(e) for index, e in document["rounds"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise _damaged(path, error) from None


class SurvivorSets:
    """The record of the survivor sets this node signed, in ``STATE`` (module docstring).

    ``state`` is the node's state folder; ``legacy_out``, if given, the OUT
    folder whose version-1 record (of ``session_id``) is taken in.
    """

    def __init__(self, state: Path, session_id: str, *, legacy_out: Path | None = None) -> None:
        self.path = Path(state) / SURVIVOR_SETS
        self.session_id = session_id
        self._others: dict[str, Any] = {}
        self._signed = self._load()
        if legacy_out is not None:
            self._take_legacy(Path(legacy_out) / SURVIVOR_SETS)

    def _load(self) -> dict[int, SignedSet]:
        document = _read(self.path)
        if document is None:
            return {}
        if not isinstance(document, dict) or document.get("format") != _FORMAT:
            raise _damaged(self.path, f"it is not a {_FORMAT} file")
        if document.get("version") != _VERSION:
            raise _damaged(self.path, f"version {document.get('version')!r}, not {_VERSION}")
        sessions = document.get("sessions")
        if not isinstance(sessions, dict):
            raise _damaged(self.path, "'sessions' must be an object")
        self._others = {k: v for k, v in sessions.items() if k != self.session_id}
        mine = sessions.get(self.session_id)
        return {} if mine is None else _rounds(mine, self.path)

    def _take_legacy(self, legacy: Path) -> None:
        document = _read(legacy)
        if document is None:
            return
        if not isinstance(document, dict) or document.get("format") != _FORMAT:
            raise _damaged(legacy, f"it is not a {_FORMAT} file")
        if document.get("session_id") != self.session_id:
            return  # another session's record: it binds nothing here
        merged = dict(self._signed)
        for index, entry in _rounds(document, legacy).items():
            kept = merged.get(index)
            if kept is not None and not kept.same_set(entry):
                raise SessionStateError(
                    f"{self.path} and {legacy} record different survivor sets signed for round "
                    f"{index} of session {self.session_id}; a node signs one set per round, so "
                    "one of these files is not this node's own record: the node does not answer "
                    "unmask requests until that is resolved"
                )
            if kept is None or (kept.challenge_key is None and entry.challenge_key is not None):
                merged[index] = entry
        if merged != self._signed:
            self._write(merged)

    def signed(self, round_index: int) -> SignedSet | None:
        """The set signed for ``round_index``, or None."""
        return self._signed.get(round_index)

    def sign(self, round_index: int, signed: SignedSet) -> None:
        """Record ``signed`` for ``round_index`` (before the signature is sent).

        Raises ValueError if another set was signed for that index already.
        """
        earlier = self._signed.get(round_index)
        if earlier is not None and not earlier.same_set(signed):
            raise ValueError(f"round {round_index} has a signed survivor set already")
        if earlier is not None:
            return
        self._write({**self._signed, round_index: signed})

    def note_challenge(self, round_index: int, key: bytes, own_tags: tuple[int, ...]) -> None:
        """Keep the round's challenge key κ and this node's blinded tags (before they leave).

        The aggregate is checked against them once published, also after a restart.
        """
        earlier = self._signed[round_index]
        if earlier.challenge_key == key and earlier.own_tags == tuple(own_tags):
            return
        updated = SignedSet(
            earlier.survivor_hash, earlier.survivors, earlier.dropped, key, tuple(own_tags)
        )
        self._write({**self._signed, round_index: updated})

    def _write(self, rounds: dict[int, SignedSet]) -> None:
        mine = {"rounds": {str(index): _entry_to_json(e) for index, e in sorted(rounds.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_json(
            self.path,
            {
                "format": _FORMAT,
                "version": _VERSION,
                "sessions": {**self._others, self.session_id: mine},
            },
        )
        self._signed = rounds
