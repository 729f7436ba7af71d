"""Which test modules run sessions of real processes: found in their source, for the scheduler.

``make test`` runs the suite on two pytest-xdist workers. The modules whose
tests or fixtures take the ``processes`` or ``module_processes`` fixture
start a coordinator and nodes as separate processes, and some wait for
deadlines; they run one after another on one worker, as they would alone,
while every other module (in-process servers included) runs as one unit on
whichever worker is free (tests/conftest.py). xdist's scheduler sees node
ids only, so the fixtures are read from the module's source.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

__all__ = [
    "PROCESS_FIXTURES",
    "SESSIONS_GROUP",
    "functions_taking_process_fixtures",
    "runs_sessions",
]

SESSIONS_GROUP = "sessions"
# The fixtures of tests/conftest.py that start processes for a test or a module.
PROCESS_FIXTURES = frozenset({"processes", "module_processes"})


def functions_taking_process_fixtures(source: str) -> list[str]:
    """Names of the functions in ``source`` with a process fixture among their parameters."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if {a.arg for a in arguments} & PROCESS_FIXTURES:
                found.append(node.name)
    return found


@cache
def runs_sessions(module: Path) -> bool:
    """Whether the test module at ``module`` takes a process fixture anywhere."""
    try:
        source = module.read_text(encoding="utf-8")
    except OSError:
        return False
    return bool(functions_taking_process_fixtures(source))
