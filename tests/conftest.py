"""Fixtures every test folder may use: a test's (or a module's) real processes, killed at teardown.

The integration, adversary and campaign tests run the ``zerosum`` command line as separate
processes on 127.0.0.1 — a coordinator with its SQLite state file, and nodes
that hold their own TLS certificates and Ed25519 identity keys — the way TREs
run a session. The machinery is in ``tests/support/`` (:mod:`tests.support.processes`,
:mod:`tests.support.sessions`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import Processes, closed_at_end
from tests.support.scheduling import SESSIONS_GROUP, runs_sessions


def pytest_configure(config: pytest.Config) -> None:
    """Let the processes the tests start hear Ctrl-C, however the suite was started.

    A shell that starts a job in the background without job control sets it to
    ignore SIGINT, every process it starts inherits that, and Python then
    leaves SIGINT ignored: the tests that interrupt a node or the coordinator
    would wait for an exit that never comes. A handler (unlike "ignore") is
    reset to the default in every process this one starts.
    """
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``pytest -n 2`` (``make test``): the session modules one at a time on one worker.

    Their sessions of real processes are heavy and some wait for deadlines, so
    they run one after another as they would alone, while the other modules
    run on the other worker, each module as one unit (its fixtures built once).
    """
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class SessionsApart(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SESSIONS_GROUP if runs_sessions(root / module) else module

    return SessionsApart(config, log)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Processes of one test, killed at its teardown whatever happened."""
    yield from closed_at_end(Processes(tmp_path / "logs"))


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    """Processes shared by a module's scenarios, killed when the module is done."""
    yield from closed_at_end(Processes(tmp_path_factory.mktemp("logs")))
