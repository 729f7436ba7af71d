"""Without a lie the test coordinator is a faithful one: nodes finish with the exact sum."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from noise.fixed_point import wrapping_sum
from tests.adversary.lying_server import Script
from tests.adversary.scenario import Attack, Processes, make_federation

pytestmark = pytest.mark.integration


def test_nodes_complete_a_session_with_the_honest_script(
    tmp_path: Path, processes: Processes
) -> None:
    federation = make_federation(tmp_path / "fed", ("a", "b", "c"))
    attack = Attack(federation, tmp_path / "run", processes, Script())
    attack.start()
    codes = attack.exits()
    attack.serving.stop()
    assert codes == {"a": 0, "b": 0, "c": 0}, attack.describe()
    record = attack.coordinator.round(0)
    assert record is not None and record.aggregate is not None
    assert np.array_equal(
        record.aggregate, wrapping_sum([attack.audit(n, 0) for n in ("a", "b", "c")])
    )
