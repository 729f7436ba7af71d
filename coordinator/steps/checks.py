"""The checks every message goes through before a step acts on it.

Who may speak (the caller's certificate names the node the message claims,
and that node is a federation member), which session and round it names,
whether the node is still live, whether the session is still running, and
whether a payload uses the federation's fixed-point scale. Each check raises
a :class:`~coordinator.errors.CoordinatorError` sentence naming the field and
the value and reads nothing but the state, so a refused message never writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.context import CoordinatorContext, Signed, node_list
from coordinator.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
)
from coordinator.layout import PayloadSpec
from coordinator.store import MemberRow, RoundRow, SessionRow, Store
from noise.keys import key_fingerprint
from noise.transcript import sealed_set_message, sealed_tree
from proto.messages import (
    Sealed,
    SessionState,
)

__all__ = [
    "check_bits",
    "check_caller",
    "check_in_roster",
    "check_live",
    "check_round",
    "check_round_name",
    "check_running",
    "check_sealed",
    "check_session_id",
    "find_member",
    "sealed_signatures",
]


def check_caller(ctx: CoordinatorContext, caller: str, claimed: str) -> None:
    """Refuse (PERMISSION_DENIED) unless ``caller`` (from its certificate) is ``claimed``.

    Also refuses a node outside the federation.
    """
    if caller != claimed:
        raise PermissionDenied(
            f"the client certificate belongs to node {caller!r} but the message claims "
            f"node_id {claimed!r}; a node may only speak for itself."
        )
    if claimed not in ctx.config.identity_keys:
        raise PermissionDenied(
            f"node_id {claimed!r} is not a member of federation "
            f"{ctx.config.federation_id!r} (members: {node_list(list(ctx.config.node_ids))})."
        )


def check_in_roster(
    ctx: CoordinatorContext, caller: str, claimed: str, *, while_joining: bool = False
) -> None:
    """:func:`check_caller`, then refuse (PERMISSION_DENIED) a node outside the session's roster.

    A federation node that has not joined may read (``while_joining``) only
    while the join phase is open: it needs the session id and the roster to
    join. Once the roster is final, a node that is not on it gets no answer
    about the session at all: not its status, its roster, its results or
    its requests, and none of its calls is taken.
    """
    check_caller(ctx, caller, claimed)
    if find_member(ctx.store, caller) is not None:
        return
    row = ctx.session()
    if while_joining and row.state == SessionState.JOINING and not row.roster_final:
        return
    closed = (
        f"did not join session {row.session_id!r} before its join deadline"
        if row.roster_final
        else f"has not joined session {row.session_id!r}"
    )
    raise PermissionDenied(
        f"node {caller!r} {closed}, so it is not on the session's roster; only the nodes "
        "of the roster may take part in it or read it."
    )


def check_session_id(session_id: str, row: SessionRow) -> None:
    """Refuse a message naming another session."""
    if session_id != row.session_id:
        raise InvalidArgument(
            f"session_id {session_id!r} is not this coordinator's session "
            f"{row.session_id!r}; ask GetStatus for the current session."
        )


def check_round(ctx: CoordinatorContext, round_index: int, row: SessionRow) -> RoundRow:
    """The round a message names; refused when it has not opened."""
    found = ctx.store.round(round_index)
    if found is None:
        if row.current_round is None:
            raise FailedPrecondition(
                f"round_index {round_index} has not opened: the session is still "
                f"{row.state} and no round has opened yet."
            )
        current = ctx.round_row(row.current_round)
        raise FailedPrecondition(
            f"round_index {round_index} has not opened; the current round is "
            f"{current.round_index} ({current.name!r})."
        )
    return found


def check_round_name(round_row: RoundRow, round_name: str) -> None:
    """Refuse a round name other than the round's."""
    if round_name != round_row.name:
        raise InvalidArgument(
            f"round_name {round_name!r} does not match round {round_row.round_index}, "
            f"which is {round_row.name!r}."
        )


def find_member(store: Store, node_id: str) -> MemberRow | None:
    """The roster row of ``node_id``, or None if it has not joined."""
    return next((m for m in store.members() if m.node_id == node_id), None)


def check_live(ctx: CoordinatorContext, node_id: str, row: SessionRow) -> None:
    """Refuse a node that did not join or was dropped."""
    member = find_member(ctx.store, node_id)
    if member is None:
        closed = "did not join before the join deadline" if row.roster_final else "has not joined"
        raise FailedPrecondition(f"node {node_id!r} {closed} and is not part of this session.")
    if member.status == "dropped":
        raise FailedPrecondition(
            f"node {node_id!r} was dropped from this session in round "
            f"{member.dropped_round}: {member.dropped_reason}."
        )


def check_running(row: SessionRow) -> None:
    """Refuse once the session has completed or failed."""
    if row.state in (SessionState.COMPLETED, SessionState.ABORTED):
        ended = "completed" if row.state == SessionState.COMPLETED else f"failed: {row.reason}"
        raise FailedPrecondition(f"session {row.session_id!r} has ended ({ended}).")


def check_bits(ctx: CoordinatorContext, spec: PayloadSpec, what: str) -> None:
    """Refuse a payload whose fixed-point scale is not the federation's."""
    expected = ctx.config.fixed_point_bits
    if spec.fixed_point_bits != expected:
        raise InvalidArgument(
            f"{what}: fixed_point_bits is {spec.fixed_point_bits}; the federation uses {expected}."
        )


def sealed_signatures(
    ctx: CoordinatorContext,
    items: Sequence[Sealed],
    *,
    round_index: int,
    sender: str,
    kind: str,
    binding: bytes,
) -> list[Signed]:
    """(key, signature, message) of ``sender``'s one signature over ``items`` (check_sealed).

    Empty when the sender has no pinned key, the session has not started or
    the items cannot make a sealed-set message (none, one empty or
    oversized): the checks themselves refuse those.
    """
    key = ctx.config.identity_keys.get(sender)
    row = ctx.store.session()
    if key is None or row is None or not items:
        return []
    try:
        tree = sealed_tree({item.recipient: item.sealed for item in items})
        message = sealed_set_message(
            row.config_hash,
            row.session_id,
            round_index,
            kind=kind,
            binding=binding,
            sender=sender,
            count=tree.count,
            root=tree.root,
        )
    except ValueError:
        return []
    return [(key, items[0].signature, message)]


def check_sealed(
    ctx: CoordinatorContext,
    items: Sequence[Sealed],
    *,
    round_index: int,
    sender: str,
    recipients: Sequence[str],
    kind: str,
    binding: bytes,
    size: int,
    what: str,
) -> None:
    """Refuse sealed aggregate-check messages unless one per recipient, signed by the sender.

    The coordinator cannot open them, but it checks the sender's one
    signature over all of them (every copy carries it) so that what it
    relays is provably the sender's: a signed message that does not open for
    its recipient then names its sender, not the relay.
    """
    noun = "challenge contributions" if kind == "contribution" else "aggregate-check tags"
    found = sorted(item.recipient for item in items)
    if found != sorted(recipients):
        raise InvalidArgument(
            f"{what}: the {noun} are sealed for {found}; expected one for each of "
            f"{sorted(recipients)}."
        )
    key = ctx.config.identity_keys[sender]
    ctx.session()  # the session has started (sealed_signatures needs its row)
    for item in items:
        if item.sender != sender or len(item.sealed) != size or len(item.signature) != 64:
            raise InvalidArgument(
                f"{what}: the {noun} for {item.recipient!r} name sender {item.sender!r} and have "
                f"{len(item.sealed)} bytes and a signature of {len(item.signature)}; expected "
                f"sender {sender!r}, {size} bytes and a 64-byte signature."
            )
        if item.index or item.count or item.path:
            raise InvalidArgument(
                f"{what}: the {noun} for {item.recipient!r} carry a place in a tree (leaf "
                f"{item.index} of {item.count}, {len(item.path)} hashes); only relayed copies "
                "do."
            )
    if not items:
        return
    signature = items[0].signature
    differ = sorted(item.recipient for item in items if item.signature != signature)
    if differ:
        raise InvalidArgument(
            f"{what}: the {noun} for {differ} carry another signature than the one for "
            f"{items[0].recipient!r}; every copy carries the sender's one signature over all."
        )
    signed = sealed_signatures(
        ctx, items, round_index=round_index, sender=sender, kind=kind, binding=binding
    )
    if not signed:  # not reached: the checks above leave nothing it refuses
        raise InvalidArgument(f"{what}: the {noun} do not make a sealed set.")
    for _, signature, message in signed:
        if not ctx.signatures.verify(key, signature, message):
            raise Unauthenticated(
                f"{what}: the signature over the {noun} does not verify against the node's "
                f"pinned identity key ({key_fingerprint(key)})."
            )
