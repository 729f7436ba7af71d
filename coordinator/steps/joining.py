"""Starting or resuming a session, and the join phase: signed keys until the roster is final.

At the first start the session gets a random 128-bit id and its join
deadline. A restart with the same state file resumes it, provided the
federation config is the one it was started with; the coordinator's own
downtime never counts against the nodes, so the deadline of the phase in
progress moves to at least now plus that phase's full period.

Each node joins with an X25519 key signed by its pinned Ed25519 identity over
(config hash, session id, node id, key); the same bundle again is a rejoin, a
different key for a joined node is refused. The roster becomes final when
every federation node has joined or the join deadline passes: with at least
``min_nodes`` joined, round 0 opens with them; with fewer, the session fails.
"""

from __future__ import annotations

import secrets

from coordinator.context import CoordinatorContext, clock_text, node_list
from coordinator.errors import AlreadyExists, PermissionDenied, StateFileError, Unauthenticated
from coordinator.events import (
    EveryoneJoined,
    JoinDeadlinePassed,
    JoinResumed,
    RoundResumed,
    TooFewJoined,
)
from coordinator.steps.checks import check_caller, find_member
from coordinator.store import SessionRow
from coordinator.transitions import StatusChanges
from noise.errors import SignatureError
from noise.keys import KeyBundle, key_fingerprint, verify_key_bundle
from proto.messages import (
    JoinReceipt,
    RoundState,
    SessionState,
)

__all__ = ["Joining"]


class Joining:
    """Start or resume the session; take joins; close the roster."""

    def __init__(self, ctx: CoordinatorContext, changes: StatusChanges) -> None:
        self.ctx = ctx
        self.changes = changes

    def start_or_resume(self) -> bool:
        """Create the session in a fresh state file, or resume it; True when resumed."""
        ctx = self.ctx
        ctx.store.recover()
        row = ctx.store.session()
        now = ctx.clock()
        if row is None:
            with ctx.transition():
                ctx.store.create_session(
                    session_id=secrets.token_hex(16),
                    config_hash=ctx.config.config_hash,
                    federation_id=ctx.config.federation_id,
                    created_ms=now,
                    join_deadline_ms=now + ctx.config.join_timeout_ms,
                )
            return False
        if row.config_hash != ctx.config.config_hash:
            raise StateFileError(
                f"state file {ctx.store.path} belongs to the federation config with hash "
                f"{row.config_hash.hex()[:16]}…, but the federation file now hashes to "
                f"{ctx.config.config_hash.hex()[:16]}…; start with a new --state path."
            )
        self._extend_deadlines(row, now)
        return True

    def _extend_deadlines(self, row: SessionRow, now: int) -> None:
        """The deadline of the phase in progress moves past the coordinator's downtime."""
        with self.ctx.transition():
            if row.state == SessionState.JOINING:
                self.changes.apply_to_session(JoinResumed(), now=now)
            elif row.state == SessionState.RUNNING and row.current_round is not None:
                current = self.ctx.round_row(row.current_round)
                if current.status in (RoundState.OPEN, RoundState.AWAITING_UNMASK):
                    self.changes.apply_to_round(current.round_index, RoundResumed(), now=now)

    def check_may_join(self, caller: str) -> None:
        """Refuse a node outside the federation, or a new one once the join phase is over."""
        ctx = self.ctx
        with ctx.lock:
            check_caller(ctx, caller, caller)
            if find_member(ctx.store, caller) is None:
                self._check_join_open(ctx.session(), caller)

    def _check_join_open(self, row: SessionRow, node_id: str) -> None:
        """PERMISSION_DENIED once the join phase has closed (or its deadline passed)."""
        if row.state != SessionState.JOINING or row.roster_final:
            raise PermissionDenied(
                f"the join phase of session {row.session_id!r} has closed; node "
                f"{node_id!r} is excluded from this session."
            )
        if self.ctx.clock() >= row.join_deadline_ms:
            raise PermissionDenied(
                f"the join deadline of session {row.session_id!r} passed at "
                f"{clock_text(row.join_deadline_ms)}; node {node_id!r} is excluded "
                "from this session."
            )

    def join(self, bundle: KeyBundle, *, caller: str) -> JoinReceipt:
        """Record a node's signed ephemeral key (idempotent for the same bundle)."""
        ctx = self.ctx
        with ctx.lock:
            row = ctx.session()
            check_caller(ctx, caller, bundle.node_id)
            try:
                verify_key_bundle(
                    bundle,
                    ctx.config.identity_keys[bundle.node_id],
                    config_hash=ctx.config.config_hash,
                    session_id=row.session_id,
                    node_id=caller,
                )
            except SignatureError as error:
                raise Unauthenticated(str(error)) from None
            members = {m.node_id: m for m in ctx.store.members()}
            existing = members.get(bundle.node_id)
            if existing is not None:
                if (
                    existing.public_key == bundle.public_key
                    and existing.signature == bundle.signature
                ):
                    return self._receipt(row, bundle.node_id, rejoined=True, count=len(members))
                raise AlreadyExists(
                    f"node {bundle.node_id!r} already joined session {row.session_id!r} with key "
                    f"{key_fingerprint(existing.public_key)}; a second key "
                    f"{key_fingerprint(bundle.public_key)} is refused."
                )
            self._check_join_open(row, bundle.node_id)
            now = ctx.clock()
            count = len(members) + 1
            with ctx.transition():
                ctx.store.add_member(bundle.node_id, bundle.public_key, bundle.signature, now)
                ctx.store.set_roster_version(row.roster_version + 1)
                ctx.note(
                    f"node {bundle.node_id!r} joined ({count} of "
                    f"{len(ctx.config.node_ids)}, key {key_fingerprint(bundle.public_key)})",
                    event="node-joined",
                    node=bundle.node_id,
                )
                if count == len(ctx.config.node_ids):
                    self.close_roster(now, everyone=True)
            return self._receipt(ctx.session(), bundle.node_id, rejoined=False, count=count)

    def _receipt(self, row: SessionRow, node_id: str, *, rejoined: bool, count: int) -> JoinReceipt:
        return JoinReceipt(
            session_id=row.session_id,
            node_id=node_id,
            rejoined=rejoined,
            joined_count=count,
            federation_size=len(self.ctx.config.node_ids),
            join_deadline_ms=row.join_deadline_ms,
        )

    def close_roster(self, now: int, *, everyone: bool) -> None:
        """Inside a transition: the roster becomes final; round 0 opens, or the session fails.

        ``everyone``: every federation node has joined; otherwise the join
        deadline has passed.
        """
        config = self.ctx.config
        joined = [m.node_id for m in self.ctx.store.members()]
        if len(joined) < config.min_nodes:
            missing = sorted(set(config.node_ids) - set(joined))
            reason = (
                f"only {len(joined)} of {len(config.node_ids)} nodes joined before the "
                f"join deadline ({node_list(missing)} missing); the federation requires at "
                f"least {config.min_nodes}"
            )
            self.changes.apply_to_session(TooFewJoined(reason), now=now)
        elif everyone:
            self.changes.apply_to_session(EveryoneJoined(), now=now)
        else:
            self.changes.apply_to_session(JoinDeadlinePassed(), now=now)
