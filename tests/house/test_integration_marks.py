"""Every test module that starts processes through the shared fixtures is marked integration.

The marker says a test starts real servers or processes on 127.0.0.1
(``pytest -m "not integration"`` leaves them out); a module whose tests or
fixtures take ``processes`` or ``module_processes`` (the fixtures the test
scheduler also finds them by, tests/support/scheduling.py) must say so. The
check reads the parameters of every function of every test module; a planted
violation shows it would catch one.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.scheduling import functions_taking_process_fixtures

TESTS = Path(__file__).resolve().parents[1]
INTEGRATION_MARK = re.compile(r"pytest\.mark\.integration\b")


def unmarked_modules(root: Path) -> list[tuple[str, list[str]]]:
    """(module, functions) for every test module taking process fixtures without the marker."""
    missing = []
    for path in sorted(root.rglob("test_*.py")):
        source = path.read_text(encoding="utf-8")
        users = functions_taking_process_fixtures(source)
        if users and INTEGRATION_MARK.search(source) is None:
            missing.append((str(path.relative_to(root)), users))
    return missing


def test_every_module_taking_process_fixtures_is_marked_integration() -> None:
    assert unmarked_modules(TESTS) == []


def test_a_planted_unmarked_module_is_caught(tmp_path: Path) -> None:
    (tmp_path / "test_planted.py").write_text(
        "def test_a_session(processes):\n    pass\n", encoding="utf-8"
    )
    (tmp_path / "test_marked.py").write_text(
        "import pytest\npytestmark = pytest.mark.integration\n"
        "def test_a_session(module_processes):\n    pass\n",
        encoding="utf-8",
    )
    (tmp_path / "test_in_process.py").write_text("def test_x(tmp_path):\n    pass\n")
    assert unmarked_modules(tmp_path) == [("test_planted.py", ["test_a_session"])]
