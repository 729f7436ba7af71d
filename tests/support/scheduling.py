"""Which test modules start real processes: read from their text, for the test scheduler.

``make test`` runs the suite on two pytest-xdist workers. The modules marked
``integration`` (they start a coordinator, nodes, the command line or servers
on 127.0.0.1; some wait for deadlines) run one after another on one worker,
as they would alone, while the in-process tests run on the other
(tests/conftest.py). xdist's scheduler sees node ids, not markers, so the
marker is read from the module's text; tests/house/test_integration_marks.py
holds every module that takes the process fixtures to carrying it.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

__all__ = ["INTEGRATION_GROUP", "INTEGRATION_MARK", "PROCESS_FIXTURES", "marked_integration"]

INTEGRATION_MARK = re.compile(r"pytest\.mark\.integration\b")
INTEGRATION_GROUP = "integration"
# The fixtures of tests/conftest.py that start processes for a test or a module.
PROCESS_FIXTURES = frozenset({"processes", "module_processes"})


@cache
def marked_integration(module: Path) -> bool:
    """Whether the test module at ``module`` carries the integration marker anywhere."""
    try:
        return INTEGRATION_MARK.search(module.read_text(encoding="utf-8")) is not None
    except OSError:
        return False
