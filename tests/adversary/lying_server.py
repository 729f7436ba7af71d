"""A coordinator that lies: the Coordinator service, honest but for one scripted lie.

The threat model (docs/design.md §5) lets the coordinator be malicious. To test
that, :class:`LyingCoordinator` implements the Coordinator service of
proto/zerosum/v1/session.proto itself (on the wire with mutual TLS and the
federation's own coordinator key: tests/adversary/serving.py) and holds only
what a coordinator holds: the federation config, its TLS key and whatever
nodes send it. It runs a session the way coordinator/session.py does — joins
until every node joined, rounds in the plan's order (under CAPE each preceded
by its "cape-sum/<name>" round), an unmask step in every round, the aggregate
Σ_S (y_k − b_k) − Σ_S corrections published with every counted upload
statement (Bonawitz et al. 2017, ACM CCS, §4) — except where a
:class:`~tests.adversary.records.Script` overrides one of its choices:

* ``roster``: the roster shown to a caller (key substitution, replayed
  bundles, an altered roster hash);
* ``shown``: the survivor set S and dropped set D shown to a caller in a
  round's unmask step (false dropouts, split survivor sets, a second request
  for the same round index);
* ``attestations``: which attestations it relays with that request;
* ``publish``: whether to publish a round every survivor answered (or, say,
  :meth:`LyingCoordinator.supersede` it and rerun it).

It reuses the coordinator's pure pieces only (``noise.transcript`` digests,
``noise.self_mask`` to subtract a revealed self-mask, ``proto.chunks`` for
payload headers and chunks, ``coordinator.config`` for the round plan), never
node code. Everything received is kept in memory (:attr:`LyingCoordinator.rounds`,
tests/adversary/records.py) so that a test can reconstruct what a coordinator
could learn from it.

Deadlines are announced but never enforced, withdrawals are refused, and a
refusal does not end the session (the real coordinator fails it): a lying
coordinator goes on collecting whatever the other nodes still send, and the
test ends the session with :meth:`LyingCoordinator.abort` once it has seen what
it waits for.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from numpy.typing import NDArray

from coordinator.config import SessionConfig
from noise.errors import KeyFormatError, SignatureError
from noise.keys import KeyBundle, verify_key_bundle
from noise.self_mask import self_mask, self_mask_commitment
from noise.transcript import (
    roster_hash,
    survivor_attestation_message,
    survivor_set_hash,
    upload_statement_message,
)
from proto.chunks import PayloadAssembler, PayloadError, payload_header
from proto.federation import FederationConfig, config_hash
from proto.zerosum.v1 import session_pb2 as pb
from tests.adversary.records import (
    FAILED,
    OPEN,
    READY,
    UNMASK,
    Answer,
    RoundRecord,
    Script,
    Shown,
    Upload,
)

__all__ = [
    "UNMASK",
    "Answer",
    "LyingCoordinator",
    "Refused",
    "RoundRecord",
    "Script",
    "Shown",
    "Upload",
]

U64 = NDArray[np.uint64]

_ROUND_STATUS = {
    OPEN: pb.ROUND_STATUS_OPEN,
    UNMASK: pb.ROUND_STATUS_AWAITING_UNMASK,
    READY: pb.ROUND_STATUS_READY,
    FAILED: pb.ROUND_STATUS_FAILED,
}
JOINING, RUNNING, COMPLETED, ABORTED = "joining", "running", "completed", "aborted"
_SESSION_STATE = {
    JOINING: pb.SESSION_STATE_JOINING,
    RUNNING: pb.SESSION_STATE_RUNNING,
    COMPLETED: pb.SESSION_STATE_COMPLETED,
    ABORTED: pb.SESSION_STATE_ABORTED,
}


def _now_ms() -> int:
    return int(time.time() * 1000)


class Refused(Exception):
    """A message the server refuses, as a gRPC status code and a sentence."""

    def __init__(self, code: grpc.StatusCode, sentence: str) -> None:
        super().__init__(sentence)
        self.code = code
        self.sentence = sentence


class LyingCoordinator:
    """The state of one federation's sessions, driven by the Coordinator RPCs below."""

    def __init__(self, federation: FederationConfig, script: Script | None = None) -> None:
        self.federation = federation
        self.config_hash = config_hash(federation)
        self.plan = SessionConfig.from_federation(federation, self.config_hash)
        self.identity_keys = dict(federation.identity_keys)
        self.node_ids = tuple(sorted(federation.node_ids))
        self.script = script or Script()
        self.lock = threading.RLock()
        # (session id, bundles by node) of every earlier session of this server.
        self.earlier: list[tuple[str, dict[str, pb.KeyBundle]]] = []
        self.earlier_rounds: list[list[RoundRecord]] = []
        self._fresh_session()

    def _fresh_session(self) -> None:
        self.session_id = secrets.token_hex(16)
        self.state = JOINING
        self.reason = ""
        # As the real coordinator, an ended session's roster is final (a node
        # waiting for it then learns it has too few members).
        self.roster_closed = False
        self.bundles: dict[str, pb.KeyBundle] = {}
        self.rounds: list[RoundRecord] = []
        self.join_started_ms = _now_ms()

    # ------------------------------------------------------------ for tests

    def new_session(self, session_id: str | None = None) -> None:
        """Start another session, keeping the earlier one's bundles and records.

        ``session_id``: the new session's id (default: a fresh one); an
        earlier id replays that session.
        """
        with self.lock:
            self.earlier.append((self.session_id, dict(self.bundles)))
            self.earlier_rounds.append(self.rounds)
            self._fresh_session()
            if session_id is not None:
                self.session_id = session_id

    def abort(self, reason: str) -> None:
        """End the session: every round not ready fails with ``reason``; the roster is final."""
        with self.lock:
            if self.state in (COMPLETED, ABORTED):
                return
            self.state, self.reason = ABORTED, reason
            self.roster_closed = True
            for record in self.rounds:
                if record.status != READY:
                    record.status, record.reason = FAILED, reason

    def round(self, index: int) -> RoundRecord | None:
        with self.lock:
            return self.rounds[index] if index < len(self.rounds) else None

    def honest_roster(self) -> pb.Roster:
        """The roster built from the joins, with its roster hash."""
        bundles = [self.bundles[n] for n in sorted(self.bundles)]
        final = self.roster_closed or len(bundles) == len(self.node_ids)
        return pb.Roster(
            session_id=self.session_id,
            config_hash=self.config_hash,
            bundles=bundles,
            version=len(bundles),
            roster_hash=roster_hash(self.config_hash, self.session_id, bundles),
            final=final,
            join_deadline_unix_ms=self.join_started_ms
            + int(self.federation.session.join_deadline_seconds * 1000),
            round_deadline_seconds=self.federation.session.round_deadline_seconds,
        )

    # ------------------------------------------------------------ the session

    def _deadline(self, record: RoundRecord) -> int:
        return record.opened_ms + int(self.federation.session.round_deadline_seconds * 1000)

    def _open(self, name: str, participants: tuple[str, ...]) -> None:
        self.rounds.append(
            RoundRecord(
                index=len(self.rounds),
                name=name,
                participants=participants,
                layout=self.plan.layout(name),
                opened_ms=_now_ms(),
            )
        )

    def _record(self, session_id: str, index: int) -> RoundRecord:
        if session_id != self.session_id:
            raise Refused(
                grpc.StatusCode.NOT_FOUND,
                f"session {session_id!r} is not the current session {self.session_id!r}.",
            )
        if index >= len(self.rounds):
            raise Refused(grpc.StatusCode.NOT_FOUND, f"round {index} has not opened.")
        return self.rounds[index]

    def view(self, record: RoundRecord, caller: str) -> Shown:
        """What the script would show ``caller`` now."""
        survivors, dropped = self.script.shown(self, record, caller)
        s, d = tuple(sorted(survivors)), tuple(sorted(dropped))
        return Shown(s, d, survivor_set_hash(self.config_hash, self.session_id, record.index, s, d))

    def shown_to(self, record: RoundRecord, caller: str) -> Shown:
        """What the script shows ``caller`` now; remembered in ``record.shown``."""
        shown = self.view(record, caller)
        seen = record.shown.setdefault(caller, [])
        if not seen or seen[-1] != shown:
            seen.append(shown)
        return shown

    def _maybe_publish(self, record: RoundRecord) -> None:
        """Publish a set (S, D) once every member of S was shown it and answered it.

        An honest coordinator shows every participant the same set; with a lie
        the script decides whether a set some participants were not shown is
        published (``Script.publish``, ``unanimous`` False).
        """
        views = {self.view(record, n) for n in record.participants}
        for view in sorted(views, key=lambda v: v.survivor_hash):
            answered = {
                n
                for n, a in record.answers.items()
                if a.header.survivor_hash == view.survivor_hash and self.view(record, n) == view
            }
            if set(view.survivors) <= answered:
                break
        else:
            return
        if not self.script.publish(self, record, view, unanimous=len(views) == 1):
            return
        total = np.zeros(record.layout.size, dtype=np.uint64)
        for node in view.survivors:
            upload, answer = record.uploads[node], record.answers[node]
            seed = bytes(answer.header.self_mask_seed)
            total += upload.words - self_mask(seed, record.layout, round_index=record.index)
            if answer.corrections is not None:
                total -= answer.corrections
        self._ready(record, view, total)

    def _ready(self, record: RoundRecord, view: Shown, aggregate: U64) -> None:
        """Publish ``aggregate`` as the sum over ``view``'s survivors; open the next round."""
        record.aggregate, record.result, record.status = aggregate.copy(), view, READY
        following = self.plan.next_round_name(record.name)
        if following is None:
            self.state = COMPLETED
        else:
            self._open(following, view.survivors)

    def publish_forged(self, record: RoundRecord, aggregate: U64) -> None:
        """Publish ``aggregate`` as the sum over every participant, whatever was answered."""
        with self.lock:
            view = Shown(
                record.participants,
                (),
                survivor_set_hash(
                    self.config_hash, self.session_id, record.index, record.participants, ()
                ),
            )
            self._ready(record, view, aggregate)

    def supersede(
        self, record: RoundRecord, reason: str, *, participants: tuple[str, ...] | None = None
    ) -> None:
        """Mark ``record`` superseded and open its rerun under the next index.

        As the real coordinator does after a stalled unmask or a named
        survivor: the round again (under CAPE, for a model round, its CAPE sum
        first) among ``participants`` (default: the same nodes).
        """
        record.status, record.reason = FAILED, reason
        if participants is not None:
            record.excluded = tuple(n for n in record.participants if n not in participants)
        cape_model = self.plan.construction == "cape" and not record.name.startswith("cape-sum/")
        rerun = self.plan.next_round_name(record.name, superseded=True) if cape_model else None
        self._open(
            rerun or record.name, record.participants if participants is None else participants
        )

    # ------------------------------------------------------------ the RPCs' logic

    def join(self, caller: str, request: pb.JoinRequest) -> pb.JoinResponse:
        b = request.bundle
        if b.node_id != caller:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate names node {caller!r}, the bundle {b.node_id!r}.",
            )
        try:
            verify_key_bundle(
                KeyBundle(
                    config_hash=bytes(b.config_hash),
                    session_id=b.session_id,
                    node_id=b.node_id,
                    public_key=bytes(b.public_key),
                    signature=bytes(b.signature),
                ),
                self.identity_keys[caller],
                config_hash=self.config_hash,
                session_id=self.session_id,
                node_id=caller,
            )
        except (SignatureError, KeyFormatError) as error:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, str(error)) from None
        earlier = self.bundles.get(caller)
        if earlier is not None and earlier.public_key != b.public_key:
            raise Refused(
                grpc.StatusCode.ALREADY_EXISTS, f"node {caller!r} joined with another key."
            )
        self.bundles[caller] = pb.KeyBundle()
        self.bundles[caller].CopyFrom(b)
        if self.state == JOINING and len(self.bundles) == len(self.node_ids):
            self.state = RUNNING
            self._open(self.plan.plan()[0], self.node_ids)
        return pb.JoinResponse(
            session_id=self.session_id,
            node_id=caller,
            rejoined=earlier is not None,
            joined_count=len(self.bundles),
            federation_size=len(self.node_ids),
            join_deadline_unix_ms=self.join_started_ms
            + int(self.federation.session.join_deadline_seconds * 1000),
        )

    def roster(self, caller: str, request: pb.GetRosterRequest) -> pb.Roster:
        honest = self.honest_roster()
        if not honest.final:
            return honest
        return self.script.roster(self, caller, honest)

    def status(self, caller: str) -> pb.SessionStatus:
        summaries = []
        for r in self.rounds:
            seen = r.shown.get(caller)
            summaries.append(
                pb.RoundSummary(
                    round_index=r.index,
                    round_name=r.name,
                    status=_ROUND_STATUS[r.status],
                    submitted_node_ids=sorted(r.uploads),
                    dropped_node_ids=sorted({*(seen[-1].dropped if seen else ()), *r.excluded}),
                    deadline_unix_ms=self._deadline(r),
                    reason=r.reason,
                )
            )
        current = self.rounds[-1] if self.rounds else None
        return pb.SessionStatus(
            session_id=self.session_id,
            state=_SESSION_STATE[self.state],
            config_hash=self.config_hash,
            federation_id=self.federation.federation_id,
            current_round_index=current.index if current else 0,
            current_round_name=current.name if current else "",
            joined_node_ids=sorted(self.bundles),
            submitted_node_ids=sorted(current.uploads) if current else [],
            reason=self.reason,
            min_nodes=self.federation.min_nodes,
            rounds=summaries,
        )

    def upload(
        self, caller: str, header: pb.UploadHeader, chunks: Iterator[pb.UploadChunk]
    ) -> pb.UploadReceipt:
        record = self._record(header.session_id, header.round_index)
        if header.node_id != caller or caller not in record.participants:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED, f"node {caller!r} may not upload here."
            )
        held = record.uploads.get(caller)
        resent = held is not None and held.header.payload.digest == header.payload.digest
        if (record.status != OPEN and not resent) or header.round_name != record.name:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"round {record.index} ({record.name!r}) takes no upload "
                f"named {header.round_name!r}.",
            )
        try:
            assembler = PayloadAssembler(header.payload, layout=record.layout)
            for chunk in chunks:
                assembler.add(chunk.data)
            words = assembler.finish().copy()
        except PayloadError as error:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from None
        statement = upload_statement_message(
            self.config_hash,
            self.session_id,
            record.index,
            record.name,
            roster_hash=bytes(header.roster_hash),
            payload_digest=bytes(header.payload.digest),
        )
        if not _verifies(self.identity_keys[caller], bytes(header.statement_signature), statement):
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, "the upload statement does not verify.")
        with self.lock:
            earlier = record.uploads.get(caller)
            duplicate = earlier is not None
            if earlier is not None and earlier.header.payload.digest != header.payload.digest:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"node {caller!r} already uploaded another payload for round {record.index}.",
                )
            if earlier is None:
                record.uploads[caller] = Upload(caller, header, words)
            if set(record.uploads) == set(record.participants) and record.status == OPEN:
                record.status = UNMASK
            return pb.UploadReceipt(
                session_id=self.session_id,
                round_index=record.index,
                node_id=caller,
                digest=bytes(header.payload.digest),
                received_bytes=int(header.payload.total_bytes),
                duplicate=duplicate,
                received_unix_ms=_now_ms(),
                submitted_count=len(record.uploads),
                expected_count=len(record.participants),
            )

    def unmask_request(self, record: RoundRecord, caller: str) -> pb.UnmaskRequest:
        shown = self.shown_to(record, caller)
        answered = record.answers.get(caller)
        pending = caller not in record.refusals and (
            answered is None or answered.header.survivor_hash != shown.survivor_hash
        )
        ask = pb.UnmaskRequest(
            session_id=self.session_id,
            round_index=record.index,
            round_name=record.name,
            pending=pending,
            dropped_node_ids=list(shown.dropped),
            survivor_node_ids=list(shown.survivors),
            survivor_hash=shown.survivor_hash,
            attestations=self.script.attestations(self, record, caller, shown),
            tensors=[
                pb.TensorLayout(name=s.name, shape=list(s.shape), offset=s.offset, size=s.size)
                for s in record.layout
            ],
            fixed_point_bits=self.federation.fixed_point_bits,
            deadline_unix_ms=self._deadline(record),
            min_survivors=self.federation.min_nodes,
        )
        ask.challenge.extend(self.script.contributions(self, record, caller, shown))
        ask.sealed_tags.extend(self.script.tags(self, record, caller, shown.survivor_hash))
        return ask

    def result(
        self, caller: str, request: pb.GetResultRequest
    ) -> tuple[pb.ResultHeader, U64 | None]:
        record = self._record(request.session_id, request.round_index)
        header = pb.ResultHeader(
            session_id=self.session_id,
            round_index=record.index,
            round_name=record.name,
            status=_ROUND_STATUS[record.status],
            reason=record.reason,
            deadline_unix_ms=self._deadline(record),
        )
        if record.status == UNMASK:
            record.polls[caller] += 1
            ask = self.unmask_request(record, caller)
            header.survivor_node_ids.extend(ask.survivor_node_ids)
            header.dropped_node_ids.extend(ask.dropped_node_ids)
            header.survivor_hash = ask.survivor_hash
            header.unmask_request.CopyFrom(ask)
        if record.status == READY and record.aggregate is not None and record.result is not None:
            header.survivor_node_ids.extend(record.result.survivors)
            header.dropped_node_ids.extend(record.result.dropped)
            header.survivor_hash = record.result.survivor_hash
            header.payload.CopyFrom(
                payload_header(record.aggregate, record.layout, self.federation.fixed_point_bits)
            )
            for node in record.result.survivors:
                h = record.uploads[node].header
                header.statements.append(
                    pb.UploadStatement(
                        node_id=node,
                        round_name=h.round_name,
                        roster_hash=h.roster_hash,
                        payload_digest=h.payload.digest,
                        signature=h.statement_signature,
                    )
                )
            header.sealed_tags.extend(
                self.script.tags(self, record, caller, record.result.survivor_hash)
            )
            return header, record.aggregate.copy()
        return header, None

    def attest(self, caller: str, request: pb.SurvivorAttestation) -> pb.AttestationReceipt:
        record = self._record(request.session_id, request.round_index)
        if request.node_id != caller or record.status != UNMASK:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "no attestation is due here.")
        message = survivor_attestation_message(
            self.config_hash, self.session_id, record.index, bytes(request.survivor_hash)
        )
        if not _verifies(self.identity_keys[caller], bytes(request.signature), message):
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, "the attestation does not verify.")
        kept = pb.SurvivorAttestation()
        kept.CopyFrom(request)
        by_node = record.attestations.setdefault(bytes(request.survivor_hash), {})
        by_node[caller] = kept
        shown = self.shown_to(record, caller)
        return pb.AttestationReceipt(
            attested_count=len(by_node), survivor_count=len(shown.survivors)
        )

    def refuse(self, caller: str, refusal: pb.UnmaskRefusal) -> pb.UnmaskReceipt:
        record = self._record(refusal.session_id, refusal.round_index)
        with self.lock:
            record.refusals[caller] = refusal.reason
            self.script.refused(self, record, refusal)
        return pb.UnmaskReceipt(
            session_id=self.session_id,
            round_index=record.index,
            node_id=caller,
            accepted=False,
        )

    def answer(
        self, caller: str, header: pb.UnmaskHeader, chunks: Iterator[pb.UnmaskChunk]
    ) -> pb.UnmaskReceipt:
        record = self._record(header.session_id, header.round_index)
        if header.node_id != caller or record.status != UNMASK or caller not in record.uploads:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "no unmask answer is due here.")
        seed = bytes(header.self_mask_seed)
        commitment = bytes(record.uploads[caller].header.self_mask_commitment)
        if len(seed) != 32 or self_mask_commitment(seed) != commitment:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the self-mask seed of node {caller!r} does not match its commitment.",
            )
        corrections = None
        if header.HasField("payload"):
            try:
                assembler = PayloadAssembler(header.payload, layout=record.layout)
                for message in chunks:
                    assembler.add(message.data)
                corrections = assembler.finish().copy()
            except PayloadError as error:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from None
        with self.lock:
            record.answers[caller] = Answer(caller, header, corrections)
            # The answering node waits for this receipt: whatever the script
            # reads of it now, the node wrote before its answer left.
            self.script.answered(self, record, record.answers[caller])
            self._maybe_publish(record)
            return pb.UnmaskReceipt(
                session_id=self.session_id,
                round_index=record.index,
                node_id=caller,
                accepted=True,
                received_count=len(record.answers),
                survivor_count=len(record.participants),
            )


# The aggregate check (docs/design.md §4.5): each upload carries challenge
# contributions sealed and signed for the other participants, each attestation
# the node's tags sealed and signed for the other survivors; the server relays
# to each survivor those sealed for it (Script.contributions, Script.tags).


def _verifies(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
