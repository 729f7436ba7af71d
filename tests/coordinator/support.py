"""Shared pieces for the coordinator tests: identities, a fake clock, zero-sum payloads.

Uploads carry the node's signed upload statement; :func:`signed_header` makes
one with the identity key of the test federation the session belongs to.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import blake3
import numpy as np
import pytest
from numpy.typing import NDArray

from coordinator.config import SessionConfig
from coordinator.errors import CoordinatorError
from coordinator.layout import PayloadSpec, TensorSlot
from coordinator.session import Session, Ticket
from noise.aggregate_check import SEALED_TAGS_BYTES
from noise.keys import EphemeralKey, IdentityKey, KeyBundle, sign_key_bundle
from noise.layout import Layout
from noise.self_mask import self_mask, self_mask_commitment
from noise.transcript import (
    roster_hash,
    survivor_attestation_message,
    upload_statement_message,
)
from proto.convert import sealed_contributions_to_pb, sealed_tags_to_pb
from proto.messages import (
    Attestation,
    Sealed,
    UnmaskHeader,
    UploadHeader,
    UploadReceipt,
    WithdrawReceipt,
    WithdrawRequest,
)
from proto.zerosum.v1 import session_pb2 as pb
from tests.support.sealed_sets import signed_set

CONFIG_HASH = hashlib.sha256(b"zerosum test federation").digest()

# Every test federation's identity keys, by public key: what lets a helper
# that only has the session sign as one of its nodes.
_IDENTITIES: dict[bytes, IdentityKey] = {}


class FakeClock:
    """A clock the test moves by hand (Unix milliseconds)."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, milliseconds: int) -> int:
        self.now += milliseconds
        return self.now


@dataclass
class Federation:
    """Identity keys of a test federation and its coordinator-side config."""

    node_ids: tuple[str, ...]
    identities: dict[str, IdentityKey]
    config: SessionConfig
    ephemeral: dict[str, EphemeralKey] = field(default_factory=dict)

    def bundle(
        self, node_id: str, session_id: str, *, config_hash: bytes = CONFIG_HASH
    ) -> KeyBundle:
        key = self.ephemeral.setdefault(node_id, EphemeralKey.generate())
        return sign_key_bundle(
            self.identities[node_id],
            config_hash=config_hash,
            session_id=session_id,
            node_id=node_id,
            public_key=key.public_bytes(),
        )

    def attestation(
        self,
        node_id: str,
        session_id: str,
        round_index: int,
        digest: bytes,
        *,
        survivors: Sequence[str] | None = None,
    ) -> Attestation:
        """``node_id``'s signature over ``digest``, with stand-in tags sealed for the others.

        ``survivors``: the survivor set ``digest`` binds (default: every member).
        """
        message = survivor_attestation_message(CONFIG_HASH, session_id, round_index, digest)
        others = sorted(set(self.identities if survivors is None else survivors) - {node_id})
        return Attestation(
            session_id=session_id,
            round_index=round_index,
            node_id=node_id,
            survivor_hash=digest,
            signature=self.identities[node_id].sign(message),
            tags=self.sealed_tags(node_id, others, session_id, round_index, digest),
        )

    def sealed_tags(
        self,
        node_id: str,
        peers: Sequence[str],
        session_id: str,
        round_index: int,
        digest: bytes,
    ) -> tuple[Sealed, ...]:
        """Opaque stand-in tags of ``node_id`` for each of ``peers``, signed once by it."""
        return signed_set(
            self.identities[node_id],
            config_hash=CONFIG_HASH,
            session_id=session_id,
            round_index=round_index,
            kind="tags",
            binding=digest,
            sender=node_id,
            bodies={peer: bytes([len(peer)]) * SEALED_TAGS_BYTES for peer in peers},
        )


def make_federation(
    node_ids: Sequence[str] = ("a", "b", "c"),
    *,
    min_nodes: int = 2,
    construction: str = "pairwise",
    join_ms: int = 60_000,
    round_ms: int = 60_000,
    fixed_point_bits: int = 32,
    rounds: Sequence[str] = ("moments", "scatter"),
    layout: Layout | None = None,
    max_reruns: int = 2,
) -> Federation:
    identities = {n: IdentityKey.generate() for n in node_ids}
    _IDENTITIES.update({k.public_bytes(): k for k in identities.values()})
    config = SessionConfig(
        federation_id="testfed",
        config_hash=CONFIG_HASH,
        identity_keys={n: k.public_bytes() for n, k in identities.items()},
        min_nodes=min_nodes,
        join_timeout_ms=join_ms,
        round_timeout_ms=round_ms,
        rounds={name: layout or PLAN_LAYOUT for name in rounds},
        construction=construction,
        fixed_point_bits=fixed_point_bits,
        max_reruns=max_reruns,
    )
    return Federation(tuple(sorted(node_ids)), identities, config)


LAYOUT = (
    TensorSlot("count", (), 0, 1),
    TensorSlot("sums", (3, 5), 1, 15),
    TensorSlot("tail", (20,), 16, 20),
)
N_WORDS = 36
# Every round of the test plan has this public layout.
PLAN_LAYOUT = Layout(LAYOUT)


def spec_for(
    payload: NDArray[np.uint64], tensors: tuple[TensorSlot, ...] = LAYOUT, bits: int = 32
) -> PayloadSpec:
    data = payload.astype("<u8").tobytes()
    return PayloadSpec(
        total_bytes=len(data),
        total_elements=int(payload.shape[0]),
        digest=blake3.blake3(data).digest(),
        fixed_point_bits=bits,
        tensors=tensors,
    )


@dataclass
class ZeroSum:
    """Secret values x_k, pair masks t_ij (i < j) and payloads y_k = x_k + Σ_j ±t_kj."""

    values: dict[str, NDArray[np.uint64]]
    masks: dict[tuple[str, str], NDArray[np.uint64]]
    payloads: dict[str, NDArray[np.uint64]]

    def correction(self, node: str, dropped: Sequence[str]) -> NDArray[np.uint64]:
        """Signed sum of ``node``'s pair masks with ``dropped`` (what it added for them)."""
        out = np.zeros(self.payloads[node].shape[0], dtype=np.uint64)
        for other in dropped:
            if node < other:
                np.add(out, self.masks[(node, other)], out=out)
            else:
                np.subtract(out, self.masks[(other, node)], out=out)
        return out

    def total(self, nodes: Sequence[str]) -> NDArray[np.uint64]:
        """Σ x_k over ``nodes`` modulo 2^64: the exact aggregate wanted."""
        return wrapping_total([self.values[n] for n in nodes])


def zero_sum(node_ids: Sequence[str], n_words: int, seed: int) -> ZeroSum:
    """Random secrets and pairwise masks that cancel exactly in the sum over all nodes."""
    rng = np.random.default_rng(seed)
    values = {n: rng.integers(0, 2**63, n_words, dtype=np.uint64) for n in node_ids}
    masks = {
        (i, j): rng.integers(0, 2**64 - 1, n_words, dtype=np.uint64, endpoint=True)
        for i, j in itertools.combinations(sorted(node_ids), 2)
    }
    payloads = {}
    for node in node_ids:
        y = values[node].copy()
        for (i, j), t in masks.items():
            if node == i:
                np.add(y, t, out=y)
            elif node == j:
                np.subtract(y, t, out=y)
        payloads[node] = y
    return ZeroSum(values, masks, payloads)


def wrapping_total(vectors: Sequence[NDArray[np.uint64]]) -> NDArray[np.uint64]:
    out = np.zeros(vectors[0].shape[0], dtype=np.uint64)
    for v in vectors:
        np.add(out, v, out=out)
    return out


def stream(session: Session, ticket: Ticket, data: bytes, chunk: int) -> None:
    for offset in range(0, len(data), chunk):
        session.receive(ticket, offset, data[offset : offset + chunk])


def final_roster_hash(session: Session) -> bytes:
    """The roster hash every node of the session verified (all joined keys)."""
    return roster_hash(session.config.config_hash, session.session_id, session.store.members())


def node_seed(node: str, round_index: int) -> bytes:
    """The self-mask seed a test node uses for a round (any fixed 32 bytes will do)."""
    return hashlib.sha256(f"test self-mask {node} {round_index}".encode()).digest()


def masked(session: Session, node: str, round_index: int, payload: NDArray[np.uint64]) -> bytes:
    """``payload`` under ``node``'s test self-mask for the round, as bytes on the wire."""
    opened = session.store.round(round_index)
    layout = opened.layout if opened is not None and opened.layout is not None else None
    if layout is None or layout.size != payload.size:
        return payload.astype("<u8").tobytes()  # refused anyway: the layout is wrong
    pad = self_mask(node_seed(node, round_index), layout, round_index=round_index)
    sent: NDArray[np.uint64] = payload + pad
    return sent.astype("<u8").tobytes()


def signed_header(
    session: Session,
    node: str,
    round_index: int,
    round_name: str,
    spec: PayloadSpec,
    *,
    session_id: str | None = None,
    roster: bytes | None = None,
    identity: IdentityKey | None = None,
) -> UploadHeader:
    """An upload header with ``node``'s statement over exactly these fields.

    ``roster`` defaults to the session's final roster hash, ``identity`` to the
    node's pinned key. A statement that cannot be encoded (a digest of the
    wrong length) gets a zero signature: the coordinator must refuse it anyway.
    """
    sid = session.session_id if session_id is None else session_id
    digest = final_roster_hash(session) if roster is None else roster
    signer = identity or _IDENTITIES.get(session.config.identity_keys.get(node, b""))
    try:
        message = upload_statement_message(
            session.config.config_hash,
            sid,
            round_index,
            round_name,
            roster_hash=digest,
            payload_digest=spec.digest,
        )
    except ValueError:
        message = None
    signature = signer.sign(message) if signer is not None and message is not None else bytes(64)
    commitment = self_mask_commitment(node_seed(node, round_index))
    return UploadHeader(
        sid,
        round_index,
        round_name,
        node,
        spec,
        digest,
        signature,
        commitment,
        challenge=sealed_challenge(session, node, round_index),
    )


def sealed_challenge(session: Session, node: str, round_index: int) -> tuple[Sealed, ...]:
    """Stand-ins for ``node``'s sealed challenge contributions (opaque to the coordinator).

    Each is signed by ``node`` as the coordinator requires (with no key known
    for ``node``, an all-zero signature it refuses).
    """
    opened = session.store.round(round_index)
    others = sorted(set(opened.participants) - {node}) if opened is not None else []
    signer = _IDENTITIES.get(session.config.identity_keys.get(node, b""))
    if not others:
        return ()
    return signed_set(
        signer,
        config_hash=session.config.config_hash,
        session_id=session.session_id,
        round_index=round_index,
        kind="contribution",
        binding=bytes(32),
        sender=node,
        bodies={peer: bytes([len(peer)]) * 48 for peer in others},
    )


def upload(
    session: Session,
    node: str,
    round_index: int,
    payload: NDArray[np.uint64],
    *,
    chunk: int = 64,
    round_name: str | None = None,
) -> UploadReceipt:
    """Send a whole payload under the node's test self-mask, as the server would."""
    opened = session.store.round(round_index)
    name = round_name if round_name is not None else opened.name if opened else "?"
    data = masked(session, node, round_index, payload)
    sent = np.frombuffer(data, dtype="<u8").astype(np.uint64)
    header = signed_header(session, node, round_index, name, spec_for(sent))
    ticket = session.begin_upload(header, caller=node)
    if isinstance(ticket, UploadReceipt):
        return ticket
    try:
        stream(session, ticket, data, chunk)
    except BaseException:
        session.abandon(ticket)
        raise
    receipt = session.finish(ticket)
    assert isinstance(receipt, UploadReceipt)
    return receipt


def submit_correction(
    session: Session,
    node: str,
    round_index: int,
    payload: NDArray[np.uint64] | None,
    *,
    seed: bytes | None = None,
) -> object:
    """``node``'s unmask answer: its test self-mask seed, and ``payload`` as its corrections."""
    # The request as stored: once a node has answered it is no longer pending for
    # that node, but a retry must still be able to name it.
    opened = session.store.round(round_index)
    assert opened is not None
    request = session.store.unmask_request(round_index, opened.unmask_attempt)
    assert request is not None
    header = UnmaskHeader(
        session_id=session.session_id,
        round_index=round_index,
        round_name=opened.name,
        node_id=node,
        dropped=request.dropped,
        survivor_hash=request.survivor_hash,
        payload=None if payload is None else spec_for(payload),
        self_mask_seed=node_seed(node, round_index) if seed is None else seed,
    )
    ticket = session.begin_unmask(header, caller=node)
    if not isinstance(ticket, Ticket):
        return ticket
    assert payload is not None
    stream(session, ticket, payload.astype("<u8").tobytes(), 100)
    return session.finish(ticket)


def refused(session: Session, error: type[CoordinatorError], action: Callable[[], object]) -> str:
    """Run ``action``, expect ``error``, and check the state file did not change."""
    before = session.store.dump()
    with pytest.raises(error) as caught:
        action()
    assert session.store.dump() == before
    return str(caught.value)


class SurvivorSet(Protocol):
    """What a node signs of an unmask request (a request as shown, or as stored)."""

    @property
    def survivor_hash(self) -> bytes: ...

    @property
    def survivors(self) -> tuple[str, ...]: ...


def attest_as(
    fed: Federation, session: Session, round_index: int, node: str, request: SurvivorSet
) -> None:
    """``node`` signs the survivor set of ``request``, an unmask request of the round."""
    session.attest(
        fed.attestation(
            node,
            session.session_id,
            round_index,
            request.survivor_hash,
            survivors=request.survivors,
        ),
        caller=node,
    )


def unmask_round(
    fed: Federation, session: Session, round_index: int, survivors: list[str]
) -> tuple[str, ...]:
    """Every survivor attests the request it was shown; returns the dropped set."""
    dropped: tuple[str, ...] = ()
    for node in survivors:
        request = session.unmask_request(session.session_id, round_index, caller=node)
        assert request.pending
        dropped = request.dropped
        attest_as(fed, session, round_index, node, request)
    return dropped


def attest_all(fed: Federation, session: Session, round_index: int) -> None:
    """Every survivor of the round's unmask request signs it."""
    opened = session.store.round(round_index)
    assert opened is not None
    request = session.store.unmask_request(round_index, opened.unmask_attempt)
    assert request is not None
    for node in request.survivors:
        attest_as(fed, session, round_index, node, request)


def reveal_all(
    fed: Federation, session: Session, round_index: int, data: ZeroSum | None = None
) -> None:
    """The round's whole unmask step: every survivor attests, then answers.

    The answers carry each survivor's seed and, when nodes dropped, its
    corrections from ``data``.
    """
    attest_all(fed, session, round_index)
    opened = session.store.round(round_index)
    assert opened is not None
    request = session.store.unmask_request(round_index, opened.unmask_attempt)
    assert request is not None
    for node in request.survivors:
        corrections = None
        if request.dropped:
            assert data is not None, "corrections need the round's zero-sum data"
            corrections = data.correction(node, request.dropped)
        submit_correction(session, node, round_index, corrections)


def run_round(
    fed: Federation, session: Session, round_index: int, payloads: dict[str, NDArray[np.uint64]]
) -> None:
    """Every node in ``payloads`` uploads, then the round's unmask step runs (nobody dropped)."""
    for node, payload in payloads.items():
        upload(session, node, round_index, payload)
    reveal_all(fed, session, round_index)


def sent_digest(
    session: Session, node: str, round_index: int, payload: NDArray[np.uint64]
) -> bytes:
    """SHA-256 of what :func:`upload` sends for ``payload``: the bytes under the self-mask."""
    return blake3.blake3(masked(session, node, round_index, payload)).digest()


def join_all(fed: Federation, session: Session, nodes: Sequence[str] | None = None) -> None:
    for node in nodes if nodes is not None else fed.node_ids:
        session.join(fed.bundle(node, session.session_id), caller=node)


def read_result(session: Session, round_index: int, caller: str = "a") -> NDArray[np.uint64]:
    view = session.result(session.session_id, round_index, caller=caller)
    assert view.path is not None, view
    return np.frombuffer(view.path.read_bytes(), dtype="<u8").astype(np.uint64)


def wire_contributions(
    identity: IdentityKey,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    sender: str,
    recipients: Sequence[str],
) -> list[pb.SealedContribution]:
    """Stand-in sealed contributions on the wire for every recipient, signed by ``identity``."""
    return sealed_contributions_to_pb(
        signed_set(
            identity,
            config_hash=config_hash,
            session_id=session_id,
            round_index=round_index,
            kind="contribution",
            binding=bytes(32),
            sender=sender,
            bodies={r: bytes(48) for r in sorted(set(recipients) - {sender})},
        )
    )


def wire_tags(
    identity: IdentityKey,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    survivor_hash: bytes,
    sender: str,
    recipients: Sequence[str],
) -> list[pb.SealedTags]:
    """Stand-in sealed tags on the wire for every recipient, signed by ``identity``."""
    return sealed_tags_to_pb(
        signed_set(
            identity,
            config_hash=config_hash,
            session_id=session_id,
            round_index=round_index,
            kind="tags",
            binding=survivor_hash,
            sender=sender,
            bodies={
                r: bytes([len(r)]) * SEALED_TAGS_BYTES for r in sorted(set(recipients) - {sender})
            },
        )
    )


REJECTED = "the TRE's output checker rejected this node's egress"


def withdrawal(
    session: Session, node: str, round_index: int = 0, reason: str = REJECTED, **changes: str
) -> WithdrawRequest:
    return WithdrawRequest(
        session_id=changes.get("session_id", session.session_id),
        round_index=round_index,
        node_id=node,
        reason=reason,
    )


def withdraw(session: Session, node: str, round_index: int = 0, **kw: str) -> WithdrawReceipt:
    return session.withdraw(withdrawal(session, node, round_index, **kw), caller=node)
