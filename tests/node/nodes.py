"""A node past its roster, built directly for tests: its session context, progress and coordinator.

The round steps of ``node.session`` take a :class:`~node.session.context.SessionContext`
(what the join fixes) and a :class:`~node.session.progress.RoundProgress` (what
the node did so far). Here both are made without a network: a
:class:`~node.session.setup.LocalSetup` from an in-code federation config
(``tests.support.made_up_federation._config``) and a fixed-tensor plan, the
deterministic identity and session keys of ``tests.support.made_up_federation``,
a real privacy ledger in the test's output folder, and a
:class:`~tests.node.fake_gateway.FakeCoordinator`. :func:`joined` is a node
that has just joined; :func:`restarted` one started again over the same
output folder, as after ``kill -9``: a new context and progress that know
only what that folder holds (the unmask answers the ledger recorded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from node.plans.interface import TensorSensitivity
from node.protocol.roster import VerifiedRoster
from node.records.ledger import PrivacyLedger
from node.records.state_folder import NodeState
from node.runner import NodeRunner
from node.session.context import NodeOptions, SessionContext
from node.session.progress import RoundProgress
from node.session.setup import LocalSetup
from noise.keys import EphemeralKey, KeyBundle, sign_key_bundle
from noise.layout import Layout
from proto.federation import FederationConfig
from proto.messages import SessionStatus
from tests.node.fake_gateway import FakeCoordinator, running
from tests.support.made_up_federation import (
    CODEC,
    SENSITIVITIES,
    SESSION,
    _identities,
    _seeds,
    _tensors,
    with_rounds,
)

__all__ = [
    "CONFIG_HASH",
    "LAYOUT",
    "ROSTER_HASH",
    "FakePlan",
    "Node",
    "joined",
    "local_setup",
    "peer_bundles",
    "restarted",
]

CONFIG_HASH = bytes(32)  # the config hash ``_seeds`` derives the pairwise seeds with
ROSTER_HASH = bytes(range(32))
LAYOUT: Layout = Layout.of_tensors(_tensors(0))


class FakePlan:
    """The plan methods the round steps use, with fixed local tensors; keeps what it received."""

    round_names = ("moments", "scatter")

    def __init__(self) -> None:
        self.received: list[str] = []

    def tensors(self, name: str) -> dict[str, np.ndarray]:
        return _tensors(0)

    def sensitivities(self, name: str) -> list[TensorSensitivity]:
        return list(SENSITIVITIES)

    def n_used(self) -> int:
        return 150

    def residual_dof(self, name: str) -> int | None:
        return None

    def sdc_notes(self, name: str) -> tuple[str, ...]:
        return ()

    def clipped(self, name: str) -> dict[str, int]:
        return {}

    def receive(self, name: str, tensors: dict[str, np.ndarray]) -> None:
        self.received.append(name)

    def post_model_release(self) -> None:
        return None


@dataclass
class Node:
    """One node as the tests drive it: what the round steps take, and its coordinator."""

    ctx: SessionContext
    progress: RoundProgress
    coordinator: FakeCoordinator
    lines: list[str] = field(default_factory=list)  # what the node said, as it prints it


def _node_ids(config: FederationConfig) -> list[str]:
    return [n.node_id for n in config.nodes]


def _session_keys(ids: list[str]) -> dict[str, EphemeralKey]:
    """The session keys ``_seeds`` derives the pairwise seeds from."""
    return {n: EphemeralKey.from_private_bytes(bytes([40 + i]) * 32) for i, n in enumerate(ids)}


def peer_bundles(config: FederationConfig, me: str = "a") -> tuple[KeyBundle, ...]:
    """Every other node's session key, signed with its pinned identity, for the roster."""
    ids = _node_ids(config)
    identities = _identities(ids)
    keys = _session_keys(ids)
    return tuple(
        sign_key_bundle(
            identities[n],
            config_hash=CONFIG_HASH,
            session_id=SESSION,
            node_id=n,
            public_key=keys[n].public_bytes(),
        )
        for n in ids
        if n != me
    )


def local_setup(
    out: Path, config: FederationConfig, *, me: str = "a", plan: object | None = None
) -> LocalSetup:
    """What node ``me`` holds before the session, with a fake plan and an empty cohort."""
    ids = _node_ids(config)
    used = FakePlan() if plan is None else plan
    # The fake plan's rounds, in the config with pinned noise scales (as federation init pins).
    names = getattr(used, "round_names", FakePlan.round_names)
    config = with_rounds(config, list(names))
    return LocalSetup(
        node_id=me,
        config_path=out / "federation.toml",
        config=config,
        config_hash=CONFIG_HASH,
        codec=CODEC,
        identity=_identities(ids)[me],
        tls=(out / "ca.pem", out / "client.pem", out / "client.key"),
        plan=used,  # type: ignore[arg-type]  # stands in for a ModelPlan
        out=out,
        state=out / "state",
    )


def _state(out: Path, me: str, public_key: bytes) -> NodeState:
    """The node's state folder in ``out/state``, recording this session's join once."""
    state = NodeState(out / "state", me)
    state.record_join(session_id=SESSION, config_hash=CONFIG_HASH, public_key=public_key, out=out)
    return state


def _context(
    out: Path,
    config: FederationConfig,
    *,
    me: str,
    plan: object | None,
    options: NodeOptions | None,
    status: SessionStatus | None,
    resuming: bool,
) -> tuple[SessionContext, FakeCoordinator, list[str]]:
    ids = _node_ids(config)
    keys = _session_keys(ids)
    setup = local_setup(out, config, me=me, plan=plan)
    coordinator = FakeCoordinator(
        me,
        status_reply=status or running(SESSION, config_hash=CONFIG_HASH),
        peers=peer_bundles(config, me),
    )
    lines: list[str] = []
    ctx = SessionContext(
        setup=setup,
        options=options or NodeOptions(approve="auto", poll_seconds=0.0),
        gateway=coordinator,
        session_id=SESSION,
        ephemeral=keys[me],
        roster=VerifiedRoster(
            session_id=SESSION,
            public_keys={n: k.public_bytes() for n, k in keys.items()},
            excluded=(),
            roster_hash=ROSTER_HASH,
        ),
        seeds=_seeds(ids)[me],
        ledger=PrivacyLedger.open(out / "ledger.json", me, config.privacy.delta),
        resuming=resuming,
        # The lines as the node prints them ("zerosum node a: ...").
        say=NodeRunner(out, me, progress=lines.append).say,
        state=_state(out, me, keys[me].public_bytes()),
    )
    return ctx, coordinator, lines


def joined(
    out: Path,
    config: FederationConfig,
    *,
    me: str = "a",
    plan: object | None = None,
    options: NodeOptions | None = None,
    status: SessionStatus | None = None,
) -> Node:
    """Node ``me`` just past its roster in a session it joined in this process."""
    ctx, coordinator, lines = _context(
        out, config, me=me, plan=plan, options=options, status=status, resuming=False
    )
    return Node(ctx, RoundProgress(), coordinator, lines)


def restarted(
    out: Path,
    config: FederationConfig,
    *,
    me: str = "a",
    plan: object | None = None,
    options: NodeOptions | None = None,
    status: SessionStatus | None = None,
) -> Node:
    """Node ``me`` started again over ``out``: it knows nothing but what that folder holds."""
    ctx, coordinator, lines = _context(
        out, config, me=me, plan=plan, options=options, status=status, resuming=True
    )
    return Node(ctx, RoundProgress.from_ledger(ctx.ledger, SESSION), coordinator, lines)
