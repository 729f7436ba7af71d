"""Fixtures shared by the coordinator's session tests: a fake clock and a fresh state file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.session import Session
from coordinator.store import Store
from tests.coordinator.support import FakeClock, Federation, make_federation


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fed() -> Federation:
    return make_federation(("a", "b", "c"), min_nodes=2)


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    return tmp_path / "coordinator" / "state.sqlite"


@pytest.fixture
def session(fed: Federation, state_path: Path, clock: FakeClock) -> Iterator[Session]:
    store = Store(state_path)
    yield Session(store, fed.config, clock=clock)
    store.close()
