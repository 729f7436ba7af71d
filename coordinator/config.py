"""What the coordinator needs from the federation config, and the round plan.

The coordinator aggregates named tensors and knows nothing of what they mean;
from the federation config it takes only identities, the minimum number of
nodes, deadlines, the fixed-point scale, the noise construction, and the plan's
public rounds: their names and payload layouts, in order. :class:`SessionConfig`
holds exactly that, so the state machine can be driven in tests without a TOML
file. Every upload must carry exactly its round's public layout; nothing a
member sends can change it.

Round plan. Every plan round is one secure sum. Under the pairwise
construction the coordinator runs the plan's rounds in order. Under CAPE
(Imtiaz, Mohammadi & Sarwate 2019, arXiv 1904.10059) each plan round is
preceded by a secure-sum round "cape-sum/<name>" of the same layout, in which
the nodes learn the sum of their private draws ê_k; round indices count every
round of that list from 0.

A dropout in a CAPE model round cannot be repaired by unmasking: the zero-sum
noise e_k = q(ê_k) − share_k(S) cancels only over the nodes that contributed
to S. The coordinator then marks the round *superseded* and reruns the CAPE
sum among the survivors, followed by the model round again, under the next
round indices; so nodes learn the next round's index and name from the
coordinator (``GetStatus``) rather than from a fixed list.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from noise.layout import Layout
from proto.rounds import RoundRef

if TYPE_CHECKING:
    from proto.federation import FederationConfig

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "SessionConfig",
]

# 8 GiB: about 10^9 parameters per payload, far above any model here, but a
# bound on what one authenticated node can make the coordinator store.
DEFAULT_MAX_PAYLOAD_BYTES = 8 << 30


@dataclass(frozen=True)
class SessionConfig:
    """The coordinator's view of a federation: ids, keys, thresholds, deadlines, rounds.

    Times are milliseconds. ``unmask_timeout_ms`` defaults to the round timeout.
    """

    federation_id: str
    config_hash: bytes
    identity_keys: Mapping[str, bytes]
    min_nodes: int
    join_timeout_ms: int
    round_timeout_ms: int
    # The plan's rounds in order, each with its public payload layout.
    rounds: Mapping[str, Layout]
    fixed_point_bits: int
    construction: str = "pairwise"
    unmask_timeout_ms: int | None = None
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    # Superseded attempts allowed per plan round (session.max_reruns).
    max_reruns: int = 2
    node_ids: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "identity_keys", dict(self.identity_keys))
        object.__setattr__(self, "node_ids", tuple(sorted(self.identity_keys)))
        if len(self.config_hash) != 32:
            raise ValueError(f"config_hash must be 32 bytes; got {len(self.config_hash)}.")
        if not 1 <= self.min_nodes <= len(self.node_ids):
            raise ValueError(
                f"min_nodes = {self.min_nodes}: must be between 1 and the "
                f"{len(self.node_ids)} nodes of the federation."
            )
        if self.construction not in ("pairwise", "cape"):
            raise ValueError(f"construction = {self.construction!r}: must be 'pairwise' or 'cape'.")
        object.__setattr__(self, "rounds", dict(self.rounds))
        if not self.rounds:
            raise ValueError("rounds: the plan must name at least one round.")
        for name, layout in self.rounds.items():
            if RoundRef.parse(name).is_cape_sum or not isinstance(layout, Layout):
                raise ValueError(f"rounds[{name!r}]: a plan round name with its Layout.")
        for name in ("join_timeout_ms", "round_timeout_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} = {getattr(self, name)}: must be positive.")
        if self.unmask_timeout_ms is None:
            object.__setattr__(self, "unmask_timeout_ms", self.round_timeout_ms)

    @property
    def unmask_timeout(self) -> int:
        """Milliseconds an unmask attempt stays open."""
        return int(self.unmask_timeout_ms or self.round_timeout_ms)

    @property
    def round_names(self) -> tuple[str, ...]:
        """The plan's round names, in order."""
        return tuple(self.rounds)

    def plan(self) -> tuple[str, ...]:
        """Round names in order, without reruns."""
        if self.construction == "cape":
            return tuple(
                n for name in self.round_names for n in (RoundRef.cape_sum(name).name, name)
            )
        return self.round_names

    def layout(self, round_name: str) -> Layout:
        """The public payload layout of ``round_name`` (a CAPE sum has its model round's)."""
        return self.rounds[RoundRef.parse(round_name).model_round]

    def next_round_name(self, previous: str | None, *, superseded: bool = False) -> str | None:
        """The round that follows ``previous`` (None: the first), or None after the last.

        A superseded CAPE model round is followed by its CAPE sum again.
        """
        plan = self.plan()
        if previous is None:
            return plan[0]
        position = plan.index(previous)
        if superseded:
            return plan[position - 1]
        return plan[position + 1] if position + 1 < len(plan) else None

    @classmethod
    def from_federation(
        cls,
        config: FederationConfig,
        config_hash: bytes,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> SessionConfig:
        """The coordinator's view of a parsed federation config."""
        return cls(
            federation_id=config.federation_id,
            config_hash=config_hash,
            identity_keys=config.identity_keys,
            min_nodes=config.min_nodes,
            join_timeout_ms=math.ceil(config.session.join_deadline_seconds * 1000),
            round_timeout_ms=math.ceil(config.session.round_deadline_seconds * 1000),
            construction=config.privacy.noise_design.construction,
            rounds={spec.name: spec.layout for spec in config.plan.rounds},
            fixed_point_bits=config.fixed_point_bits,
            max_payload_bytes=max_payload_bytes,
            max_reruns=config.session.max_reruns,
        )
