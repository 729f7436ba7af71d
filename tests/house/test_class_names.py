"""No class name is defined twice in product code.

Two classes of one name in two rooms (a plain ``JoinReceipt`` for the
coordinator and another for the node) are two vocabularies for one thing;
the wire's are in ``proto/messages.py`` alone. ``KNOWN`` lists names allowed
twice with their files; it is empty, and a new entry needs a reason.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = (
    "noise",
    "bounded",
    "proto",
    "node",
    "coordinator",
    "simulations",
    "zerosum",
    "benchmarks",
)

KNOWN: dict[str, set[str]] = {}


def class_names(root: Path) -> dict[str, set[str]]:
    """Every class name defined in product code -> the files defining it."""
    found: dict[str, set[str]] = defaultdict(set)
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    found[node.name].add(path.relative_to(root).as_posix())
    return found


def duplicates(root: Path) -> dict[str, set[str]]:
    return {name: files for name, files in class_names(root).items() if len(files) > 1}


def test_no_class_name_is_defined_twice() -> None:
    assert duplicates(REPO) == KNOWN


def test_a_planted_duplicate_is_caught(tmp_path: Path) -> None:
    for room in ("coordinator", "node"):
        (tmp_path / room).mkdir()
        (tmp_path / room / "receipts.py").write_text("class JoinReceipt:\n    pass\n")
    assert duplicates(tmp_path) == {"JoinReceipt": {"coordinator/receipts.py", "node/receipts.py"}}
