"""The federations that the process tests start from, on top of ``init_federation``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tests.support.processes import Federation, init_federation

# The weak-privacy CAPE construction (noisy fit well posed on these small cohorts).
CAPE_EXTRA = (
    "--construction",
    "cape",
    "--residual-dp",
    "--epsilon",
    "300",
    "--epsilon-budget",
    "3000",
)


def three_cohort_federation(
    out: Path, nodes: Sequence[str], deadline: float, *, extra: Sequence[str] = ()
) -> Federation:
    """``init_federation`` for three nodes with cohorts of 150, 120 and 130 rows and
    one deadline for joins and rounds: the federation most process tests run."""
    if len(nodes) != 3:
        raise ValueError(f"nodes: three_cohort_federation takes three nodes, not {list(nodes)}")
    return init_federation(
        out,
        nodes,
        cohort_sizes=(150, 120, 130),
        join_deadline=deadline,
        round_deadline=deadline,
        extra=extra,
    )
