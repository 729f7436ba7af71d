"""Sealed aggregate-check copies under their sender's one signature, as a node sends them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from noise.keys import IdentityKey
from noise.transcript import sealed_set_message, sealed_tree
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
    relayed: bool = False,
) -> tuple[Sealed, ...]:
    """``bodies`` (recipient -> sealed copy) in recipient order, each carrying ``signer``'s
    one signature over their tree (64 zero bytes without a signer): as sent, or with
    ``relayed`` as the coordinator relays them (each with its place and audit path)."""
    tree = sealed_tree(bodies)
    message = sealed_set_message(
        config_hash,
        session_id,
        round_index,
        kind=kind,
        binding=binding,
        sender=sender,
        count=tree.count,
        root=tree.root,
    )
    signature = signer.sign(message) if signer is not None else bytes(64)
    copies = tuple(Sealed(sender, r, bodies[r], signature) for r in tree.recipients)
    return as_relayed(copies) if relayed else copies


def as_relayed(copies: tuple[Sealed, ...]) -> tuple[Sealed, ...]:
    """A sender's copies with their places and audit paths in its tree, as relayed."""
    tree = sealed_tree({c.recipient: c.sealed for c in copies})
    return tuple(
        dataclasses.replace(
            c, index=tree.proof(c.recipient)[0], count=tree.count, path=tree.proof(c.recipient)[1]
        )
        for c in copies
    )
