"""Fixtures of the attack tests: node processes killed at each test's end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversary.scenario import Processes


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Processes and servers of one test, ended at its teardown whatever happened."""
    spawned = Processes(tmp_path / "logs")
    try:
        yield spawned
    finally:
        spawned.close()
