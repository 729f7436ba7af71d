"""Joining a session: learn its id, save a session key, post it signed, verify the roster.

1. Ask the coordinator which session it runs; refuse a coordinator that runs
   another federation configuration (its config hash differs).
2. Look for a session key this node saved for that session before a restart
   (``node.records.session_state.SessionStore``). Refuse a session id the node's state
   folder already records (or its ledger holds entries of) unless that saved
   key is the one recorded: a coordinator reusing a session id is replaying
   it (``node.records.state_folder``). Otherwise make a fresh X25519 key and save it
   (0600), then record the session in ``STATE/sessions.json``, both *before*
   the key is sent: once the coordinator holds a key it accepts no other key
   from this node for the session.
3. Sign the key with the identity key over (config hash, session id, node id,
   key) and post it. The same key signed again gives the same bundle (X25519
   and Ed25519 are deterministic), so a restarted node is answered "rejoined".
4. Wait until the roster is final, verify every bundle against the pinned
   identities (``node.protocol.roster.verify_roster``), record it in the session's
   entry of ``STATE/sessions.json`` — or, resuming, stop on any difference
   from the one recorded — and derive the pairwise seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from node.errors import AlreadyJoined, RosterError, SessionFailed, SessionStateError
from node.protocol.gateway import CoordinatorGateway
from node.protocol.roster import derive_seeds, verify_roster
from node.records.cape_state import CapeStore
from node.records.session_state import SessionStore
from node.records.state_folder import NodeState
from node.session.context import NodeOptions, SessionContext
from node.session.outputs import archive_previous
from node.session.setup import LocalSetup
from noise.keys import EphemeralKey, key_fingerprint, sign_key_bundle
from proto.messages import SessionState

if TYPE_CHECKING:
    from node.records.ledger import PrivacyLedger
    from node.records.session_state import SessionRecord
    from node.roster import VerifiedRoster

__all__ = ["join"]


def _names(nodes: tuple[str, ...] | list[str]) -> str:
    return "{" + ", ".join(sorted(nodes)) + "}"


def _same_roster(
    state: NodeState, session_id: str, public_keys: Mapping[str, bytes], *, resuming: bool
) -> None:
    """Record the roster verified for ``session_id``, or stop if it differs from the recorded one.

    A roster is final once and for all, so a resuming node must be shown the
    very roster it verified before. Every bundle in a changed one may still
    be validly signed (a node that lost its key and joined again, accepted by
    a lying coordinator): the seeds with that node would change mid-session,
    and the coordinator could hold both. Raises SessionFailed naming every
    difference.
    """
    entry = state.entry(session_id)
    if entry is None:
        return
    if not entry.roster:
        state.record_roster(session_id, public_keys)
        return
    shown = {node: bytes(key).hex() for node, key in public_keys.items()}
    changes = []
    for node in sorted(set(entry.roster) | set(shown)):
        before, now = entry.roster.get(node), shown.get(node)
        if before == now:
            continue
        if before is None:
            changes.append(f"{node} was not on it")
        elif now is None:
            changes.append(f"{node} is missing")
        else:
            changes.append(
                f"{node}'s session key is {key_fingerprint(bytes.fromhex(now))}, verified as "
                f"{key_fingerprint(bytes.fromhex(before))}"
            )
    if changes:
        when = "before the restart" if resuming else "earlier"
        raise SessionFailed(
            f"the roster of session {session_id} differs from the one this node verified "
            f"{when} ({'; '.join(changes)}), though every bundle in it may be validly signed; "
            "a final roster never changes, so the coordinator is showing this node another "
            "roster than before. The node stops; nothing more was sent"
        )


def join(
    setup: LocalSetup,
    gateway: CoordinatorGateway,
    options: NodeOptions,
    say: Callable[[str], None],
    sleep: Callable[[], None],
) -> SessionContext:
    """Join the coordinator's current session and verify its roster (see the module docstring)."""
    config_hash = setup.config_hash
    status = gateway.status("")
    if status.config_hash and status.config_hash != config_hash:
        raise SessionFailed(
            "the coordinator runs a different federation configuration (config hash "
            f"{status.config_hash.hex()[:16]}…, mine {config_hash.hex()[:16]}…)"
        )
    session_id = status.session_id
    sessions = SessionStore(setup.out)
    state = NodeState(setup.state, setup.node_id)
    saved, ledger = _saved_session(setup, sessions, state, session_id, say)
    # With its key saved, a node that crashed in the last round may still
    # collect the final result while the coordinator lingers after the end.
    ended = status.state == SessionState.ABORTED or (
        status.state == SessionState.COMPLETED and saved is None
    )
    if ended:
        sessions.discard_key()
        CapeStore(setup.out).discard()
        why = status.reason or "completed"
        raise SessionFailed(f"session {status.session_id} has already ended ({why})")
    resuming = saved is not None
    archive_previous(setup.out, session_id, say)
    ephemeral = _session_key(setup, sessions, state, session_id, saved)
    bundle = sign_key_bundle(
        setup.identity,
        config_hash=config_hash,
        session_id=session_id,
        node_id=setup.node_id,
        public_key=ephemeral.public_bytes(),
    )
    try:
        receipt = gateway.join(bundle)
    except AlreadyJoined as error:
        raise SessionFailed(
            f"the coordinator already holds another session key of this node for session "
            f"{session_id}, and {sessions.key_path} does not hold it (was the "
            f"output folder replaced?); this node cannot rejoin that session: {error.details}"
        ) from None
    count = f"{receipt.joined_count} of {receipt.federation_size} nodes"
    if receipt.rejoined:
        say(
            f"rejoined session {session_id} with the key saved in {sessions.key_path} "
            f"({count} joined)"
        )
    elif resuming:
        say(f"joined session {session_id} with the key saved before the restart ({count} so far)")
    else:
        say(f"joined session {session_id} ({count} so far)")
    verified = _final_roster(
        setup, gateway, state, session_id, ephemeral, sleep=sleep, resuming=resuming
    )
    seeds = derive_seeds(verified, ephemeral, node_id=setup.node_id, config_hash=config_hash)
    excluded = f"; excluded: {_names(verified.excluded)}" if verified.excluded else ""
    say(f"roster verified: {_names(verified.node_ids)}{excluded}")
    return SessionContext(
        setup=setup,
        options=options,
        gateway=gateway,
        session_id=session_id,
        ephemeral=ephemeral,
        roster=verified,
        seeds=seeds,
        ledger=ledger,
        resuming=resuming,
        say=say,
        state=state,
    )


def _saved_session(
    setup: LocalSetup,
    sessions: SessionStore,
    state: NodeState,
    session_id: str,
    say: Callable[[str], None],
) -> tuple[tuple[SessionRecord, EphemeralKey] | None, PrivacyLedger]:
    """The record and key saved for ``session_id`` (None: a new session, older keys and CAPE
    material discarded) and the node's ledger, once the session is known not to be replayed."""
    try:
        saved = sessions.resume(
            session_id=session_id, node_id=setup.node_id, config_hash=setup.config_hash
        )
        ledger = state.open_ledger(setup.config.privacy.delta, setup.out, say)
        # Before the saved key or CAPE material is touched: a replayed session
        # must not cost this node the key of a session it may still resume.
        state.check_not_replayed(
            session_id,
            saved_public_key=saved[0].public_key if saved is not None else None,
            ledger=ledger,
            out=setup.out,
        )
    except SessionStateError as error:
        raise SessionFailed(str(error)) from None
    if saved is None:
        # A key of an earlier session (or one orphaned by a crash before
        # its record was written) is of no use any more, nor is its CAPE material.
        sessions.discard_key()
        CapeStore(setup.out).discard()
    return saved, ledger


def _session_key(
    setup: LocalSetup,
    sessions: SessionStore,
    state: NodeState,
    session_id: str,
    saved: tuple[SessionRecord, EphemeralKey] | None,
) -> EphemeralKey:
    """The saved session key, or a new one saved; either recorded in the state folder."""
    if saved is None:
        ephemeral = EphemeralKey.generate()
        # Saved before the key is sent: once the coordinator holds it, it
        # accepts no other key from this node for this session.
        sessions.start(
            session_id=session_id,
            node_id=setup.node_id,
            config_hash=setup.config_hash,
            key=ephemeral,
        )
    else:
        ephemeral = saved[1]
    # Recorded before the key is sent (a resume keeps its record; one saved
    # in OUT before this node had a state folder is recorded now).
    try:
        state.record_join(
            session_id=session_id,
            config_hash=setup.config_hash,
            public_key=ephemeral.public_bytes(),
            out=setup.out,
        )
    except SessionStateError as error:
        raise SessionFailed(str(error)) from None
    return ephemeral


def _final_roster(
    setup: LocalSetup,
    gateway: CoordinatorGateway,
    state: NodeState,
    session_id: str,
    ephemeral: EphemeralKey,
    *,
    sleep: Callable[[], None],
    resuming: bool,
) -> VerifiedRoster:
    """Wait for the final roster and verify it, and that it is the one verified before."""
    while True:
        roster = gateway.roster(session_id)
        if roster.final:
            break
        sleep()
    try:
        verified = verify_roster(
            roster,
            node_id=setup.node_id,
            own_public_key=ephemeral.public_bytes(),
            session_id=session_id,
            config_hash=setup.config_hash,
            identity_keys=setup.config.identity_keys,
            min_nodes=setup.config.min_nodes,
        )
    except RosterError as error:
        raise SessionFailed(str(error)) from None
    try:
        _same_roster(state, session_id, verified.public_keys, resuming=resuming)
    except SessionStateError as error:
        raise SessionFailed(str(error)) from None
    return verified
