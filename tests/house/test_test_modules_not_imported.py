"""No file imports a test module: what tests share lives in support modules and fixtures.

A test module (``tests/**/test_*.py``) holds tests; pytest collects it. When
another file imports one, its tests' helpers become a library by accident and
a change to one test file silently reaches others. Shared helpers live in
``tests/support/`` or in a non-test module beside the tests that use them
(``tests/coordinator/support.py``), fixtures in the nearest ``conftest.py``.

The check reads every import of every Python file in the repository (also
imports inside functions, ``from tests.x import test_y`` and relative
imports); a planted violation shows it would catch one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_SKIPPED = {".venv", ".git", "build", "dist", "node_modules"}


def _python_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        if not _SKIPPED.intersection(path.relative_to(root).parts):
            yield path


def _module_of(root: Path, path: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return parts


def _is_test_module(root: Path, dotted: str) -> bool:
    parts = dotted.split(".")
    if not parts or parts[0] != "tests" or not parts[-1].startswith("test_"):
        return False
    return root.joinpath(*parts).with_suffix(".py").is_file()


def _imported(root: Path, path: Path, node: ast.AST) -> Iterator[str]:
    """Every dotted module name an import statement may load."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level == 0:
            base = node.module or ""
        else:
            here = _module_of(root, path)
            package = here if path.name == "__init__.py" else here[:-1]
            kept = package[: len(package) - (node.level - 1)]
            base = ".".join([*kept, node.module] if node.module else kept)
        yield base
        yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def imports_of_test_modules(root: Path) -> list[tuple[str, int, str]]:
    """(file, line, test module) for every import of a test module under ``root``."""
    found = []
    for path in _python_files(root):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for name in _imported(root, path, node):
                if _is_test_module(root, name):
                    found.append((path.relative_to(root).as_posix(), node.lineno, name))  # type: ignore[attr-defined]
    return found


def test_no_file_imports_a_test_module() -> None:
    found = imports_of_test_modules(REPO)
    assert found == [], "\n".join(f"{f}:{line} imports {name}" for f, line, name in found)


def test_a_planted_import_of_a_test_module_is_caught(tmp_path: Path) -> None:
    for folder in ("tests", "tests/node", "tests/support", "benchmarks"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "tests/node/test_units.py").write_text("SESSION = 'x'\n\ndef test_a(): pass\n")
    (tmp_path / "tests/support/shared.py").write_text("SESSION = 'x'\n")
    (tmp_path / "tests/node/test_clean.py").write_text(
        "from tests.support.shared import SESSION\nimport tests.support.shared\n"
    )
    assert imports_of_test_modules(tmp_path) == []

    (tmp_path / "tests/node/test_other.py").write_text(
        "from tests.node.test_units import SESSION\n"
    )
    (tmp_path / "tests/node/helpers.py").write_text(
        "def f():\n    from .test_units import SESSION\n    return SESSION\n"
    )
    (tmp_path / "benchmarks/walk.py").write_text(
        "from tests.node import test_units\nimport tests.node.test_units as units\n"
    )
    assert sorted(imports_of_test_modules(tmp_path)) == [
        ("benchmarks/walk.py", 1, "tests.node.test_units"),
        ("benchmarks/walk.py", 2, "tests.node.test_units"),
        ("tests/node/helpers.py", 2, "tests.node.test_units"),
        ("tests/node/test_other.py", 1, "tests.node.test_units"),
    ]
