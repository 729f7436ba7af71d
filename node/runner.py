"""NodeRunner: one TRE node's whole session, from local data to the global model.

Steps (DESIGN.md §4, §6):

1. **Prepare, before any contact**: load the federation config, the node's
   Ed25519 identity key and TLS files, and the local cohort; bad local data
   stops here (:class:`~node.cohort.LocalDataError`).
2. **Join**: learn the session id from the coordinator, make a fresh X25519
   key for this session only, save it in OUT (node/session_state.py) before
   anything is sent, sign it with the identity key over (config hash,
   session id, node id, key) and post it.
3. **Roster**: wait until the roster is final, verify every bundle against the
   pinned identities (abort naming the node and the reason), and derive the
   pairwise seeds.
4. **Rounds**, as the coordinator opens them (it names each round and its
   index; under CAPE a dropout makes it rerun a CAPE sum and its model round):
   compute the round's tensors with the deltab plan (values clipped to the
   public bounds, clipped counts kept in the audit folder), encode them in
   fixed point, add the zero-sum mask (pairwise, or CAPE's e_k) and residual
   noise when the policy enables it, check the ε budget, write the egress
   bundle and the audit record, wait for approval, record the release in the
   ledger, upload, and poll for the result — answering or refusing unmask
   requests on the way (node/unmask.py). The decoded aggregate feeds the
   next round.
5. **Finish**: ``OUT/model.json`` (the global model), ``OUT/predictions.csv``
   (id, age, brain_age, delta for this node's own subjects) and the ledger
   ``OUT/ledger.json``, kept up to date throughout.

A CAPE secure-sum upload carries no data (a private Gaussian draw under a
one-time pad of uniform pairwise masks); it is not an egress for review, but
its digest is noted in ``OUT/egress/round-<r>/cape-sum.json``. A CAPE rerun
reuses the node's draws and residual noise, so the coordinator, which sees
both attempts, learns nothing new; the ledger still counts the rerun as a
release (an over-count, never an under-count). Keeping τ² among fewer nodes
lowers every egress's noise, so a rerun is released only while it keeps the
floor (``node.release.cape_floor_shortfall``).

Unmask answers for one round are tracked together (``node.unmask``): a node
answers only for the round it awaits, its dropped sets may only grow, and it
never answers a request that drops a survivor of an attempt it already
answered, since the difference of two answers would isolate its pair terms
with that node.

**Restart.** Run again after a crash, a node finds the key it saved for the
coordinator's current session and rejoins with it: the same key signed again
gives the same bundle (X25519 and Ed25519 are deterministic), so the
coordinator answers ``rejoined`` and the pairwise seeds are those of before.
The node then catches up. Every round already aggregated is fed to the plan
from its published result (no new egress, no new ledger entry). For the
current round, an egress bundle written before the crash is never recomputed
— its residual noise came from the OS CSPRNG, so a recomputation would be a
second, different release of the same data — but verified and resubmitted
as it is (the coordinator takes the same bytes again as a duplicate), after
the approval gate if the reviewer had not yet signed it; the ledger's
release entry is written once. What the node's unmask answers revealed is
read back from the ledger's unmask entries (written before each answer
leaves), so the "dropped sets only grow, answered survivors never dropped"
rules of node/unmask.py hold across the restart; a node that refused an
unmask request stopped there, and so does its restart. Only one process at
a time runs a node on OUT (``OUT/node.lock``).

Under CAPE the node's private material — its draws q(ê_k), its residual
noise, the planned participants and the secure sum S with the nodes it
covered — is saved per model round in ``OUT/audit/cape-<round>/``
(node/cape_state.py), each piece before anything derived from it leaves: the
draws before the CAPE-sum share is uploaded, S on receipt, the residual before
the egress bundle is written. A restarted node loads it back: a CAPE-sum round
already aggregated sets S and its participants from the published result, as
the live path does; a share of the current CAPE-sum round is recomputed from
the saved draws and the deterministic pads and must match the digest noted in
``OUT/egress/round-<r>/cape-sum.json`` before it is sent again; a model-round
bundle written before the crash must equal clean + e_k + residual rebuilt from
the saved material before it is resubmitted; a rerun reuses the saved draws
and residual. When the material of a round the node already sent is missing or
damaged it stops (it never draws afresh: its shares would no longer match what
it sent); the coordinator drops it at the round deadline and reruns the round
among the others. The material is deleted with the session key when the
session completes.

**Withdrawal.** A node that stops on purpose before uploading the current
round tells the coordinator at once (``Withdraw``), so the other TREs need
not wait for the round deadline: the coordinator drops it as the deadline
would have. Only deliberate refusals withdraw, those a restart would repeat:
:class:`NodeRefused` (the ε budget or the noise floor would be broken),
:class:`~noise.errors.InfeasibleDesignError` (no pair weights keep this
node's noise floor among the round's participants) and
:class:`~node.approval.ApprovalRejected` (the output checker signed a
rejection of this exact bundle, which a restarted node finds again). A crash,
kill, SIGTERM, Ctrl-C, an unreachable coordinator or a local fault the
operator can repair (a damaged bundle folder) never withdraws: the node may be
run again and resume the round before its deadline, and a withdrawn node
cannot come back into the session. The reason sent is a sentence without
data; a reviewer's comment stays in the TRE. Withdrawing is best effort (the
node is stopping anyway): an error is printed, never raised, and an upload
already made is never withdrawn (the coordinator would refuse it).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NoReturn

import grpc
import numpy as np
from numpy.typing import NDArray

from node import plan_bridge
from node.approval import ApprovalGate, ApprovalRejected, read_approval, verify_approval
from node.atomic import atomic_write_json, atomic_write_text
from node.audit import AUDIT, AuditRecord, audit_folder, write_audit
from node.cape_state import CapeMaterial, CapeStateError, CapeStore, CapeSum
from node.client import CoordinatorClient, CoordinatorError, RetryPolicy
from node.cohort import LocalCohort, load_cohort
from node.egress import (
    MANIFEST,
    EgressBundle,
    EgressIntegrityError,
    egress_folder,
)
from node.ledger import PrivacyLedger
from node.masking import (
    MaskPrefetch,
    add_residual_noise,
    cape_draws,
    cape_masks,
    cape_sum_payload,
    unmask_corrections,
)
from node.preflight import check_stream
from node.receipt import SDCEvidence
from node.release import (
    ReleaseNoise,
    cape_floor_shortfall,
    plan_release,
    with_cape_participants,
)
from node.roster import RosterError, VerifiedRoster, derive_seeds, verify_roster
from node.session_state import SessionStateError, SessionStore
from node.statements import StatementError, check_statements, sign_upload_statement
from node.unmask import (
    RevealedTerms,
    UnmaskAsk,
    attestation_signature,
    check_against_revealed,
    check_attestations,
    check_request,
)
from noise.errors import InfeasibleDesignError, NoiseError
from noise.fixed_point import FixedPointCodec
from noise.keys import EphemeralKey, IdentityKey, sign_key_bundle
from noise.layout import Layout, payload_digest
from noise.masks import cape_blinding
from noise.stream import os_generator
from proto.federation import FederationConfig, config_hash, load_federation
from proto.zerosum.v1 import session_pb2 as pb

__all__ = ["NodeOptions", "NodeRefused", "NodeRunner", "RunOutcome", "SessionFailed"]

CAPE_SUM_PREFIX = "cape-sum/"
CAPE_SUM_NOTE = "cape-sum.json"  # OUT/egress/round-<r>/: the digest of a CAPE-sum share sent
# How often to ask the coordinator about the session while awaiting approval.
_WATCH_SECONDS = 2.0
U64 = NDArray[np.uint64]


class SessionFailed(Exception):
    """The session could not be completed; the message says why (exit status 1)."""


class NodeRefused(SessionFailed):
    """This node refused to go on (rejected egress, unmask refusal, budget); says why."""


@dataclass(frozen=True)
class NodeOptions:
    """How the runner behaves; the defaults suit a real deployment."""

    approve: Literal["auto", "manual"] = "auto"
    poll_seconds: float = 0.2
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    approval_timeout: float | None = None
    address: str | None = None  # overrides the config's coordinator address
    rng: np.random.Generator | None = None  # residual noise and CAPE draws (tests only)


@dataclass(frozen=True)
class RunOutcome:
    """Where the results of a completed session were written."""

    session_id: str
    model: Path
    predictions: Path
    ledger: Path


@dataclass
class _CapeState:
    """A model round's CAPE material, kept across a rerun."""

    noise: ReleaseNoise
    draws: U64
    residual: U64 | None = None
    participants: tuple[str, ...] = ()
    total: U64 | None = None
    planned: tuple[str, ...] = ()  # the roster τ² was planned for
    sum_index: int | None = None  # the CAPE-sum round whose result ``total`` is

    def floor_shortfall(self, noise: ReleaseNoise, threshold: int) -> str | None:
        """The floor check of a CAPE round with ``noise`` (see cape_floor_shortfall)."""
        dropped = len(self.planned) - len(noise.unit.design.node_ids)
        return cape_floor_shortfall(noise, threshold, dropped)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _names(nodes: Sequence[str]) -> str:
    return "{" + ", ".join(sorted(nodes)) + "}"


class NodeRunner:
    """Runs one node of a federation session (see the module docstring)."""

    def __init__(
        self,
        federation: Path,
        node_id: str,
        *,
        data: Path | None = None,
        out: Path | None = None,
        options: NodeOptions | None = None,
        progress: Callable[[str], None] = _stderr,
    ) -> None:
        federation = Path(federation)
        self.config_path = federation / "federation.toml" if federation.is_dir() else federation
        self.node_id = node_id
        self._data = data
        self._out = out
        self.options = options or NodeOptions()
        self._progress = progress
        self.config: FederationConfig | None = None

    # ------------------------------------------------------------ preparation

    def say(self, message: str) -> None:
        self._progress(f"zerosum node {self.node_id}: {message}")

    def prepare(self) -> None:
        """Load and check everything local; raises before any network contact.

        ConfigError / FileNotFoundError / KeyFormatError for the federation
        files, LocalDataError for the cohort.
        """
        config = load_federation(self.config_path)
        config.node(self.node_id)  # KeyError naming the federation when unknown
        # Masks cancel only if every node draws the same streams from the same keys.
        check_stream(config)
        if config.stream_check is None:
            self.say(
                f"{self.config_path} pins no stream_check, so this node cannot confirm that it "
                "draws the same Gaussian streams as the other nodes (masks drawn differently do "
                "not cancel); `zerosum federation init` pins one"
            )
        base = config.base_dir or self.config_path.parent
        node_dir = base / "nodes" / self.node_id
        self.config = config
        self.config_hash = config_hash(config)
        self.codec = FixedPointCodec(config.fixed_point_bits)
        self.data_path = Path(self._data) if self._data is not None else node_dir / "data.csv"
        self.out = Path(self._out) if self._out is not None else node_dir / "out"
        self.identity = IdentityKey.read_pem(node_dir / "identity.pem")
        if self.identity.public_bytes() != config.node(self.node_id).identity_public_key:
            raise SessionFailed(
                f"{node_dir / 'identity.pem'} is not the identity key pinned for node "
                f"{self.node_id!r} in {self.config_path}"
            )
        self.tls = (base / config.ca_certificate, node_dir / "client.pem", node_dir / "client.key")
        for path in self.tls:
            if not path.exists():
                raise FileNotFoundError(f"{path} does not exist")
        self.cohort: LocalCohort = load_cohort(self.data_path, config)
        self.plan = plan_bridge.ModelPlan(config, self.cohort)
        self.say(
            f"{self.cohort.n_subjects} subjects with {len(self.cohort.feature_names)} features "
            f"from {self.data_path}"
        )

    # ------------------------------------------------------------ the session

    def run(self) -> RunOutcome:
        """Prepare (if not done), take part in the session, write the results."""
        if self.config is None:
            self.prepare()
        assert self.config is not None
        address = self.options.address or self.config.coordinator_address
        ca, cert, key = self.tls
        client = CoordinatorClient.from_files(
            address,
            node_id=self.node_id,
            ca_certificate=ca,
            client_certificate=cert,
            client_key=key,
            retry=self.options.retry,
        )
        # The round in progress whose upload has not been made (see _withdraw).
        self._unsent_round: int | None = None
        try:
            with client, self._hold_output():
                self.client = client
                self._join()
                self._fetch_roster()
                try:
                    if not self.resuming:
                        self._prefetch(0, self.roster.node_ids)
                    self._run_rounds()
                except (NodeRefused, InfeasibleDesignError, ApprovalRejected) as error:
                    self._withdraw(error)
                    raise
                finally:
                    self._masks.close()
                return self._finish()
        except CoordinatorError as error:
            raise SessionFailed(f"the coordinator refused a request: {error}") from None

    def _withdraw(self, error: Exception) -> None:
        """Best effort: tell the coordinator this node stops before uploading its current round."""
        index = self._unsent_round
        if index is None:
            return
        if isinstance(error, ApprovalRejected):
            # Only the decision leaves the TRE: the reviewer's comment may speak of the data.
            reason = "the TRE's output checker rejected this node's egress"
        else:
            reason = str(error)
        reason = reason[:1000]  # the coordinator's bound on WithdrawRequest.reason
        try:
            receipt = self.client.withdraw(self.session_id, index, reason)
        except CoordinatorError as failure:
            self.say(
                f"could not withdraw from round {index} ({failure}); the coordinator will drop "
                "this node at the round deadline"
            )
            return
        self.say(
            f"withdrew from round {index}: {reason} (dropped from the round: "
            f"{_names(receipt.dropped_node_ids)})"
        )

    @contextmanager
    def _hold_output(self) -> Iterator[None]:
        """This process's exclusive hold on OUT for the session (``SessionStore.exclusive``).

        Taken before the saved key is read: a second process on the same
        folder would replace the key, release the round again with other
        residual noise and lose ledger entries.
        """
        try:
            with SessionStore(self.out).exclusive():
                yield
        except SessionStateError as error:
            raise SessionFailed(str(error)) from None

    def _sleep(self) -> None:
        time.sleep(self.options.poll_seconds)

    def _join(self) -> None:
        assert self.config is not None
        status = self.client.get_status("")
        if status.config_hash and bytes(status.config_hash) != self.config_hash:
            raise SessionFailed(
                "the coordinator runs a different federation configuration (config hash "
                f"{bytes(status.config_hash).hex()[:16]}…, mine {self.config_hash.hex()[:16]}…)"
            )
        self.session_id = status.session_id
        self.sessions = SessionStore(self.out)
        try:
            saved = self.sessions.resume(
                session_id=self.session_id, node_id=self.node_id, config_hash=self.config_hash
            )
        except SessionStateError as error:
            raise SessionFailed(str(error)) from None
        if saved is None:
            # A key of an earlier session (or one orphaned by a crash before
            # its record was written) is of no use any more, nor is its CAPE material.
            self.sessions.discard_key()
            CapeStore(self.out).discard()
        # With its key saved, a node that crashed in the last round may still
        # collect the final result while the coordinator lingers after the end.
        ended = status.state == pb.SESSION_STATE_ABORTED or (
            status.state == pb.SESSION_STATE_COMPLETED and saved is None
        )
        if ended:
            self.sessions.discard_key()
            CapeStore(self.out).discard()
            why = status.reason or "completed"
            raise SessionFailed(f"session {status.session_id} has already ended ({why})")
        self.resuming = saved is not None
        self._prepare_output()
        self.ledger = PrivacyLedger.open(
            self.out / "ledger.json", self.node_id, self.config.privacy.delta
        )
        if saved is None:
            self.ephemeral = EphemeralKey.generate()
            # Saved before the key is sent: once the coordinator holds it, it
            # accepts no other key from this node for this session.
            self.sessions.start(
                session_id=self.session_id,
                node_id=self.node_id,
                config_hash=self.config_hash,
                key=self.ephemeral,
            )
        else:
            self.ephemeral = saved[1]
        bundle = sign_key_bundle(
            self.identity,
            config_hash=self.config_hash,
            session_id=self.session_id,
            node_id=self.node_id,
            public_key=self.ephemeral.public_bytes(),
        )
        try:
            response = self.client.join(
                pb.KeyBundle(
                    config_hash=bundle.config_hash,
                    session_id=bundle.session_id,
                    node_id=bundle.node_id,
                    public_key=bundle.public_key,
                    signature=bundle.signature,
                )
            )
        except CoordinatorError as error:
            if error.code != grpc.StatusCode.FAILED_PRECONDITION or (
                "already joined" not in error.details
            ):
                raise
            raise SessionFailed(
                f"the coordinator already holds another session key of this node for session "
                f"{self.session_id}, and {self.sessions.key_path} does not hold it (was the "
                f"output folder replaced?); this node cannot rejoin that session: {error.details}"
            ) from None
        count = f"{response.joined_count} of {response.federation_size} nodes"
        if response.rejoined:
            self.say(
                f"rejoined session {self.session_id} with the key saved in "
                f"{self.sessions.key_path} ({count} joined)"
            )
        elif self.resuming:
            self.say(
                f"joined session {self.session_id} with the key saved before the restart "
                f"({count} so far)"
            )
        else:
            self.say(f"joined session {self.session_id} ({count} so far)")

    def _prepare_output(self) -> None:
        """Move a previous session's egress and audit folders aside; the ledger stays."""
        self.out.mkdir(parents=True, exist_ok=True)
        previous = None
        for manifest in sorted((self.out / "egress").glob("round-*/manifest.json")):
            try:
                previous = EgressBundle.read(manifest.parent).session_id
            except ValueError:
                previous = "unknown"
            break
        if previous is None:
            # A CAPE session may have stopped after a secure-sum share, before any bundle.
            for note in sorted((self.out / "egress").glob(f"round-*/{CAPE_SUM_NOTE}")):
                found = _json_object(note)
                previous = str(found.get("session_id", "unknown")) if found else "unknown"
                break
        if previous is None or previous == self.session_id:
            return
        archive = self.out / "archive" / previous
        archive.mkdir(parents=True, exist_ok=True)
        for name in ("egress", "audit", "model.json", "predictions.csv"):
            source = self.out / name
            if source.exists():
                shutil.move(str(source), str(archive / name))
        self.say(f"moved the records of session {previous} to {archive}")

    def _fetch_roster(self) -> None:
        assert self.config is not None
        while True:
            roster = self.client.get_roster(self.session_id)
            if roster.final:
                break
            self._sleep()
        try:
            self.roster: VerifiedRoster = verify_roster(
                roster,
                node_id=self.node_id,
                own_public_key=self.ephemeral.public_bytes(),
                session_id=self.session_id,
                config_hash=self.config_hash,
                identity_keys=self.config.identity_keys,
                min_nodes=self.config.min_nodes,
            )
        except RosterError as error:
            raise SessionFailed(str(error)) from None
        self.seeds = derive_seeds(
            self.roster, self.ephemeral, node_id=self.node_id, config_hash=self.config_hash
        )
        self._masks = MaskPrefetch(self.seeds, self.codec)
        excluded = f"; excluded: {_names(self.roster.excluded)}" if self.roster.excluded else ""
        self.say(f"roster verified: {_names(self.roster.node_ids)}{excluded}")

    # ------------------------------------------------------------ rounds

    def _participants(self, status: pb.SessionStatus, round_index: int) -> tuple[str, ...]:
        dropped: set[str] = set()
        for summary in status.rounds:
            if summary.round_index < round_index:
                dropped.update(summary.dropped_node_ids)
        return tuple(n for n in self.roster.node_ids if n not in dropped)

    def _run_rounds(self) -> None:
        self._done: set[int] = set()
        self._cape: dict[str, _CapeState] = {}
        # Model rounds of which this node sent a CAPE-sum share before a restart.
        self._cape_sent: set[str] = set()
        self._attested: set[bytes] = set()
        self._answered: set[bytes] = set()
        # Per round index: what earlier unmask answers of that round revealed.
        self._revealed: dict[int, RevealedTerms] = self._revealed_in_ledger()
        if self.resuming:
            self._catch_up()
        while not self.plan.complete:
            status = self.client.get_status(self.session_id)
            if status.state == pb.SESSION_STATE_ABORTED:
                raise SessionFailed(f"the session failed: {status.reason}")
            if self.resuming:
                # A round sent before the restart may be aggregated after the
                # catch-up looked; only the current round is handled below.
                self._take_aggregated(status)
                if self.plan.complete:
                    break
            if not status.rounds or status.current_round_index in self._done:
                if status.state == pb.SESSION_STATE_COMPLETED:
                    raise SessionFailed(
                        "the session completed without this node receiving every round"
                    )
                self._sleep()
                continue
            index, name = status.current_round_index, status.current_round_name
            participants = self._participants(status, index)
            if self.node_id not in participants:
                raise SessionFailed(
                    f"the coordinator dropped this node before round {index} ({name!r})"
                )
            if name.startswith(CAPE_SUM_PREFIX):
                self._cape_sum_round(index, name, participants)
            elif name in self.plan.round_names:
                self._model_round(index, name, participants)
            else:
                raise SessionFailed(
                    f"the coordinator opened round {index} named {name!r}, which is not part of "
                    f"this node's plan {list(self.plan.round_names)}"
                )
            self._done.add(index)

    def _revealed_in_ledger(self) -> dict[int, RevealedTerms]:
        """What this node's unmask answers of this session revealed, per round.

        The ledger records each answer before it leaves, also those of a
        process that crashed: they bind a restarted node as they bound that
        one, so it never answers what the uninterrupted node would refuse.
        (Which survivor sets it attested need not survive: an attestation
        reveals nothing, and signing the same hash again gives the same
        signature.)
        """
        return {
            index: RevealedTerms(set(dropped), set(survivors))
            for index, (dropped, survivors) in self.ledger.revealed(self.session_id).items()
        }

    def _catch_up(self) -> None:
        """After a restart: take in every round the coordinator aggregated meanwhile.

        Each published aggregate feeds the plan as if it had been awaited; no
        egress is written and nothing enters the ledger (this node's releases
        of those rounds are recorded already). A CAPE-sum round aggregated
        sets S and its participants from the published result, as the live
        path does, in the CAPE material saved before the restart (required
        unless its model round is aggregated too). The current round is left
        to the main loop, which resubmits a bundle written before the restart,
        or sends a CAPE-sum share again from the saved draws.
        """
        assert self.config is not None
        for entry in self.ledger.entries:
            if entry.kind == "refusal" and entry.session_id == self.session_id:
                # The node stopped at that refusal; the coordinator may never have
                # heard of it, and a restart must not cooperate further either.
                raise NodeRefused(
                    f"this node refused to unmask round {entry.round_index} "
                    f"({entry.round_name!r}) of session {self.session_id} before it restarted "
                    f"({entry.details.get('reason', 'no reason recorded')}); it does not go on "
                    "in that session"
                )
        status = self.client.get_status(self.session_id)
        aggregated = self._take_aggregated(status)
        done = (
            f"round{'s' if len(aggregated) > 1 else ''} {', '.join(aggregated)} aggregated"
            if aggregated
            else "no round aggregated yet"
        )
        if not status.rounds or status.current_round_index in self._done:
            where = "nothing left to send"
        else:
            index, name = status.current_round_index, status.current_round_name
            if name.startswith(CAPE_SUM_PREFIX) and self._noted_share(index) is not None:
                where = f"round {index} ({name!r}) CAPE sum share noted, sending it again"
            elif (egress_folder(self.out, index) / MANIFEST).exists():
                where = f"round {index} ({name!r}) bundle found, resubmitting"
            else:
                where = f"round {index} ({name!r}) not written yet here"
        self.say(f"resuming session {self.session_id}: {done}, {where}")

    def _take_aggregated(self, status: pb.SessionStatus) -> list[str]:
        """Take in every round of ``status`` not handled yet that is aggregated or superseded.

        Returns the indices of the rounds taken in. A round counts as handled
        (``_done``) from then on; a round still open is left to the main loop.
        """
        waiting = [s for s in status.rounds if s.round_index not in self._done]
        # A share counts as sent once the coordinator holds it or the node noted
        # it (the note is written just before the upload): its draws must be reused.
        for summary in waiting:
            if summary.round_name.startswith(CAPE_SUM_PREFIX) and (
                self.node_id in summary.submitted_node_ids
                or self._noted_share(summary.round_index) is not None
            ):
                self._cape_sent.add(summary.round_name.removeprefix(CAPE_SUM_PREFIX))
        finished = {
            s.round_name
            for s in status.rounds
            if s.status == pb.ROUND_STATUS_READY and s.round_name in self.plan.round_names
        }
        aggregated: list[str] = []
        for summary in waiting:
            index, name = summary.round_index, summary.round_name
            if self.node_id in summary.dropped_node_ids:
                raise SessionFailed(
                    f"the coordinator dropped this node from round {index} ({name!r}) while it "
                    "was away (a deadline passed); it cannot rejoin this session"
                )
            if summary.status == pb.ROUND_STATUS_FAILED and index != status.current_round_index:
                self._done.add(index)  # superseded by a rerun
                continue
            if summary.status != pb.ROUND_STATUS_READY:
                continue
            participants = self._participants(status, index)
            if name.startswith(CAPE_SUM_PREFIX):
                model_round = name.removeprefix(CAPE_SUM_PREFIX)
                self._take_published_cape_sum(
                    index, name, participants, needed=model_round not in finished
                )
            elif name in self.plan.round_names:
                self._take_published(index, name, participants)
            else:
                raise SessionFailed(
                    f"the coordinator aggregated round {index} named {name!r}, which is not part "
                    f"of this node's plan {list(self.plan.round_names)}"
                )
            self._done.add(index)
            aggregated.append(str(index))
        return aggregated

    def _take_published_cape_sum(
        self, index: int, name: str, participants: tuple[str, ...], *, needed: bool
    ) -> None:
        """Take in a CAPE-sum round aggregated while this node was not running.

        Its result must count the share this node noted, and, while its model
        round is still to come (``needed``), becomes S of the saved CAPE state
        exactly as in :meth:`_cape_sum_round`.
        """
        assert self.config is not None
        model_round = name.removeprefix(CAPE_SUM_PREFIX)
        if model_round not in self.plan.round_names:
            raise SessionFailed(f"the coordinator aggregated {name!r} for an unknown model round")
        layout = Layout.of_tensors(self.plan.tensors(model_round))
        state = None
        if needed:
            # Aggregated with this node's share, so its draws are needed again.
            self._cape_sent.add(model_round)
            state = self._cape_state(model_round, layout)
        noted = self._noted_share(index)
        own = None
        if noted is not None:
            try:
                own = bytes.fromhex(str(noted.get("payload_sha256")))
            except ValueError:
                raise SessionFailed(
                    f"{egress_folder(self.out, index) / CAPE_SUM_NOTE} notes no valid sha256 of "
                    "the CAPE sum share this node sent; restore it"
                ) from None
        noise = (
            state.noise
            if state is not None
            else plan_release(
                self.config, participants, self.node_id, self.plan.sensitivities(model_round)
            )
        )
        result = self._await_result(index, name, layout, participants, noise, own_sha256=own)
        if result is None:
            raise SessionFailed(f"round {index} ({name!r}) was aggregated but is now superseded")
        if state is None:
            return
        if state.sum_index == index and (
            state.total is None or not np.array_equal(state.total, result)
        ):
            raise SessionFailed(
                f"the CAPE sum of round {index} ({name!r}) saved in "
                f"{CapeStore(self.out).folder(model_round)} differs from the one the coordinator "
                "publishes now; refusing to go on with either"
            )
        self._take_cape_sum(model_round, state, index, result, layout)

    def _take_published(self, index: int, name: str, participants: tuple[str, ...]) -> None:
        """Feed the plan a round's published aggregate (the round is READY)."""
        assert self.config is not None
        # The local tensors give the aggregate's layout (and the plan's state
        # for the round); nothing of them is sent again.
        layout = Layout.of_tensors(self.plan.tensors(name))
        noise = plan_release(self.config, participants, self.node_id, self.plan.sensitivities(name))
        # The aggregate must count the very payload this node's bundle holds.
        bundle = self._bundle_before_restart(index, name)
        own = None if bundle is None else bytes.fromhex(bundle.payload_sha256)
        result = self._await_result(index, name, layout, participants, noise, own_sha256=own)
        if result is None:
            raise SessionFailed(f"round {index} ({name!r}) was aggregated but is now superseded")
        self.plan.receive(name, layout.decode(result, self.codec))

    def _model_round(self, index: int, name: str, participants: tuple[str, ...]) -> None:
        assert self.config is not None
        self._unsent_round = index
        tensors = self.plan.tensors(name)
        layout = Layout.of_tensors(tensors)
        clean = layout.encode(tensors, self.codec)
        earlier = self._bundle_before_restart(index, name)
        residual_rng = self.options.rng
        cape = self.config.privacy.noise_design.construction == "cape"
        if earlier is not None:
            # Sent again exactly as written: recomputing would draw new
            # residual noise, a second and different release of the same data.
            if cape:
                noise = self._earlier_cape_noise(earlier, participants, layout, clean)
            else:
                noise = self._earlier_noise(earlier, participants, layout)
            egress = earlier.payload
        elif cape:
            state = self._cape_state(name, layout)
            if state is None or state.total is None or state.participants != participants:
                raise SessionFailed(
                    f"round {index} ({name!r}) opened without a completed CAPE sum among "
                    f"{_names(participants)}"
                )
            noise = state.noise
            # A rerun keeps τ² but shrinks K; the ε budget check below cannot
            # see that the remaining participants' noise fell below the floor.
            shortfall = state.floor_shortfall(noise, self.config.privacy.collusion_threshold)
            if shortfall is not None:
                raise NodeRefused(
                    f"round {index} ({name!r}) not released: {shortfall}; nothing was sent"
                )
            mask = cape_masks(state.draws, state.total, participants, self.node_id)
            if state.residual is None:
                state.residual = add_residual_noise(
                    np.zeros_like(clean), noise, layout, self.codec, residual_rng
                )
                # Saved before the bundle is written: a rerun must add this very noise again.
                self._save_cape(name, state, layout)
            egress = clean + mask + state.residual
        else:
            noise = plan_release(
                self.config, participants, self.node_id, self.plan.sensitivities(name)
            )
            mask = self._masks.take(noise, layout, round_index=index)
            egress = add_residual_noise(clean + mask, noise, layout, self.codec, residual_rng)
        if earlier is None:
            folder = self._release(
                index=index, name=name, layout=layout, noise=noise, clean=clean, egress=egress
            )
        else:
            folder = self._release_again(
                index=index, name=name, layout=layout, noise=noise, clean=clean, bundle=earlier
            )
        receipt = self.client.upload(
            session_id=self.session_id,
            round_index=index,
            round_name=name,
            payload=egress,
            layout=layout,
            fixed_point_bits=self.config.fixed_point_bits,
            roster_hash=self.roster.roster_hash,
            statement_signature=sign_upload_statement(
                self.identity,
                config_hash=self.config_hash,
                session_id=self.session_id,
                round_index=index,
                round_name=name,
                roster_hash=self.roster.roster_hash,
                payload_sha256=payload_digest(egress),
            ),
        )
        self._unsent_round = None
        held = "; the coordinator already held these bytes" if receipt.duplicate else ""
        self.say(
            f"round {index} ({name!r}) uploaded from {folder} "
            f"({receipt.submitted_count} of {receipt.expected_count} nodes in{held})"
        )
        result = self._await_result(index, name, layout, participants, noise)
        if result is None:
            self.say(f"round {index} ({name!r}) is superseded; waiting for the rerun")
            return
        self.plan.receive(name, layout.decode(result, self.codec))
        self.say(f"round {index} ({name!r}) aggregated")
        self._prefetch(index + 1, self._last_survivors)

    def _prefetch(self, index: int, participants: tuple[str, ...]) -> None:
        """Start drawing round ``index``'s pairwise mask now (``node.masking.MaskPrefetch``).

        Under the pairwise construction round ``index`` is the plan's round of
        that position, and its participants are those of the round just
        finished unless someone drops meanwhile. The mask needs no data, so it
        is drawn in the background while this node computes, waits for the
        round to open or writes its bundle; ``_model_round`` takes it if the
        round turns out as predicted and draws afresh otherwise.
        """
        assert self.config is not None
        if (
            self.config.privacy.noise_design.construction != "pairwise"
            or index >= len(self.plan.round_names)
            or (egress_folder(self.out, index) / MANIFEST).exists()
        ):
            return
        name = self.plan.round_names[index]
        try:
            layout = Layout.of_tensors(self.plan.tensors(name))
            noise = plan_release(
                self.config, participants, self.node_id, self.plan.sensitivities(name)
            )
        except (ValueError, KeyError, NoiseError):
            return  # the round itself reports the problem if it really opens so
        self._masks.start(noise, layout, round_index=index)

    def _release(
        self,
        *,
        index: int,
        name: str,
        layout: Layout,
        noise: ReleaseNoise,
        clean: U64,
        egress: U64,
    ) -> Path:
        """Budget check, egress bundle, audit record, approval, ledger entry."""
        assert self.config is not None
        privacy = self.config.privacy
        mu = noise.mu()
        self._check_budget(index, name, mu)
        totals = [t.as_release() for t in self.ledger.totals(extra=mu)]
        shapes = {slot.name: slot.shape for slot in layout}
        bundle = EgressBundle(
            session_id=self.session_id,
            round_index=index,
            round_name=name,
            node_id=self.node_id,
            fixed_point_bits=self.config.fixed_point_bits,
            tensors=noise.entries(shapes),
            masking=noise.masking_facts(residual_dp=privacy.residual_dp),
            dp=noise.receipt(totals, len(self.ledger.release_mu()) + 1),
            sdc=SDCEvidence(
                n_subjects=self.plan.n_used(),
                residual_degrees_of_freedom=self.plan.residual_dof(name),
                notes=self.plan.sdc_notes(name),
            ),
            payload=egress,
            config_hash=self.config_hash.hex(),
        )
        folder = bundle.write(self.out)
        self._write_audit(index, name, bundle, clean)
        self.say(f"round {index} ({name!r}): egress bundle written to {folder}")
        return self._approve_and_record(
            index=index, name=name, layout=layout, noise=noise, folder=folder, egress=egress
        )

    def _check_budget(self, index: int, name: str, mu: dict[str, float]) -> None:
        assert self.config is not None
        privacy = self.config.privacy
        projected = self.ledger.projected_epsilon("outsider", mu)
        if projected > privacy.epsilon_budget * (1.0 + 1e-12):
            raise NodeRefused(
                f"releasing round {index} ({name!r}) would bring this node's total ε against an "
                f"outsider to {projected:.4g}, above the budget of {privacy.epsilon_budget:g} "
                "(privacy.epsilon_budget); nothing was sent"
            )

    def _write_audit(self, index: int, name: str, bundle: EgressBundle, clean: U64) -> None:
        assert self.config is not None
        write_audit(
            self.out,
            AuditRecord(
                session_id=self.session_id,
                round_index=index,
                round_name=name,
                node_id=self.node_id,
                fixed_point_bits=self.config.fixed_point_bits,
                tensors=bundle.tensors,
                payload=clean,
                clipped=self.plan.clipped(name),
                egress_payload_sha256=bundle.payload_sha256,
            ),
        )

    def _approve_and_record(
        self,
        *,
        index: int,
        name: str,
        layout: Layout,
        noise: ReleaseNoise,
        folder: Path,
        egress: U64,
        resumed: bool = False,
    ) -> Path:
        """The reviewer's approval of the bundle in ``folder``, then its ledger entry (once).

        A resumed bundle keeps an approval given before the restart (checked
        again); in manual mode the gate finds it on its first look.
        """
        gate = ApprovalGate(
            self.options.approve,
            identity=self.identity,
            timeout_seconds=self.options.approval_timeout,
            progress=self.say,
            interrupt=self._session_watch(index),
        )
        found = read_approval(folder) if resumed and self.options.approve == "auto" else None
        if found is not None:
            verify_approval(
                found,
                manifest_sha256=EgressBundle.manifest_sha256(folder),
                accepted_keys=gate.accepted_keys,
            )
            if found.decision == "reject":
                raise ApprovalRejected(folder, found.reviewer, found.comment)
            approval = found
        else:
            approval = gate.wait(folder)
        checked = EgressBundle.verify(folder)
        if not np.array_equal(checked.payload, egress):
            raise SessionFailed(f"the payload in {folder} changed after it was written")
        self.say(f"round {index} ({name!r}) approved by {approval.reviewer}")
        if self.ledger.has_release(self.session_id, index):
            return folder  # recorded before a restart (_bundle_before_restart checked it)
        self.ledger.record_release(
            session_id=self.session_id,
            round_index=index,
            round_name=name,
            mu=noise.mu(),
            manifest_sha256=EgressBundle.manifest_sha256(folder),
            tensors=[slot.name for slot in layout],
        )
        return folder

    # ------------------------------------------------------------ resuming a round

    def _bundle_before_restart(self, index: int, name: str) -> EgressBundle | None:
        """This node's verified egress of round ``index``, written before a restart, or None.

        None when the round has no bundle yet (a folder without a manifest is
        the remains of an interrupted write: nothing of it was approved or
        sent). A bundle that fails verification, belongs to another round,
        session or node, or is not the one the ledger recorded stops the node:
        it never replaces a release record.
        """
        assert self.config is not None
        folder = egress_folder(self.out, index)
        if not (folder / MANIFEST).exists():
            return None
        try:
            bundle = EgressBundle.verify(folder)
        except EgressIntegrityError as error:
            raise SessionFailed(
                f"{error}. This node wrote that bundle before it restarted and never recomputes "
                "a release (new noise would make it a second, different release); restore the "
                "folder, or move it away if it was certainly never approved nor sent"
            ) from None
        mine = (self.session_id, index, name, self.node_id, self.config_hash.hex())
        found = (
            bundle.session_id,
            bundle.round_index,
            bundle.round_name,
            bundle.node_id,
            bundle.config_hash,
        )
        if found != mine:
            raise SessionFailed(
                f"{folder} holds the egress of session {bundle.session_id}, round "
                f"{bundle.round_index} ({bundle.round_name!r}), node {bundle.node_id!r}, not this "
                f"node's round {index} ({name!r}) of session {self.session_id}; move it away "
                "to go on"
            )
        recorded = self.ledger.release_entry(self.session_id, index)
        digest = EgressBundle.manifest_sha256(folder)
        if recorded is not None and recorded.details.get("manifest_sha256") != digest:
            raise SessionFailed(
                f"the ledger records the release of round {index} with manifest sha256 "
                f"{str(recorded.details.get('manifest_sha256'))[:16]}…, but {folder} holds "
                f"manifest {digest[:16]}…; refusing to send anything but the recorded release"
            )
        return bundle

    def _earlier_noise(
        self, bundle: EgressBundle, participants: tuple[str, ...], layout: Layout
    ) -> ReleaseNoise:
        """The round's noise plan, checked against the one ``bundle`` declares.

        Unmask answers and the ledger use this plan for the resubmitted
        payload, so it must be the plan the payload was made with.
        """
        assert self.config is not None
        name = bundle.round_name
        noise = plan_release(self.config, participants, self.node_id, self.plan.sensitivities(name))
        self._check_bundle_noise(bundle, noise, layout)
        return noise

    def _earlier_cape_noise(
        self,
        bundle: EgressBundle,
        participants: tuple[str, ...],
        layout: Layout,
        clean: U64,
    ) -> ReleaseNoise:
        """The CAPE noise plan of ``bundle`` (written before a restart), checked bit for bit.

        The saved CAPE material must rebuild the bundle's payload exactly,
        q(x_k) + q(ê_k) − share_k(S) + q(r_k): it is what unmask refusals,
        the ledger and any rerun of the round go on with.
        """
        name = bundle.round_name
        folder = egress_folder(self.out, bundle.round_index)
        saved = CapeStore(self.out).folder(name)
        state = self._cape_state(name, layout)
        if (
            state is None
            or state.total is None
            or state.residual is None
            or state.participants != participants
        ):
            raise SessionFailed(
                f"{folder} holds a CAPE egress written before a restart, but {saved} does not "
                f"hold the draws, the CAPE sum among {_names(participants)} and the residual "
                "noise it was built with; this node cannot take part in the round again"
            )
        self._check_bundle_noise(bundle, state.noise, layout)
        mask = cape_masks(state.draws, state.total, participants, self.node_id)
        if not np.array_equal(clean + mask + state.residual, bundle.payload):
            raise SessionFailed(
                f"the payload in {folder} is not the local values plus the CAPE noise saved in "
                f"{saved}; refusing to resubmit it"
            )
        return state.noise

    def _check_bundle_noise(
        self, bundle: EgressBundle, noise: ReleaseNoise, layout: Layout
    ) -> None:
        """Raise unless ``bundle`` declares the tensors and σ of ``noise`` over ``layout``."""
        name = bundle.round_name
        planned = noise.entries({slot.name: slot.shape for slot in layout})
        for have, want in itertools.zip_longest(bundle.tensors, planned):
            same = (
                have is not None
                and want is not None
                and (have.name, have.shape, have.offset) == (want.name, want.shape, want.offset)
                and math.isclose(have.sigma, want.sigma, rel_tol=1e-9)
            )
            if not same:
                raise SessionFailed(
                    f"the egress of round {bundle.round_index} ({name!r}) written before the "
                    f"restart declares tensors {[t.name for t in bundle.tensors]} with other "
                    "noise than this node plans for the round now; refusing to resubmit it"
                )

    def _release_again(
        self,
        *,
        index: int,
        name: str,
        layout: Layout,
        noise: ReleaseNoise,
        clean: U64,
        bundle: EgressBundle,
    ) -> Path:
        """Approval and ledger entry of a bundle written before a restart (once each)."""
        folder = egress_folder(self.out, index)
        if not (audit_folder(self.out, index) / AUDIT).exists():
            # The crash came between the bundle and its audit record.
            self._write_audit(index, name, bundle, clean)
        released = self.ledger.has_release(self.session_id, index)
        if not released:
            self._check_budget(index, name, noise.mu())
        state = "approved and recorded" if released else "not yet released"
        self.say(
            f"round {index} ({name!r}): resubmitting the egress bundle in {folder} written "
            f"before the restart ({state}; not recomputed)"
        )
        return self._approve_and_record(
            index=index,
            name=name,
            layout=layout,
            noise=noise,
            folder=folder,
            egress=bundle.payload,
            resumed=True,
        )

    def _session_watch(self, index: int) -> Callable[[], None]:
        """While a reviewer decides: stop if the session ends or moves on without this node."""
        last = [time.monotonic()]

        def check() -> None:
            if time.monotonic() - last[0] < _WATCH_SECONDS:
                return
            last[0] = time.monotonic()
            status = self.client.get_status(self.session_id)
            if status.state in (pb.SESSION_STATE_ABORTED, pb.SESSION_STATE_COMPLETED):
                raise SessionFailed(
                    f"the session ended while round {index} awaited approval: "
                    f"{status.reason or 'completed without this node'}"
                )
            for summary in status.rounds:
                if summary.round_index <= index and self.node_id in summary.dropped_node_ids:
                    raise SessionFailed(
                        f"the coordinator dropped this node from round {summary.round_index} "
                        "while its egress awaited approval (the round deadline passed)"
                    )

        return check

    def _cape_sum_round(self, index: int, name: str, participants: tuple[str, ...]) -> None:
        assert self.config is not None
        self._unsent_round = index
        model_round = name.removeprefix(CAPE_SUM_PREFIX)
        if model_round not in self.plan.round_names:
            raise SessionFailed(f"the coordinator opened {name!r} for an unknown model round")
        tensors = self.plan.tensors(model_round)
        layout = Layout.of_tensors(tensors)
        noted = self._noted_share(index)
        if noted is not None:
            self._cape_sent.add(model_round)
        state = self._cape_state(model_round, layout)
        if state is None:
            noise = plan_release(
                self.config, participants, self.node_id, self.plan.sensitivities(model_round)
            )
            rng = self.options.rng or os_generator()
            state = _CapeState(
                noise=noise,
                draws=cape_draws(noise, layout, self.codec, rng),
                planned=participants,
            )
            # Saved before the share leaves: a restart must send this very draw again.
            self._save_cape(model_round, state, layout)
            self._cape[model_round] = state
        else:
            state.noise = with_cape_participants(state.noise, participants)
            # Stop before a rerun whose model round could not be released anyway.
            shortfall = state.floor_shortfall(state.noise, self.config.privacy.collusion_threshold)
            if shortfall is not None:
                raise NodeRefused(f"round {index} ({name!r}) not joined: {shortfall}")
        payload = cape_sum_payload(
            state.draws, participants, self.node_id, self.seeds, layout, round_index=index
        )
        digest = payload_digest(payload).hex()
        note = egress_folder(self.out, index) / CAPE_SUM_NOTE
        if noted is not None:
            mine = (index, name, self.node_id, list(participants), digest)
            keys = ("round_index", "round_name", "node_id", "participants", "payload_sha256")
            found = tuple(noted.get(key) for key in keys)
            if found != mine:
                raise SessionFailed(
                    f"round {index} ({name!r}): the CAPE sum share recomputed from the draws saved "
                    f"in {CapeStore(self.out).folder(model_round)} (sha256 {digest[:16]}…, "
                    f"participants {_names(participants)}) is not the share {note} notes "
                    f"(sha256 {str(noted.get('payload_sha256'))[:16]}…); refusing to send a "
                    "different share"
                )
            self.say(f"round {index} ({name!r}): sending the CAPE sum share noted in {note} again")
        else:
            atomic_write_json(
                note,
                {
                    "format": "zerosum-cape-sum",
                    "session_id": self.session_id,
                    "round_index": index,
                    "round_name": name,
                    "node_id": self.node_id,
                    "participants": list(participants),
                    "payload_sha256": digest,
                    "note": (
                        "CAPE secure-sum share: a private Gaussian draw under uniform pairwise "
                        "one-time pads; it carries no data and needs no review"
                    ),
                },
            )
        self.client.upload(
            session_id=self.session_id,
            round_index=index,
            round_name=name,
            payload=payload,
            layout=layout,
            fixed_point_bits=self.config.fixed_point_bits,
            roster_hash=self.roster.roster_hash,
            statement_signature=sign_upload_statement(
                self.identity,
                config_hash=self.config_hash,
                session_id=self.session_id,
                round_index=index,
                round_name=name,
                roster_hash=self.roster.roster_hash,
                payload_sha256=bytes.fromhex(digest),
            ),
        )
        self._unsent_round = None
        self.say(f"round {index} ({name!r}) CAPE sum share uploaded")
        result = self._await_result(index, name, layout, participants, state.noise)
        if result is None:
            return
        self._take_cape_sum(model_round, state, index, result, layout)

    def _take_cape_sum(
        self,
        model_round: str,
        state: _CapeState,
        index: int,
        result: U64,
        layout: Layout,
    ) -> None:
        """S of CAPE-sum round ``index`` (aggregated over ``_last_survivors``) into ``state``."""
        state.total = result
        state.participants = self._last_survivors
        state.sum_index = index
        state.noise = with_cape_participants(state.noise, state.participants)
        # Saved before the model round's egress, which is derived from S, is written.
        self._save_cape(model_round, state, layout)

    # ------------------------------------------------------------ CAPE material on disk

    def _cape_state(self, model_round: str, layout: Layout) -> _CapeState | None:
        """This node's CAPE state of ``model_round``: in memory, else saved before a restart.

        None when there is none; a node that sent a share of the round
        (``_cape_sent``) must find it, and damaged material stops the node:
        it never draws afresh what its earlier shares were made of.
        """
        assert self.config is not None
        state = self._cape.get(model_round)
        if state is not None or not self.resuming:
            return state
        store = CapeStore(self.out)
        folder = store.folder(model_round)
        try:
            saved = store.load(
                model_round,
                session_id=self.session_id,
                node_id=self.node_id,
                config_hash=self.config_hash,
                layout=layout,
            )
        except CapeStateError as error:
            raise SessionFailed(
                f"cannot resume the CAPE rounds of {model_round!r} in session {self.session_id}: "
                f"{error}. This node never draws its CAPE noise afresh once it may have sent a "
                f"share made from it; restore {folder}, or move it away if this node certainly "
                f"sent no CAPE sum share of {model_round!r} in this session"
            ) from None
        if saved is None:
            if model_round in self._cape_sent:
                raise SessionFailed(
                    f"cannot resume session {self.session_id}: this node sent a CAPE sum share of "
                    f"{model_round!r} before it restarted, but {folder} holds no saved CAPE "
                    "material for it; drawing afresh would make its shares disagree with what it "
                    "sent. It stops here; the coordinator drops it at the round deadline and "
                    "reruns the round among the others, and a new session includes it again"
                )
            return None
        noise = plan_release(
            self.config, saved.planned, self.node_id, self.plan.sensitivities(model_round)
        )
        if saved.sum is not None:
            noise = with_cape_participants(noise, saved.sum.participants)
        state = _CapeState(
            noise=noise,
            draws=saved.draws,
            residual=saved.residual,
            participants=saved.sum.participants if saved.sum is not None else (),
            total=saved.sum.total if saved.sum is not None else None,
            planned=saved.planned,
            sum_index=saved.sum.round_index if saved.sum is not None else None,
        )
        self._cape[model_round] = state
        self.say(f"CAPE material of {model_round!r} loaded from {folder}")
        return state

    def _save_cape(self, model_round: str, state: _CapeState, layout: Layout) -> None:
        """Save ``state`` in ``OUT/audit/cape-<round>/`` (node/cape_state.py), checked."""
        cape_sum = None
        if state.total is not None:
            assert state.sum_index is not None
            cape_sum = CapeSum(state.sum_index, state.participants, state.total)
        material = CapeMaterial(
            session_id=self.session_id,
            node_id=self.node_id,
            config_hash=self.config_hash,
            round_name=model_round,
            layout=layout,
            planned=state.planned,
            draws=state.draws,
            residual=state.residual,
            sum=cape_sum,
        )
        try:
            CapeStore(self.out).save(material)
        except CapeStateError as error:
            raise SessionFailed(
                f"could not save the CAPE material of {model_round!r}: {error}; nothing derived "
                "from it was sent"
            ) from None

    def _noted_share(self, index: int) -> dict[str, object] | None:
        """This session's note of the CAPE-sum share of round ``index`` (``cape-sum.json``).

        None when there is none (a note of an earlier session is not this
        node's share). An unreadable note stops the node: it may have been
        written just before the share left.
        """
        path = egress_folder(self.out, index) / CAPE_SUM_NOTE
        if not path.exists():
            return None
        data = _json_object(path)
        if data is None:
            raise SessionFailed(
                f"{path} is not a readable JSON object; it notes the digest of a CAPE sum share "
                "this node may have sent, which it must check before sending again: restore it"
            )
        return data if data.get("session_id") == self.session_id else None

    # ------------------------------------------------------------ results and unmasking

    def _await_result(
        self,
        index: int,
        name: str,
        layout: Layout,
        participants: tuple[str, ...],
        noise: ReleaseNoise,
        *,
        own_sha256: bytes | None = None,
    ) -> U64 | None:
        """The round's aggregate, or None when the coordinator superseded the round.

        ``own_sha256``: the digest of this node's upload when this process did
        not make it (a round sent before a restart, from its bundle).
        """
        while True:
            header, aggregate = self.client.get_result(self.session_id, index)
            if header.status == pb.ROUND_STATUS_READY:
                assert aggregate is not None and self.config is not None
                # Every contributor must have signed for the roster this node
                # verified, this node's own upload must be the one counted, and
                # the nodes left out must be those whose pair terms it revealed.
                sent = self.client.uploaded_sha256(self.session_id, index) or own_sha256
                revealed = self._revealed.get(index)
                try:
                    check_statements(
                        header,
                        config_hash=self.config_hash,
                        session_id=self.session_id,
                        round_index=index,
                        roster_hash=self.roster.roster_hash,
                        identity_keys=self.config.identity_keys,
                        own_node_id=self.node_id,
                        own_sha256=sent,
                        participants=participants,
                        round_name=name,
                        revealed=revealed.dropped if revealed is not None else (),
                    )
                except StatementError as error:
                    raise SessionFailed(str(error)) from None
                self._last_survivors = tuple(header.survivor_node_ids)
                return aggregate
            if header.status == pb.ROUND_STATUS_FAILED:
                status = self.client.get_status(self.session_id)
                if status.state in (pb.SESSION_STATE_ABORTED, pb.SESSION_STATE_COMPLETED):
                    raise SessionFailed(f"the session failed: {status.reason or header.reason}")
                return None
            if (
                header.status == pb.ROUND_STATUS_AWAITING_UNMASK
                and header.HasField("unmask_request")
                and header.unmask_request.pending
            ):
                self._answer_unmask(
                    header.unmask_request, name, layout, participants, noise, index=index
                )
            self._sleep()

    def _refuse(self, request: pb.UnmaskRequest, ask: UnmaskAsk, reason: str) -> NoReturn:
        self.ledger.record_refusal(
            session_id=self.session_id,
            round_index=ask.round_index,
            round_name=ask.round_name,
            dropped=ask.dropped,
            survivors=ask.survivors,
            reason=reason,
        )
        try:
            self.client.refuse_unmask(request=request, reason=reason)
        except CoordinatorError as error:
            self.say(f"the coordinator did not take the refusal ({error.details})")
        raise NodeRefused(
            f"refused to unmask round {ask.round_index} ({ask.round_name!r}): {reason}"
        )

    def _answer_unmask(
        self,
        request: pb.UnmaskRequest,
        name: str,
        layout: Layout,
        participants: tuple[str, ...],
        noise: ReleaseNoise,
        *,
        index: int,
    ) -> None:
        """One step of answering an unmask request for round ``index``, the round awaited.

        Attest, then (when all agree) answer. Every check, the attestation and
        the corrections use ``index``, never the request's own round: a request
        for another round is refused.
        """
        assert self.config is not None
        ask = UnmaskAsk.from_message(request)
        if ask.survivor_hash in self._answered:
            return
        reason = check_request(
            ask,
            node_id=self.node_id,
            session_id=self.session_id,
            round_index=index,
            participants=participants,
            config_hash=self.config_hash,
            min_nodes=self.config.min_nodes,
        )
        if reason is None:
            reason = check_against_revealed(ask, self._revealed.get(index))
        if reason is not None:
            self._refuse(request, ask, reason)
        if ask.survivor_hash not in self._attested:
            signature = attestation_signature(
                self.identity,
                config_hash=self.config_hash,
                session_id=self.session_id,
                round_index=index,
                survivor_hash=ask.survivor_hash,
            )
            self.client.attest_survivors(
                session_id=self.session_id,
                round_index=index,
                survivor_hash=ask.survivor_hash,
                signature=signature,
            )
            self._attested.add(ask.survivor_hash)
            self.say(
                f"round {index} ({name!r}): attested survivors {_names(ask.survivors)} "
                f"(dropped {_names(ask.dropped)})"
            )
            return
        complete, reason = check_attestations(
            ask, config_hash=self.config_hash, identity_keys=self.config.identity_keys
        )
        if reason is not None:
            self._refuse(request, ask, reason)
        if not complete:
            return
        # Everything revealed for this round once this answer is sent: the floor
        # check and the ledger must see the union, not this request alone. (The
        # request contains every earlier dropped set, see check_against_revealed,
        # so the union is ask.dropped; the answer itself stays the terms with D.)
        earlier = self._revealed.get(index)
        revealed = set(ask.dropped) | (earlier.dropped if earlier else set())
        if name.startswith(CAPE_SUM_PREFIX):
            # The pads blind a private draw, not data: with D's pads revealed the
            # coordinator learns Σ_S ê_k, which it publishes anyway. What it costs
            # is the model round's CAPE noise among S alone, so refuse now if
            # that would fall below the floor (the model round checks again).
            shortfall = self._cape[name.removeprefix(CAPE_SUM_PREFIX)].floor_shortfall(
                with_cape_participants(noise, ask.survivors),
                self.config.privacy.collusion_threshold,
            )
            if shortfall is not None:
                self._refuse(request, ask, shortfall)
            if not self._unmask_recorded(index, revealed, ask):
                self.ledger.record_secure_sum_unmask(
                    session_id=self.session_id,
                    round_index=index,
                    round_name=ask.round_name,
                    dropped=sorted(revealed),
                    survivors=ask.survivors,
                )
            pad_partners = sorted({self.node_id, *ask.dropped})
            corrections = layout.build(
                lambda slot: cape_blinding(
                    pad_partners,
                    self.node_id,
                    self.seeds,
                    round_index=index,
                    tensor=slot.name,
                    size=slot.size,
                )
            )
        elif self.config.privacy.noise_design.construction == "cape":
            self._refuse(
                request,
                ask,
                "CAPE noise cannot be unmasked; the round must be rerun among the survivors",
            )
        else:
            shortfall = noise.floor_shortfall(revealed)
            if shortfall is not None:
                self._refuse(request, ask, shortfall)
            if not self._unmask_recorded(index, revealed, ask):
                self.ledger.record_unmask(
                    session_id=self.session_id,
                    round_index=index,
                    round_name=ask.round_name,
                    dropped=sorted(revealed),
                    survivors=ask.survivors,
                    mu=noise.mu_after_unmask(revealed),
                )
            corrections = unmask_corrections(
                noise,
                self.seeds,
                layout,
                ask.dropped,
                round_index=index,
                codec=self.codec,
            )
        # Counted as revealed from here on, whether or not the coordinator takes
        # the answer: its bytes may reach the coordinator before a rejection.
        if earlier is None:
            earlier = self._revealed[index] = RevealedTerms(set(), set())
        earlier.dropped |= revealed
        earlier.survivors |= set(ask.survivors)
        try:
            self.client.submit_unmask(
                request=request,
                payload=corrections,
                layout=layout,
                fixed_point_bits=self.config.fixed_point_bits,
            )
        except CoordinatorError as error:
            # The request moved on (another survivor dropped); the next poll shows the new one.
            self.say(f"unmask answer not taken ({error.details}); fetching the request again")
            return
        self._answered.add(ask.survivor_hash)
        self.say(f"round {index} ({name!r}): sent pair terms with {_names(ask.dropped)}")

    def _unmask_recorded(self, index: int, revealed: set[str], ask: UnmaskAsk) -> bool:
        """True when the ledger already holds this very answer (same terms, same cost).

        It is sent again after a restart, or when the coordinator missed it.
        """
        return self.ledger.has_unmask(
            self.session_id, index, dropped=sorted(revealed), survivors=ask.survivors
        )

    # ------------------------------------------------------------ results

    def _finish(self) -> RunOutcome:
        model_path = self.out / "model.json"
        self.plan.save_model(model_path)
        brain_age, delta = self.plan.predict()
        predictions = self.out / "predictions.csv"
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["id", "age", "brain_age", "delta"])
        for subject, age, predicted, gap in zip(
            self.cohort.ids, self.cohort.age, brain_age, delta, strict=True
        ):
            writer.writerow([subject, _cell(age), _cell(predicted), _cell(gap)])
        atomic_write_text(predictions, buffer.getvalue())
        # The session key has served its purpose; nothing may be derived from it any more.
        SessionStore(self.out).complete()
        # Nor from the CAPE material, whose only use was a restart (node/cape_state.py).
        CapeStore(self.out).discard()
        self.say(f"model written to {model_path}; predictions to {predictions}")
        return RunOutcome(
            session_id=self.session_id,
            model=model_path,
            predictions=predictions,
            ledger=self.ledger.path,
        )


def _cell(value: float) -> str:
    return "" if not np.isfinite(value) else repr(float(value))


def _json_object(path: Path) -> dict[str, object] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
