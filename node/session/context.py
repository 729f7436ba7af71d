"""What every step of a session needs, fixed once the node has joined.

:class:`NodeOptions` says how the node behaves (approval mode, polling,
retries); :class:`SessionContext` is made by ``node.session.joining.join`` and
never changes afterwards: the local setup, the session id, this node's session
key and verified roster, the pairwise seeds, the gateway to the coordinator,
the ledger (kept in the node's state folder, ``state``), and whether this run
resumes a session it joined before a restart.

What the context derives from the saved session key is derived here: the
seed π_k of this node's residual and CAPE draws, and each round's self-mask,
the uniform pad on every upload. Every upload is y = z + b (mod 2^64), z the
released egress (or a CAPE-sum share) and b = ``noise.self_mask.self_mask(β,
layout)`` with β from the session key and the round index, so a restarted
node adds the very same b and sends the very same bytes. β leaves only in the
round's unmask answer, once every survivor has signed the same survivor set
(``node.session.unmask_answers``); until then the upload is a one-time pad
(docs/design.md §4.6).
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
from noise.residual import private_noise_seed
from noise.self_mask import self_mask, self_mask_seed
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

    # Read from ``setup`` once: every step reads them, many inside loops.
    node_id: str = field(init=False)
    config: FederationConfig = field(init=False)
    config_hash: bytes = field(init=False)
    codec: FixedPointCodec = field(init=False)
    identity: IdentityKey = field(init=False)
    out: Path = field(init=False)
    plan: ModelPlan = field(init=False)
    # Ed25519 verdicts on sealed check messages, by (sender, signature, message):
    # the tags opened before the seed leaves are checked again with the aggregate.
    signed_by_sender: dict[tuple[str, bytes, bytes], bool] = field(
        init=False, default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        setup = self.setup
        for name, value in (
            ("node_id", setup.node_id),
            ("config", setup.config),
            ("config_hash", setup.config_hash),
            ("codec", setup.codec),
            ("identity", setup.identity),
            ("out", setup.out),
            ("plan", setup.plan),
        ):
            object.__setattr__(self, name, value)

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

    def private_seed(self) -> bytes:
        """π_k, the seed of this node's residual and CAPE draws (``noise.residual``).

        Derived from the saved session key, so a restarted node draws the very
        same integers again, and nobody else can derive it.
        """
        return private_noise_seed(
            self.ephemeral,
            config_hash=self.config_hash,
            session_id=self.session_id,
            node_id=self.node_id,
        )

    def self_mask_seed(self, index: int) -> bytes:
        """β of round ``index``: derived from the saved session key, the same after a restart."""
        return self_mask_seed(
            self.ephemeral,
            config_hash=self.config_hash,
            session_id=self.session_id,
            node_id=self.node_id,
            round_index=index,
        )

    def sent_payload(
        self, index: int, payload: NDArray[np.uint64], layout: Layout
    ) -> NDArray[np.uint64]:
        """What leaves for ``payload`` in round ``index``: payload + self-mask (mod 2^64)."""
        masked = self_mask(self.self_mask_seed(index), layout, round_index=index)
        np.add(masked, payload, out=masked)  # in the pad's own buffer: one vector, not two
        return masked

    def sleep(self) -> None:
        import time

        time.sleep(self.options.poll_seconds)
