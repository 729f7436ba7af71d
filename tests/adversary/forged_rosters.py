"""Rosters a lying coordinator alters: bundles relabelled or signed by a key it chose, rehashed."""

from __future__ import annotations

from collections.abc import Sequence

from noise.keys import EphemeralKey, IdentityKey, KeyBundle, sign_key_bundle
from noise.transcript import roster_hash
from proto.zerosum.v1 import session_pb2 as pb
from tests.adversary.lying_server import LyingCoordinator


def rehashed(
    server: LyingCoordinator, roster: pb.Roster, bundles: Sequence[pb.KeyBundle]
) -> pb.Roster:
    """``roster`` with ``bundles``, and a roster hash that matches them."""
    altered = pb.Roster()
    altered.CopyFrom(roster)
    del altered.bundles[:]
    altered.bundles.extend(bundles)
    altered.roster_hash = roster_hash(server.config_hash, roster.session_id, bundles)
    return altered


def relabelled(bundle: KeyBundle | pb.KeyBundle, node_id: str) -> pb.KeyBundle:
    """``bundle``'s key and signature, sent as the bundle of ``node_id``."""
    return pb.KeyBundle(
        config_hash=bundle.config_hash,
        session_id=bundle.session_id,
        node_id=node_id,
        public_key=bundle.public_key,
        signature=bundle.signature,
    )


def signed_by(
    identity: IdentityKey, key: EphemeralKey, server: LyingCoordinator, node_id: str
) -> pb.KeyBundle:
    """A bundle for ``node_id`` of ``key`` in the server's session, signed by ``identity``."""
    signed = sign_key_bundle(
        identity,
        config_hash=server.config_hash,
        session_id=server.session_id,
        node_id=node_id,
        public_key=key.public_bytes(),
    )
    return relabelled(signed, node_id)
