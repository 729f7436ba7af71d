"""Fixtures every test folder may use: a test's (or a module's) real processes, killed at teardown.

The integration, adversary and campaign tests run the ``zerosum`` command line as separate
processes on 127.0.0.1 — a coordinator with its SQLite state file, and nodes
that hold their own TLS certificates and Ed25519 identity keys — the way TREs
run a session. The machinery is in ``tests/support/`` (:mod:`tests.support.processes`,
:mod:`tests.support.sessions`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import Processes, closed_at_end


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Processes of one test, killed at its teardown whatever happened."""
    yield from closed_at_end(Processes(tmp_path / "logs"))


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    """Processes shared by a module's scenarios, killed when the module is done."""
    yield from closed_at_end(Processes(tmp_path_factory.mktemp("logs")))
