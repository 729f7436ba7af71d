"""Node a restarted over a folder, and a round-1 bundle left at its approval gate."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from node.egress.release import ReleaseNoise
from node.protocol.masking import pairwise_masks
from node.session.context import NodeOptions
from node.session.egress_steps import (
    release,
)
from proto.federation import FederationConfig
from proto.messages import SessionStatus
from tests.node.nodes import (
    LAYOUT,
    Node,
    joined,
    restarted,
)
from tests.support.made_up_federation import (
    CODEC,
    SENSITIVITIES,
    _config,
    _seeds,
    _tensors,
    release_for,
)

U64 = NDArray[np.uint64]
IDS = ["a", "b", "c", "d"]
CLEAN = LAYOUT.encode(_tensors(0), CODEC)


def _node(
    out: Path,
    config: FederationConfig | None = None,
    *,
    status: SessionStatus | None = None,
    options: NodeOptions | None = None,
    plan: object | None = None,
) -> Node:
    """Node a restarted over ``out``: it knows nothing but what that folder holds."""
    config = config or _config(IDS, threshold=1)
    return restarted(out, config, status=status, options=options, plan=plan)


def _egress(node: Node, participants: Sequence[str], index: int) -> tuple[ReleaseNoise, U64]:
    noise = release_for(node.ctx.config, participants, "a", SENSITIVITIES)
    mask = pairwise_masks(noise, _seeds(IDS)["a"], LAYOUT, round_index=index, codec=CODEC)
    return noise, CLEAN + mask


def _at_gate(out: Path) -> tuple[ReleaseNoise, U64]:
    """Write round 1's bundle the way a node does, then stop at the gate (as if killed)."""
    node = joined(
        out,
        _config(IDS, threshold=1),
        options=NodeOptions(approve="manual", approval_timeout=0.0),
    )
    noise, egress = _egress(node, IDS, 1)
    with pytest.raises(ValueError, match="no approval appeared"):
        release(
            node.ctx,
            index=1,
            name="scatter",
            layout=LAYOUT,
            noise=noise,
            clean=CLEAN,
            egress=egress,
        )
    assert node.ctx.ledger.entries == ()
    return noise, egress
