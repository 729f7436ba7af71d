"""Fixtures of the attack tests: node processes killed at each test's end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversary.scenario import Processes
from tests.support.processes import closed_at_end


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Processes and servers of one test, ended at its teardown whatever happened."""
    yield from closed_at_end(Processes(tmp_path / "logs"))
