"""Fixtures of the simulation tests: a tiny sweep configuration in the test's folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.sweeps import write_tiny_config


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    return write_tiny_config(tmp_path)
