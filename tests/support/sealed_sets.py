"""Sealed aggregate-check copies under their sender's one signature, as a node sends them."""

from __future__ import annotations

from collections.abc import Mapping

from noise.keys import IdentityKey
from noise.transcript import sealed_digest, sealed_set_message
from proto.messages import Sealed


def signed_set(
    signer: IdentityKey | None,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    kind: str,
    binding: bytes,
    sender: str,
    bodies: Mapping[str, bytes],
) -> tuple[Sealed, ...]:
    """``bodies`` (recipient -> sealed copy) in recipient order, each carrying ``signer``'s
    one signature over them all (64 zero bytes without a signer)."""
    message = sealed_set_message(
        config_hash,
        session_id,
        round_index,
        kind=kind,
        binding=binding,
        sender=sender,
        digests={recipient: sealed_digest(body) for recipient, body in bodies.items()},
    )
    signature = signer.sign(message) if signer is not None else bytes(64)
    return tuple(Sealed(sender, r, bodies[r], signature) for r in sorted(bodies))
