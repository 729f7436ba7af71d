"""One node process of the session benchmark (benchmarks/session_bench.py).

Run as ``python -m benchmarks._session_worker --federation F --node-id ID
--index I --size D``. The process holds its node's d float64 values (uniform
on [-1, 1], drawn from a generator seeded with its index: benchmark data, not
a secret) and obeys one JSON command per line on stdin, answering each with
one JSON line on stdout (``{"error": ...}`` when the command failed):

* ``{"cmd": "join", "address": A}``: open a mutual-TLS
  :class:`~node.protocol.client.GrpcGateway` to the coordinator at A, join its
  session with a fresh X25519 key signed by the node's Ed25519 identity key,
  poll the roster until it is final, verify every bundle against the pinned
  identities and derive the pairwise seeds (``noise.seeds.pairwise_seed``).
* ``{"cmd": "plain", "address": A}``: connect (TLS handshake included) to the
  bare baseline server of benchmarks/_plain_grpc.py.
* ``{"cmd": "prepare", "round_index": r, "tensor": t}``: draw the node's
  pairwise mask for round r and tensor t over the complete design of the
  roster and keep it, as a node does once it knows a round's layout and
  participants (``node.protocol.masking.MaskPrefetch``); answers when it is drawn.
* ``{"cmd": "round", "transport": "session" | "plain", "round_index": r,
  "round_name": n, "mask": "ahead" | "in_round" | "none"}``: the line is the
  start signal. Encode the values in fixed point and add the node's pairwise
  mask: the one prepared for this round ("ahead"; an error if none was), or
  one drawn now (``noise.masks.pairwise_mask``, "in_round"); then upload it
  with a signed upload statement (``node.protocol.statements``) and obtain the round's
  aggregate — from the coordinator by polling
  ``GetResult`` in a loop, ``--poll-seconds`` apart (default :data:`POLL_SECONDS`;
  the coordinator holds a poll until something changes), or
  from the baseline server, which answers when the sum is complete; the
  coordinator's aggregate is accepted only once every counted node's
  statement checks out, as a node does. The
  answer carries ``time.monotonic()`` stamps (one system-wide clock on Linux,
  so the parent can compare them with its own) at the start, after masking,
  after the upload and once the aggregate is in hand, and the aggregate's
  SHA-256.
* ``{"cmd": "quit"}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from numpy.typing import NDArray

from benchmarks._plain_grpc import plain_channel, plain_round
from node.protocol.client import GrpcGateway, RetryPolicy
from node.protocol.roster import derive_seeds, verify_roster
from node.protocol.statements import check_statements, sign_upload_statement
from node.protocol.unmask import attestation_signature
from noise.aggregate_check import (
    blinded_tags,
    challenge_contribution,
    challenge_key,
    challenge_vectors,
    check_tags,
    open_contribution,
    open_tags,
    seal_contribution,
    seal_tags,
    tags,
)
from noise.designs import Design, complete_design
from noise.fixed_point import FixedPointCodec
from noise.keys import EphemeralKey, IdentityKey, sign_key_bundle
from noise.layout import Layout, payload_digest
from noise.masks import pairwise_mask
from noise.self_mask import self_mask, self_mask_commitment, self_mask_seed
from noise.transcript import sealed_set_message, sealed_tree
from proto.chunks import payload_spec
from proto.federation import config_hash, load_federation
from proto.messages import (
    Attestation,
    RoundResult,
    RoundState,
    Sealed,
    UnmaskRequest,
    UploadHeader,
)

__all__ = ["MASK_MODES", "PLAIN_TENSOR", "POLL_SECONDS", "TENSOR", "main", "node_values"]

MASK_MODES = ("ahead", "in_round", "none")

# Pause between result polls. The coordinator holds a poll that would show
# nothing new until something changes (coordinator/server.py), so K pollers
# cost it nothing while they wait and the pause only needs to be short.
POLL_SECONDS = 0.001
TENSOR = "values"
# The bare baseline's rounds use a tensor name of their own, so no keystream of a
# session round is reused.
PLAIN_TENSOR = "plain/" + TENSOR
# Every call waits at most this long; the parent bounds the whole run too.
_CALL_SECONDS = 120.0
_VALUE_SEED_TAG = 0x5E55


def node_values(index: int, size: int) -> NDArray[np.float64]:
    """Node ``index``'s benchmark values: ``size`` draws uniform on [-1, 1] (deterministic)."""
    rng = np.random.default_rng([index, _VALUE_SEED_TAG])
    return rng.uniform(-1.0, 1.0, size)


class _Node:
    """The state one node process keeps between commands."""

    def __init__(
        self, federation: Path, node_id: str, index: int, size: int, poll_seconds: float
    ) -> None:
        config = load_federation(federation)
        base = config.base_dir or federation.resolve().parent
        folder = base / "nodes" / node_id
        self.node_id = node_id
        self.poll_seconds = poll_seconds
        self.config = config
        self.config_hash = config_hash(config)
        self.codec = FixedPointCodec(config.fixed_point_bits)
        self.identity = IdentityKey.read_pem(folder / "identity.pem")
        self.ca = config.ca_certificate_path.read_bytes()
        self.certificate = (folder / "client.pem").read_bytes()
        self.key = (folder / "client.key").read_bytes()
        self.values = node_values(index, size)
        self.layout = Layout.of({TENSOR: (size,)})
        self.client: GrpcGateway | None = None
        self.session_id = ""
        self.seeds: dict[str, bytes] = {}
        self.design: Design | None = None
        self.ephemeral: EphemeralKey | None = None
        self.roster_hash = b""
        self.participants: tuple[str, ...] = ()
        self.plain: grpc.Channel | None = None
        self.prepared: dict[tuple[int, str], NDArray[np.uint64]] = {}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.plain is not None:
            self.plain.close()
            self.plain = None

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        action = command.get("cmd")
        if action == "join":
            return self._join(str(command["address"]))
        if action == "plain":
            return self._connect_plain(str(command["address"]))
        if action == "prepare":
            round_index, tensor = int(command["round_index"]), str(command["tensor"])
            self.prepared[(round_index, tensor)] = self._mask(round_index, tensor)
            return {"drawn": time.monotonic()}
        if action == "round":
            mask = str(command["mask"])
            if mask not in MASK_MODES:
                raise ValueError(f"mask must be one of {MASK_MODES}; got {mask!r}")
            return self._round(
                transport=str(command["transport"]),
                round_index=int(command["round_index"]),
                round_name=str(command["round_name"]),
                mask=mask,
            )
        raise ValueError(f"unknown command {action!r}")

    def _join(self, address: str) -> dict[str, Any]:
        if self.client is not None:
            self.client.close()
        self.client = GrpcGateway(
            address,
            node_id=self.node_id,
            root_certificate=self.ca,
            certificate_chain=self.certificate,
            private_key=self.key,
            retry=RetryPolicy(total_seconds=_CALL_SECONDS, attempt_timeout=_CALL_SECONDS),
        )
        status = self.client.status("")
        self.session_id = status.session_id
        ephemeral = EphemeralKey.generate()
        bundle = sign_key_bundle(
            self.identity,
            config_hash=self.config_hash,
            session_id=self.session_id,
            node_id=self.node_id,
            public_key=ephemeral.public_bytes(),
        )
        self.client.join(bundle)
        give_up = time.monotonic() + _CALL_SECONDS
        while not (roster := self.client.roster(self.session_id)).final:
            if time.monotonic() > give_up:
                raise TimeoutError(f"the roster of session {self.session_id} never became final")
            time.sleep(self.poll_seconds)
        verified = verify_roster(
            roster,
            node_id=self.node_id,
            own_public_key=ephemeral.public_bytes(),
            session_id=self.session_id,
            config_hash=self.config_hash,
            identity_keys=self.config.identity_keys,
            min_nodes=self.config.min_nodes,
        )
        self.seeds = derive_seeds(
            verified, ephemeral, node_id=self.node_id, config_hash=self.config_hash
        )
        self.design = complete_design(
            verified.node_ids, 1.0, collusion_threshold=self.config.privacy.collusion_threshold
        )
        self.roster_hash = verified.roster_hash
        self.participants = verified.node_ids
        self.ephemeral = ephemeral
        return {"session_id": self.session_id, "nodes": len(verified.node_ids)}

    def _connect_plain(self, address: str) -> dict[str, Any]:
        if self.plain is not None:
            self.plain.close()
        self.plain = plain_channel(
            address,
            root_certificate=self.ca,
            certificate_chain=self.certificate,
            private_key=self.key,
        )
        grpc.channel_ready_future(self.plain).result(timeout=_CALL_SECONDS)
        return {}

    def _mask(self, round_index: int, tensor: str) -> NDArray[np.uint64]:
        if self.design is None:
            raise RuntimeError("a masked round needs a session joined first")
        return pairwise_mask(
            self.design,
            self.node_id,
            self.seeds,
            round_index=round_index,
            tensor=tensor,
            size=self.values.size,
            codec=self.codec,
        )

    def _signed(
        self, round_index: int, kind: str, binding: bytes, bodies: dict[str, bytes]
    ) -> tuple[Sealed, ...]:
        """``bodies`` (recipient -> sealed copy) under this node's one signature, as a node
        sends them."""
        tree = sealed_tree(bodies)
        message = sealed_set_message(
            self.config_hash,
            self.session_id,
            round_index,
            kind=kind,
            binding=binding,
            sender=self.node_id,
            count=tree.count,
            root=tree.root,
        )
        signature = self.identity.sign(message)
        return tuple(Sealed(self.node_id, peer, body, signature) for peer, body in bodies.items())

    def _open_tags(
        self,
        round_index: int,
        survivor_hash: bytes,
        items: Sequence[Sealed],
        survivors: Sequence[str],
    ) -> dict[str, tuple[int, ...]]:
        """The blinded tags every other survivor sealed for this node, opened.

        As a node does, a copy that opens under the pairwise key is taken as its
        sender's without its signature; here every copy must open.
        """
        opened = {
            t.sender: open_tags(
                t.sealed,
                self.seeds[t.sender],
                config_hash=self.config_hash,
                session_id=self.session_id,
                round_index=round_index,
                survivor_hash=survivor_hash,
                sender=t.sender,
                recipient=self.node_id,
            )
            for t in items
            if t.recipient == self.node_id
        }
        if set(opened) != set(survivors) - {self.node_id}:
            raise RuntimeError(f"round {round_index}: tags of {sorted(opened)} only")
        return opened

    def _payload(self, round_index: int, tensor: str, mask: str) -> NDArray[np.uint64]:
        payload = self.codec.encode(self.values, tensor=TENSOR)
        if mask == "in_round":
            payload += self._mask(round_index, tensor)
        elif mask == "ahead":
            prepared = self.prepared.pop((round_index, tensor), None)
            if prepared is None:
                raise RuntimeError(f"no mask was prepared for round {round_index}, {tensor!r}")
            payload += prepared
        return payload

    def _round(
        self, *, transport: str, round_index: int, round_name: str, mask: str
    ) -> dict[str, Any]:
        started = time.monotonic()
        if transport == "session":
            timed = self._session_round(round_index, round_name, mask)
        elif transport == "plain":
            timed = self._plain_round(round_index, mask)
        else:
            raise ValueError(f"unknown transport {transport!r}")
        done = time.monotonic()
        assert timed.aggregate is not None
        return {
            **timed.stamps,
            "started": started,
            "masked": timed.masked,
            "uploaded": timed.uploaded,
            "done": done,
            "polls": timed.polls,
            "sha256": hashlib.sha256(timed.aggregate.tobytes()).hexdigest(),
        }

    def _plain_round(self, round_index: int, mask: str) -> _Timed:
        if self.plain is None:
            raise RuntimeError("connect to the plain server before a plain round")
        payload = self._payload(round_index, PLAIN_TENSOR, mask)
        masked = time.monotonic()
        uploaded, aggregate = plain_round(self.plain, payload, timeout=_CALL_SECONDS)
        return _Timed(masked=masked, uploaded=uploaded, aggregate=aggregate)

    def _session_round(self, round_index: int, round_name: str, mask: str) -> _Timed:
        """Upload, take part in the unmask step, and check the aggregate, as a node does."""
        client = self.client
        if client is None or self.ephemeral is None:
            raise RuntimeError("join a session before a session round")
        sent = self._upload(client, self.ephemeral, round_index, round_name, mask)
        timed = _Timed(masked=sent.masked, uploaded=time.monotonic())
        while True:
            header = client.result(self.session_id, round_index)
            ask = header.unmask_request
            if header.state == RoundState.AWAITING_UNMASK and ask is not None:
                # The unmask step every round has: sign the survivor set once, and
                # reveal the self-mask seed once every survivor has signed it.
                timed.stamps.setdefault("asked", time.monotonic())
                sent.survivor_hash = ask.survivor_hash
                if not sent.attested:
                    self._attest(client, sent, ask, timed.stamps)
                elif len(ask.attestations) == len(ask.survivors):
                    timed.stamps["signed"] = time.monotonic()
                    # Every survivor's tags open before the seed leaves.
                    self._open_tags(round_index, ask.survivor_hash, ask.tags, ask.survivors)
                    client.submit_unmask(ask.answer(self.node_id, sent.seed, None), None)
                    timed.stamps["answered"] = time.monotonic()
            elif header.aggregate is not None:
                timed.stamps["result"] = time.monotonic()
                self._check_aggregate(header, sent, round_name)
                timed.aggregate = header.aggregate
                return timed
            elif header.state == RoundState.FAILED:
                raise RuntimeError(f"round {round_index} failed: {header.reason}")
            elif time.monotonic() - timed.uploaded > _CALL_SECONDS:
                raise TimeoutError(f"round {round_index} was not aggregated in time")
            timed.polls += 1
            time.sleep(self.poll_seconds)

    def _upload(
        self,
        client: GrpcGateway,
        ephemeral: EphemeralKey,
        round_index: int,
        round_name: str,
        mask: str,
    ) -> _Sent:
        """Mask, self-mask, seal the contribution to the check and upload, signed."""
        seed = self_mask_seed(
            ephemeral,
            config_hash=self.config_hash,
            session_id=self.session_id,
            node_id=self.node_id,
            round_index=round_index,
        )
        # The self-mask and the aggregate check are part of the round's cost, as in a node.
        contribution = self._payload(round_index, TENSOR, mask)
        # As a node does (node.session.context.sent_payload): the egress added
        # into the self-mask's own buffer, one vector made, not two.
        payload = self_mask(seed, self.layout, round_index=round_index)
        np.add(payload, contribution, out=payload)
        mine = challenge_contribution(
            ephemeral,
            config_hash=self.config_hash,
            session_id=self.session_id,
            node_id=self.node_id,
            round_index=round_index,
        )
        challenge = self._signed(
            round_index,
            "contribution",
            bytes(32),
            {
                peer: seal_contribution(
                    mine,
                    self.seeds[peer],
                    config_hash=self.config_hash,
                    session_id=self.session_id,
                    round_index=round_index,
                    sender=self.node_id,
                    recipient=peer,
                )
                for peer in self.participants
                if peer != self.node_id
            },
        )
        masked = time.monotonic()
        digest = payload_digest(payload)
        client.upload(
            UploadHeader(
                session_id=self.session_id,
                round_index=round_index,
                round_name=round_name,
                node_id=self.node_id,
                payload=payload_spec(None, self.layout, self.codec.frac_bits, digest=digest),
                roster_hash=self.roster_hash,
                statement_signature=sign_upload_statement(
                    self.identity,
                    config_hash=self.config_hash,
                    session_id=self.session_id,
                    round_index=round_index,
                    round_name=round_name,
                    roster_hash=self.roster_hash,
                    payload_digest=digest,
                ),
                self_mask_commitment=self_mask_commitment(seed),
                challenge=challenge,
            ),
            payload,
        )
        return _Sent(round_index, seed, contribution, mine, digest, masked)

    def _attest(
        self, client: GrpcGateway, sent: _Sent, ask: UnmaskRequest, stamps: dict[str, float]
    ) -> None:
        """As a node does: open the others' contributions, form ρ, seal and sign the
        blinded tags for every other survivor, attest."""
        round_index = sent.round_index
        opened = {
            c.sender: open_contribution(
                c.sealed,
                self.seeds[c.sender],
                config_hash=self.config_hash,
                session_id=self.session_id,
                round_index=round_index,
                sender=c.sender,
                recipient=self.node_id,
            )
            for c in ask.challenge
        }
        key = challenge_key({**opened, self.node_id: sent.mine}, round_index=round_index)
        sent.rho = challenge_vectors(key, self.layout.size, round_index=round_index)
        own = blinded_tags(
            tags(sent.contribution, sent.rho),
            self.node_id,
            ask.survivors,
            self.seeds,
            round_index=round_index,
        )
        sent.own = own
        sealed_tags = self._signed(
            round_index,
            "tags",
            ask.survivor_hash,
            {
                peer: seal_tags(
                    own,
                    self.seeds[peer],
                    config_hash=self.config_hash,
                    session_id=self.session_id,
                    round_index=round_index,
                    survivor_hash=ask.survivor_hash,
                    sender=self.node_id,
                    recipient=peer,
                )
                for peer in ask.survivors
                if peer != self.node_id
            },
        )
        stamps["tagged"] = time.monotonic()
        client.attest(
            Attestation(
                self.node_id,
                ask.survivor_hash,
                attestation_signature(
                    self.identity,
                    config_hash=self.config_hash,
                    session_id=self.session_id,
                    round_index=round_index,
                    survivor_hash=ask.survivor_hash,
                ),
                session_id=self.session_id,
                round_index=round_index,
                tags=sealed_tags,
            )
        )
        sent.attested = True
        stamps["attested"] = time.monotonic()

    def _check_aggregate(self, header: RoundResult, sent: _Sent, round_name: str) -> None:
        """As a node does: every counted upload was signed for this roster, and the sum checks."""
        round_index = sent.round_index
        check_statements(
            header,
            config_hash=self.config_hash,
            session_id=self.session_id,
            round_index=round_index,
            roster_hash=self.roster_hash,
            identity_keys=self.config.identity_keys,
            own_node_id=self.node_id,
            own_digest=sent.digest,
            participants=self.participants,
            round_name=round_name,
        )
        assert sent.own is not None and sent.survivor_hash is not None
        assert header.aggregate is not None
        given = self._open_tags(round_index, sent.survivor_hash, header.tags, header.survivors)
        given[self.node_id] = sent.own
        if sent.rho is None or check_tags(given, header.aggregate, sent.rho):
            raise RuntimeError(f"round {round_index}: the aggregate check failed")


@dataclass
class _Sent:
    """What this node sent in a session round, and what it formed for the aggregate check."""

    round_index: int
    seed: bytes
    contribution: NDArray[np.uint64]
    mine: bytes
    digest: bytes
    masked: float
    attested: bool = False
    rho: NDArray[np.uint64] | None = None
    own: tuple[int, ...] | None = None
    survivor_hash: bytes | None = None


@dataclass
class _Timed:
    """A round's times (monotonic seconds), its polls, and the aggregate it ended with."""

    masked: float
    uploaded: float
    aggregate: NDArray[np.uint64] | None = None
    polls: int = 0
    stamps: dict[str, float] = field(default_factory=dict)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._session_worker")
    parser.add_argument("--federation", type=Path, required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--poll-seconds", type=float, default=POLL_SECONDS)
    args = parser.parse_args(argv)
    node = _Node(args.federation, args.node_id, args.index, args.size, args.poll_seconds)
    try:
        print(json.dumps({"ready": args.node_id}), flush=True)
        while line := sys.stdin.readline():
            command = json.loads(line)
            if command.get("cmd") == "quit":
                break
            try:
                answer = node.handle(command)
            except Exception as error:  # reported to the parent, which aborts the run
                answer = {"error": f"node {args.node_id}: {type(error).__name__}: {error}"}
            print(json.dumps(answer), flush=True)
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
