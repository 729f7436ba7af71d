"""Checking the coordinator's roster against the pinned identities, and deriving seeds.

The coordinator relays every node's signed ephemeral X25519 key. It must not
be able to substitute a key (a man in the middle would then share every
"pairwise" seed), so each node verifies every bundle against the Ed25519
identity key pinned for that node in the federation config, for this
federation (config hash) and this session, and checks that its own entry is
the key it sent (docs/design.md §4.2). Any mismatch aborts the node with the node
id and the reason. A final roster with fewer members than the federation's
``min_nodes`` is refused too: the local config decides, never the
coordinator's word (docs/design.md §4.2). The roster hash is recomputed and
compared, and kept: the node binds it into every upload statement it signs
(node/protocol/statements.py), which is how nodes learn that all contributors were
shown the same roster. The pairwise seeds s_kj = HKDF(X25519(sk_k, pk_j), ...)
are derived only from a roster that passed (``noise.seeds.pairwise_seed``,
docs/design.md §4.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from node.errors import RosterError
from noise.errors import KeyFormatError, SignatureError
from noise.keys import EphemeralKey, KeyBundle, verify_key_bundle
from noise.seeds import pairwise_seed
from noise.transcript import roster_hash
from proto.messages import RosterView

__all__ = ["RosterError", "VerifiedRoster", "derive_seeds", "verify_roster"]


@dataclass(frozen=True)
class VerifiedRoster:
    """The final roster after every signature checked out.

    ``roster_hash`` is ``noise.transcript.roster_hash`` recomputed from the
    verified bundles, the digest this node signs into its upload statements.
    """

    session_id: str
    public_keys: Mapping[str, bytes]  # node id -> X25519 public key, every joined node
    excluded: tuple[str, ...]
    roster_hash: bytes

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self.public_keys))


def verify_roster(
    roster: RosterView,
    *,
    node_id: str,
    own_public_key: bytes,
    session_id: str,
    config_hash: bytes,
    identity_keys: Mapping[str, bytes],
    min_nodes: int = 2,
) -> VerifiedRoster:
    """Verify every bundle of ``roster``; raise :class:`RosterError` on the first problem.

    ``min_nodes`` is the federation's minimum (``FederationConfig.min_nodes``);
    a final roster with fewer members is refused. The default, 2, is the
    smallest minimum a federation config accepts.
    """
    if roster.session_id != session_id:
        raise RosterError(
            node_id, f"the roster is for session {roster.session_id!r}, not {session_id!r}"
        )
    if roster.config_hash != config_hash:
        raise RosterError(node_id, "the roster was made for another federation configuration")
    bundles: list[KeyBundle] = []
    keys: dict[str, bytes] = {}
    for bundle in roster.bundles:
        who = bundle.node_id
        if who in keys:
            raise RosterError(who, "the roster lists this node twice")
        pinned = identity_keys.get(who)
        if pinned is None:
            raise RosterError(who, "this node is not a member of the federation")
        try:
            verify_key_bundle(
                bundle, pinned, config_hash=config_hash, session_id=session_id, node_id=who
            )
        except SignatureError as error:
            raise RosterError(who, error.reason) from None
        except KeyFormatError as error:
            raise RosterError(who, str(error)) from None
        bundles.append(bundle)
        keys[who] = bundle.public_key
    mine = keys.get(node_id)
    if mine is None:
        raise RosterError(node_id, "this node's own key is missing from the roster")
    if mine != own_public_key:
        raise RosterError(
            node_id, "the roster carries a different ephemeral key for this node than it sent"
        )
    digest = roster_hash(config_hash, session_id, bundles)
    if roster.roster_hash and roster.roster_hash != digest:
        raise RosterError(node_id, "the roster hash does not match the bundles it lists")
    if roster.final and len(keys) < min_nodes:
        absent = sorted(n for n in identity_keys if n not in keys)
        who = f"{', '.join(absent)} did not join before the join deadline, so " if absent else ""
        raise RosterError(
            node_id,
            f"{who}the final roster has {len(keys)} member(s) ({', '.join(sorted(keys))}), fewer "
            f"than the federation's min_nodes = {min_nodes} (the fewest nodes with which no "
            "dropout leaves an observer class without noise); this node releases nothing",
        )
    return VerifiedRoster(
        session_id=session_id,
        public_keys=keys,
        excluded=tuple(sorted(roster.excluded)),
        roster_hash=digest,
    )


def derive_seeds(
    roster: VerifiedRoster, own: EphemeralKey, *, node_id: str, config_hash: bytes
) -> dict[str, bytes]:
    """The pairwise seed this node shares with every other node of the roster."""
    return {
        peer: pairwise_seed(
            own,
            public,
            own_id=node_id,
            peer_id=peer,
            session_id=roster.session_id,
            config_hash=config_hash,
        )
        for peer, public in sorted(roster.public_keys.items())
        if peer != node_id
    }
