"""The survivor set this node signed for each round index: one, ever, kept across restarts.

In a round's unmask step every survivor signs the survivor set S (and
dropped set D) it was shown, and reveals its self-mask seed — and, if D is
not empty, its pair terms with D — only once every member of S has signed
the same set. That stops a coordinator from showing an uploaded node as
survived to that node (which then reveals its self-mask seed) and as dropped
to the others (who then reveal their pair terms with it): with both, the
node's upload would be stripped of its noise. The protection holds only if
no honest node ever signs two sets for one round index, so this node keeps
the set it signed in ``OUT/survivor-sets.json`` (written atomically *before*
the signature leaves) and refuses any other set for that index, also after a
restart (the consistency round of Bonawitz et al. 2017, ACM CCS §4, where
each user signs once).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from node.atomic import atomic_write_json
from node.errors import SessionStateError
from proto.files import LocalFileError, read_limited_text
from proto.nesting import parse_json

# One signed survivor set (node ids and a signature) per round.
_RECORD_BYTES = 16 << 20

__all__ = ["SURVIVOR_SETS", "SignedSet", "SurvivorSets"]

SURVIVOR_SETS = "survivor-sets.json"
_FORMAT = "zerosum-survivor-sets"


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


class SurvivorSets:
    """The record of signed survivor sets of one session in ``OUT``."""

    def __init__(self, out: Path, session_id: str) -> None:
        self.path = Path(out) / SURVIVOR_SETS
        self.session_id = session_id
        self._signed = self._load()

    def _load(self) -> dict[int, SignedSet]:
        try:
            text = read_limited_text(self.path, _RECORD_BYTES, what="survivor-set record")
        except FileNotFoundError:
            return {}
        except LocalFileError as error:
            raise SessionStateError(str(error)) from None
        try:
            document = parse_json(text, what=f"survivor-set record {self.path}")
            if document.get("format") != _FORMAT:
                raise ValueError(f"format is {document.get('format')!r}, not {_FORMAT!r}")
            if document.get("session_id") != self.session_id:
                return {}  # another session's record: this one has signed nothing yet
            return {
                int(index): SignedSet(
                    bytes.fromhex(entry["survivor_hash"]),
                    tuple(str(n) for n in entry["survivors"]),
                    tuple(str(n) for n in entry["dropped"]),
                    None
                    if entry.get("challenge_key") is None
                    else bytes.fromhex(entry["challenge_key"]),
                    None
                    if entry.get("own_tags") is None
                    else tuple(int(t, 16) for t in entry["own_tags"]),
                )
                for index, entry in document["rounds"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise SessionStateError(
                f"{self.path} is damaged ({error}); it records which survivor sets this node "
                "signed, so the node cannot safely answer unmask requests without it"
            ) from None

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
        if earlier.challenge_key == key and earlier.own_tags == own_tags:
            return
        updated = SignedSet(
            earlier.survivor_hash, earlier.survivors, earlier.dropped, key, tuple(own_tags)
        )
        self._write({**self._signed, round_index: updated})

    def _write(self, rounds: dict[int, SignedSet]) -> None:
        atomic_write_json(
            self.path,
            {
                "format": _FORMAT,
                "session_id": self.session_id,
                "rounds": {
                    str(index): {
                        "survivor_hash": entry.survivor_hash.hex(),
                        "survivors": list(entry.survivors),
                        "dropped": list(entry.dropped),
                        "challenge_key": None
                        if entry.challenge_key is None
                        else entry.challenge_key.hex(),
                        "own_tags": None
                        if entry.own_tags is None
                        else [format(t, "x") for t in entry.own_tags],
                    }
                    for index, entry in sorted(rounds.items())
                },
            },
        )
        self._signed = rounds
