"""A plan whose tensors do not have the config's layout releases nothing.

Masks are drawn for the layout the federation config fixes (before a round's
data exist), so the node compares the plan's tensors with that layout before
it writes an egress bundle: a difference fails the round with a sentence
naming it, and neither a bundle nor an upload leaves the node.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from node.egress.bundle import egress_folder
from node.errors import SessionFailed
from node.protocol.masking import MaskPrefetch
from node.session.model_round import run_model_round
from tests.node.nodes import FakePlan, joined
from tests.support.made_up_federation import _config, _tensors

IDS = ["a", "b", "c"]


class _WrongShapePlan(FakePlan):
    """Round 'scatter' comes out with a sum_x of 3 features where the config fixes 4."""

    def tensors(self, name: str) -> dict[str, np.ndarray]:
        tensors = _tensors(0)
        if name == "scatter":
            tensors["sum_x"] = np.zeros(3)
        return tensors


class _ExtraTensorPlan(FakePlan):
    def tensors(self, name: str) -> dict[str, np.ndarray]:
        return _tensors(0) | {"extra": np.zeros(2)}


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (_WrongShapePlan(), r"tensor 'sum_x' has shape \(3,\); expected \(4,\)"),
        (_ExtraTensorPlan(), r"tensor 'extra' is not part of the layout"),
    ],
)
def test_a_plan_off_the_config_layout_releases_nothing(
    tmp_path: Path, plan: FakePlan, says: str
) -> None:
    node = joined(tmp_path, _config(IDS, threshold=1), plan=plan)
    index = plan.round_names.index("scatter")
    with (
        MaskPrefetch(node.ctx.seeds, node.ctx.codec) as masks,
        pytest.raises(SessionFailed, match=rf"round 'scatter': the plan's tensors .*{says}"),
    ):
        run_model_round(
            node.ctx, node.progress, masks, index=index, name="scatter", participants=tuple(IDS)
        )
    assert node.coordinator.sent == []
    assert not egress_folder(tmp_path, index).exists()


def test_the_config_layout_is_what_the_round_uses(tmp_path: Path) -> None:
    node = joined(tmp_path, _config(IDS, threshold=1))
    tensors, layout = node.ctx.round_tensors("scatter")
    assert layout == node.ctx.config.plan.round("scatter").layout
    assert set(tensors) == {s.name for s in layout}
