"""A node trusts only a roster whose every key is signed by the pinned identity."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from node.protocol.roster import RosterError, derive_seeds, verify_roster
from noise.keys import EphemeralKey, IdentityKey, KeyBundle, sign_key_bundle
from noise.transcript import roster_hash
from proto.messages import RosterView

IDS = ["a", "b", "c"]
CONFIG_HASH = bytes(range(32))
SESSION = "feedfacefeedfacefeedfacefeedface"
IDENTITY = {n: IdentityKey.from_private_bytes(bytes([i + 7]) * 32) for i, n in enumerate(IDS)}
EPHEMERAL = {n: EphemeralKey.from_private_bytes(bytes([i + 70]) * 32) for i, n in enumerate(IDS)}
PINNED = {n: k.public_bytes() for n, k in IDENTITY.items()}


def _bundle(node: str, *, signer: str | None = None, session: str = SESSION) -> KeyBundle:
    return sign_key_bundle(
        IDENTITY[signer or node],
        config_hash=CONFIG_HASH,
        session_id=session,
        node_id=node,
        public_key=EPHEMERAL[node].public_bytes(),
    )


def _roster(bundles: list[KeyBundle], **changes: object) -> RosterView:
    roster = RosterView(
        session_id=SESSION,
        config_hash=CONFIG_HASH,
        bundles=tuple(bundles),
        roster_hash=roster_hash(CONFIG_HASH, SESSION, bundles),
        final=True,
        excluded=(),
    )
    return dataclasses.replace(roster, **changes)  # type: ignore[arg-type]


def _verify(roster: RosterView, me: str = "a", *, key_of: str | None = None, **limits: int) -> Any:
    """``me`` verifies ``roster``, having sent the key of ``key_of`` (by default its own)."""
    return verify_roster(
        roster,
        node_id=me,
        own_public_key=EPHEMERAL[key_of or me].public_bytes(),
        session_id=SESSION,
        config_hash=CONFIG_HASH,
        identity_keys=PINNED,
        **limits,
    )


def test_honest_roster_passes_and_seeds_agree_pairwise() -> None:
    roster = _roster([_bundle(n) for n in IDS])
    seeds = {}
    for me in IDS:
        verified = _verify(roster, me)
        assert verified.node_ids == tuple(IDS)
        seeds[me] = derive_seeds(verified, EPHEMERAL[me], node_id=me, config_hash=CONFIG_HASH)
    assert seeds["a"]["b"] == seeds["b"]["a"]
    assert seeds["a"]["c"] == seeds["c"]["a"]
    assert seeds["a"]["b"] != seeds["a"]["c"]


def test_substituted_key_is_caught_with_the_node_named() -> None:
    forged = _bundle("b", signer="c")  # the coordinator cannot sign as b
    with pytest.raises(RosterError, match="roster entry of node 'b' rejected: the signature") as e:
        _verify(_roster([_bundle("a"), forged, _bundle("c")]))
    assert e.value.node_id == "b"


def test_replayed_bundle_from_another_session_is_caught() -> None:
    old = _bundle("c", session="0" * 32)
    with pytest.raises(RosterError, match=r"node 'c' rejected: .*replayed from another session"):
        _verify(_roster([_bundle("a"), _bundle("b"), old]))


def test_own_key_must_be_the_one_sent() -> None:
    roster = _roster([_bundle(n) for n in IDS])
    with pytest.raises(RosterError, match="different ephemeral key for this node"):
        _verify(roster, "a", key_of="b")


def test_unknown_node_and_bad_roster_hash_are_caught() -> None:
    stranger = dataclasses.replace(_bundle("c"), node_id="z")
    with pytest.raises(RosterError, match="node 'z' rejected: this node is not a member"):
        _verify(_roster([_bundle("a"), stranger]))
    roster = _roster([_bundle(n) for n in IDS], roster_hash=bytes(32))
    with pytest.raises(RosterError, match="roster hash does not match"):
        _verify(roster)


def test_the_verified_roster_keeps_the_hash_it_recomputed() -> None:
    bundles = [_bundle(n) for n in IDS]
    # A coordinator that sends none: the node computes it anyway.
    roster = _roster(bundles, roster_hash=b"")
    verified = _verify(roster, "a")
    assert verified.roster_hash == roster_hash(CONFIG_HASH, SESSION, bundles)


def test_a_final_roster_below_the_federation_minimum_is_refused() -> None:
    two = _roster([_bundle("a"), _bundle("c")])
    _verify(two, min_nodes=2)
    with pytest.raises(RosterError) as caught:
        _verify(two, min_nodes=3)
    absent = ", ".join(sorted(n for n in PINNED if n not in ("a", "c")))
    assert str(caught.value) == (
        f"roster entry of node 'a' rejected: {absent} did not join before the join deadline, "
        "so the final roster has 2 member(s) (a, c), fewer than the federation's min_nodes = 3 "
        "(the fewest nodes with which no dropout leaves an observer class without noise); this "
        "node releases nothing"
    )
    # Alone on the roster: refused even with the default minimum of 2.
    with pytest.raises(RosterError, match="the final roster has 1 member"):
        _verify(_roster([_bundle("a")]))
    # A roster still filling up is not judged by its size.
    filling = _roster([_bundle("a")], final=False)
    _verify(filling, min_nodes=3)
