"""What every step of a session needs, fixed once the node has joined.

:class:`NodeOptions` says how the node behaves (approval mode, polling,
retries); :class:`SessionContext` is made by ``node.session.joining.join`` and
never changes afterwards: the local setup, the session id, this node's session
key and verified roster, the pairwise seeds, the gateway to the coordinator,
the ledger (kept in the node's state folder, ``state``), and whether this run
resumes a session it joined before a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from node.errors import SessionFailed
from node.plans.interface import ModelPlan
from node.protocol.client import RetryPolicy
from node.protocol.gateway import CoordinatorGateway
from node.protocol.roster import VerifiedRoster
from node.records.ledger import PrivacyLedger
from node.records.state_folder import NodeState
from node.session.setup import LocalSetup
from noise.fixed_point import FixedPointCodec
from noise.keys import EphemeralKey, IdentityKey
from noise.layout import Layout
from proto.federation import FederationConfig

__all__ = ["NodeOptions", "SessionContext"]


@dataclass(frozen=True)
class NodeOptions:
    """How the runner behaves; the defaults suit a real deployment."""

    # Nothing leaves before its output checker has signed it; "auto" is for demos and tests.
    approve: Literal["auto", "manual"] = "manual"
    poll_seconds: float = 0.2
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    approval_timeout: float | None = None
    address: str | None = None  # overrides the config's coordinator address
    rng: np.random.Generator | None = None  # residual noise and CAPE draws (tests only)


@dataclass(frozen=True)
class SessionContext:
    """The joined session, as every round step sees it (see the module docstring)."""

    setup: LocalSetup
    options: NodeOptions
    gateway: CoordinatorGateway
    session_id: str
    ephemeral: EphemeralKey
    roster: VerifiedRoster
    seeds: Mapping[str, bytes]
    ledger: PrivacyLedger
    resuming: bool
    say: Callable[[str], None]
    state: NodeState

    @property
    def node_id(self) -> str:
        return self.setup.node_id

    @property
    def config(self) -> FederationConfig:
        return self.setup.config

    @property
    def config_hash(self) -> bytes:
        return self.setup.config_hash

    @property
    def codec(self) -> FixedPointCodec:
        return self.setup.codec

    @property
    def identity(self) -> IdentityKey:
        return self.setup.identity

    @property
    def out(self) -> Path:
        return self.setup.out

    @property
    def plan(self) -> ModelPlan:
        return self.setup.plan

    def round_tensors(self, name: str) -> tuple[dict[str, NDArray[np.float64]], Layout]:
        """The plan's tensors for model round ``name`` and the layout the config fixes for it.

        Masks are drawn for the config's layout, before a round's data exist
        (``node.protocol.masking.MaskPrefetch``); a plan whose tensors came out in another
        shape would release a payload its mask does not fit. So the two are
        compared before anything is released: on a difference the round fails
        with a sentence naming it, and nothing leaves.
        """
        tensors = self.plan.tensors(name)
        fixed = self.config.plan.round(name).layout
        difference = fixed.difference(Layout.of_tensors(tensors))
        if difference is not None:
            raise SessionFailed(
                f"round {name!r}: the plan's tensors do not have the layout the federation "
                f"config fixes ({difference}); nothing was released"
            )
        return tensors, fixed

    def sleep(self) -> None:
        import time

        time.sleep(self.options.poll_seconds)
