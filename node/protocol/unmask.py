"""When a survivor may reveal its pair terms with dropped nodes, and when it must refuse.

If nodes drop out of round r, the coordinator asks every survivor k for
Σ_{j∈D} ±q(c_kj·z_kj), its pair terms with the dropped set D, so that the
masks of D can be cancelled from the survivors' sum. Revealing them gives the
coordinator exactly what the dropped nodes would have known, so a survivor
answers only when (docs/design.md §4.6):

1. the request is well formed for this session and round: the survivor set S
   and the dropped set D are disjoint, together make up the round's
   participants, S contains this node, and the survivor-set hash recomputed
   from (config hash, session, round, S, D) equals the one presented;
2. S is at least the federation's ``min_nodes`` (taken from the local config,
   never from the coordinator's message);
3. every member of S has signed an attestation of that same hash with its
   pinned Ed25519 identity key — the consistency check of Bonawitz et al.
   2017 (ACM CCS), which stops a coordinator from telling different survivors
   different stories to learn two complementary sets of pair terms;
4. the noise left on this node's egress once D's pair terms are known stays at
   or above its floor (``ReleaseNoise.floor_shortfall``);
5. nothing revealed for an earlier attempt of the same round combines with
   this answer into more than the floor check saw: D contains every node whose
   pair terms were already sent, and no node that was a survivor of an
   answered attempt (``check_against_revealed``).

Each check returns a reason sentence, recorded in the ledger and sent to the
coordinator in the refusal, or None.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from noise.keys import IdentityKey
from noise.transcript import survivor_attestation_message, survivor_set_hash
from proto.messages import Attestation, UnmaskRequest

__all__ = [
    "Attestation",
    "RevealedTerms",
    "UnmaskRequest",
    "attestation_signature",
    "check_against_revealed",
    "check_attestations",
    "check_request",
    "missing_attestations",
]


def _names(nodes: Collection[str]) -> str:
    return "{" + ", ".join(sorted(nodes)) + "}"


def check_request(  # noqa: PLR0911 - checks 1 and 2 of the module docstring, one return per refusal
    ask: UnmaskRequest,
    *,
    node_id: str,
    session_id: str,
    round_index: int,
    participants: Collection[str],
    config_hash: bytes,
    min_nodes: int,
) -> str | None:
    """Checks 1 and 2: a reason to refuse before attesting, or None."""
    if ask.session_id != session_id:
        return f"the request concerns session {ask.session_id!r}, not session {session_id!r}"
    # ``round_index`` must be the round this node is awaiting, never the
    # request's own: another round's stream keys must not be revealed with this
    # round's layout and noise (nor any round's without its own checks).
    if ask.round_index != round_index:
        return (
            f"the request concerns round {ask.round_index}, but I am awaiting the result of "
            f"round {round_index}; I only reveal pair terms for the round I am waiting on"
        )
    survivors, dropped = set(ask.survivors), set(ask.dropped)
    if len(survivors) != len(ask.survivors) or len(dropped) != len(ask.dropped):
        return "the request lists a node twice"
    if node_id not in survivors:
        return f"I am not in the survivor set {_names(survivors)} I was shown"
    if survivors & dropped:
        return f"nodes {_names(survivors & dropped)} are listed as both survivors and dropped"
    if survivors | dropped != set(participants):
        return (
            f"survivor set inconsistent: I was shown survivors {_names(survivors)} and dropped "
            f"{_names(dropped)}, but round {round_index} was run by {_names(participants)}"
        )
    if len(survivors) < min_nodes:
        return f"survivor set of {len(survivors)} is below the federation minimum of {min_nodes}"
    expected = survivor_set_hash(config_hash, session_id, round_index, survivors, dropped)
    if ask.survivor_hash != expected:
        return (
            "the survivor-set hash in the request does not match the survivors "
            f"{_names(survivors)} and dropped {_names(dropped)} it lists"
        )
    return None


@dataclass
class RevealedTerms:
    """What this node has already sent for one round's unmask attempts.

    ``dropped`` is the union of every dropped set whose pair terms (or CAPE
    pads) were sent, ``survivors`` the union of the survivor sets of those
    attempts. Both count from the moment an answer starts to leave the TRE,
    whether or not the coordinator then takes it (an over-count, never an
    under-count).
    """

    dropped: set[str]
    survivors: set[str]


def check_against_revealed(ask: UnmaskRequest, revealed: RevealedTerms | None) -> str | None:
    """A reason to refuse because of what earlier attempts of the round revealed, or None.

    Two answers for the same round leak their *difference*; each check stops
    a difference that isolates pair terms the noise floor never accounted for.

    * The dropped set may only grow. Answers for D₁ = {c} and then D₂ = {b}
      together reveal the pair terms with {b, c}, although each request alone
      passes the floor check; requiring D₂ ⊇ D₁ makes the latest D the union
      of everything revealed, so the floor check and the ledger see it whole.
    * No earlier survivor may become dropped. Once this node answered an
      attempt in which L was a survivor, the coordinator holds L's upload
      x_L + Σ_j ±q(c_Lj·z_Lj); a later answer for D ∪ {L} minus the earlier one
      for D is this node's pair term with L, and with every survivor's such
      difference the coordinator strips L's noise down to its pair terms with
      D — the laggard attack on the re-run of Bonawitz et al. 2017 (ACM CCS),
      which their protocol prevents by never answering twice for one round.
    """
    if revealed is None:
        return None
    dropped = set(ask.dropped)
    if not revealed.dropped <= dropped:
        added = dropped - revealed.dropped
        what = (
            f"reveals pair terms with {_names(added)}" if added else f"drops only {_names(dropped)}"
        )
        return (
            f"request for round {ask.round_index} {what} after {_names(revealed.dropped)} was "
            "already revealed; an unmask may only grow the dropped set"
        )
    stripped = dropped & revealed.survivors
    if stripped:
        who = ", ".join(repr(n) for n in sorted(stripped))
        return (
            f"request for round {ask.round_index} drops {who}, which was a survivor when I "
            f"already sent my pair terms with {_names(revealed.dropped)} for this round; "
            f"revealing my pair terms with {who} now would strip that node's noise (the "
            "coordinator holds its upload and the difference of my two answers)"
        )
    return None


def attestation_signature(
    identity: IdentityKey,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    survivor_hash: bytes,
) -> bytes:
    """This node's Ed25519 signature attesting the survivor set it was shown."""
    return identity.sign(
        survivor_attestation_message(config_hash, session_id, round_index, survivor_hash)
    )


def check_attestations(
    ask: UnmaskRequest,
    *,
    config_hash: bytes,
    identity_keys: Mapping[str, bytes],
) -> tuple[bool, str | None]:
    """Check 3: (complete, reason). Incomplete without a reason means "wait for more".

    An attestation of another hash, by a node outside S, or whose signature
    does not verify against the pinned key is a reason to refuse at once.
    """
    survivors = set(ask.survivors)
    seen: dict[str, Attestation] = {}
    for attestation in ask.attestations:
        who = attestation.node_id
        if who not in survivors:
            return False, (
                f"survivor set inconsistent: node {who!r} attested but is not among the "
                f"survivors {_names(survivors)} I was shown"
            )
        if attestation.survivor_hash != ask.survivor_hash:
            return False, (
                f"survivor set inconsistent: node {who!r} acknowledged a different survivor set "
                f"(hash {attestation.survivor_hash.hex()[:16]}…) but I was shown "
                f"{_names(survivors)} (hash {ask.survivor_hash.hex()[:16]}…)"
            )
        key = identity_keys.get(who)
        if key is None:
            return False, f"node {who!r} has no pinned identity key in the federation config"
        message = survivor_attestation_message(
            config_hash, ask.session_id, ask.round_index, ask.survivor_hash
        )
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(attestation.signature, message)
        except (InvalidSignature, ValueError):
            return False, (
                f"the attestation of node {who!r} does not verify against its pinned identity key"
            )
        seen[who] = attestation
    return set(seen) == survivors, None


def missing_attestations(ask: UnmaskRequest) -> Sequence[str]:
    """Survivors whose attestation has not arrived yet (sorted)."""
    have = {a.node_id for a in ask.attestations}
    return sorted(set(ask.survivors) - have)
