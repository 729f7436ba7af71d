"""This node's self-mask of a round: the uniform pad on every upload, and its seed.

Every upload is y = z + b (mod 2^64), z the released egress (or a CAPE-sum
share) and b = ``noise.self_mask.self_mask(β, layout)`` with β derived from
the saved session key and the round index, so a restarted node adds the very
same b and sends the very same bytes. β leaves only in the round's unmask
answer, once every survivor has signed the same survivor set
(``node.session.unmask_answers``); until then the upload is a one-time pad
(docs/design.md §4.6).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from node.session.context import SessionContext
from noise.layout import Layout
from noise.residual import private_noise_seed
from noise.self_mask import self_mask, self_mask_seed

__all__ = ["private_seed", "round_self_mask_seed", "sent_payload"]


def private_seed(ctx: SessionContext) -> bytes:
    """π_k, the seed of this node's residual and CAPE draws (``noise.residual``).

    Derived from the saved session key, so a restarted node draws the very
    same integers again, and nobody else can derive it.
    """
    return private_noise_seed(
        ctx.ephemeral, config_hash=ctx.config_hash, session_id=ctx.session_id, node_id=ctx.node_id
    )


def round_self_mask_seed(ctx: SessionContext, index: int) -> bytes:
    """β of round ``index``: derived from the saved session key, the same after a restart."""
    return self_mask_seed(
        ctx.ephemeral,
        config_hash=ctx.config_hash,
        session_id=ctx.session_id,
        node_id=ctx.node_id,
        round_index=index,
    )


def sent_payload(
    ctx: SessionContext, index: int, payload: NDArray[np.uint64], layout: Layout
) -> NDArray[np.uint64]:
    """What leaves for ``payload`` in round ``index``: payload + self-mask (mod 2^64)."""
    pad = self_mask(round_self_mask_seed(ctx, index), layout, round_index=index)
    masked: NDArray[np.uint64] = payload + pad
    return masked
