"""The layering rules between the packages, checked on every import of every module.

* ``bounded`` (the bounded readers of local files and nested text) imports
  only the standard library, so every other package may use it;
* ``noise`` is pure math and crypto: it imports none of ``bounded`` (it reads no
  files), ``node``, ``coordinator``, ``proto``, ``simulations``, ``zerosum``, gRPC
  or scikit-learn;
* ``proto`` (the wire protocol, the federation config, payload layouts) imports
  none of ``node``, ``coordinator``, ``simulations``, ``zerosum``;
* ``coordinator`` knows nothing of brain age nor of the command line: no ``node``
  (so no ``node.deltab``), no ``simulations``, no ``zerosum``;
* ``node`` imports no ``coordinator``, ``simulations`` or ``zerosum``, and
  ``node.deltab`` (the brain-age model, used by ``zerosum deltab``) no gRPC,
  ``proto`` or scikit-learn either, so it starts small inside a TRE (its tables
  and model files are read with ``bounded``);
* ``simulations`` never touch the protocol: no ``proto``, ``coordinator``,
  ``zerosum`` or gRPC;
* inside ``node``: ``node.records`` sits at the bottom, ``node.egress`` above
  it, ``node.protocol`` (the node's side of the protocol: the gateway and its
  gRPC client, roster, statements, masks, unmask) above both, and the session
  steps, the plans and the output checker's review above all three; so
  ``node.protocol`` imports none of ``node.session``, ``node.review``,
  ``node.plans``, ``node.deltab`` or ``node.runner``, and neither
  ``node.records`` nor ``node.egress`` imports ``node.protocol``;
* the node's generic rooms — ``node.session``, ``node.review``, ``node.egress``,
  ``node.records`` and the runner ``node.runner`` — import no specific plan
  (``node.plans.deltab``, ``node.plans.logreg`` or any other): only the plan
  interface ``node.plans.interface`` and the registry ``node.plans.registry``,
  through which they reach the plan a federation names.

Only ``zerosum`` (the command) and ``benchmarks`` may import both node and
coordinator. Only the converter (``proto.convert``, with ``proto.chunks`` for
the payload streams), the gRPC client (``node.protocol.client``), the server
(``coordinator.server``) and the stubs themselves import
the generated ``proto.zerosum`` modules: everything else speaks the plain
messages of ``proto.messages``. The check reads every module's imports (also
those inside functions); a planted violation shows it would catch one.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Package (or subpackage) -> top-level names (or dotted prefixes) it must not import.
_PROJECT = ("bounded", "noise", "node", "coordinator", "proto", "simulations", "zerosum")
RULES: Mapping[str, tuple[str, ...]] = {
    "bounded": (*_PROJECT[1:], "benchmarks", "numpy", "scipy", "cryptography", "grpc", "sklearn"),
    "noise": (
        "bounded",
        "node",
        "coordinator",
        "proto",
        "simulations",
        "zerosum",
        "grpc",
        "sklearn",
    ),
    "proto": ("node", "coordinator", "simulations", "zerosum"),
    "coordinator": ("node", "simulations", "zerosum"),
    "node": ("coordinator", "simulations", "zerosum"),
    "node.deltab": ("coordinator", "simulations", "zerosum", "grpc", "proto", "sklearn"),
    "simulations": ("proto", "coordinator", "zerosum", "grpc"),
    # The node's rooms: records at the bottom (of egress only the receipt's
    # number format and layouts), egress above it, the protocol above both,
    # the session steps and the output checker's review above all three.
    "node.records": (
        "coordinator",
        "simulations",
        "zerosum",
        "node.session",
        "node.review",
        "node.plans",
        "node.deltab",
        "node.runner",
        "node.protocol",
        "node.egress.bundle",
        "node.egress.release",
        "node.egress.budget",
        "node.egress.approval",
        "node.egress.audit",
        "node.egress.pinned_noise",
    ),
    "node.egress": (
        "coordinator",
        "simulations",
        "zerosum",
        "node.session",
        "node.review",
        "node.deltab",
        "node.runner",
        "node.protocol",
    ),
    "node.protocol": (
        "coordinator",
        "simulations",
        "zerosum",
        "node.session",
        "node.review",
        "node.plans",
        "node.deltab",
        "node.runner",
    ),
}


# The node's generic rooms (packages, or a module) and the only plan modules they may import.
PLAN_NEUTRAL = ("node.session", "node.review", "node.egress", "node.records", "node.runner")
PLAN_ENTRANCES = ("node.plans.interface", "node.plans.registry")


# The generated stubs (proto/zerosum/v1/*_pb2*) and the modules that may import them.
STUBS = "proto.zerosum"
STUB_IMPORTERS = frozenset(
    {"proto.convert", "proto.chunks", "node.protocol.client", "coordinator.server"}
)
PRODUCT = (
    "bounded",
    "noise",
    "proto",
    "node",
    "coordinator",
    "simulations",
    "zerosum",
    "benchmarks",
)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module a (possibly relative) ``from ... import`` names."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports(root: Path, package: str, *, names: bool = False) -> Iterator[tuple[str, int, str]]:
    """(module, line, imported module) for every import statement under ``root/package``.

    ``package`` is a folder or a single module. With ``names``, ``from m import x``
    also yields ``m.x`` (``x`` may be a submodule: ``from node.plans import deltab``).
    """
    folder = root.joinpath(*package.split("."))
    single = folder.with_suffix(".py")
    paths = sorted(folder.rglob("*.py")) if folder.is_dir() else [single] * single.is_file()
    for path in paths:
        if "_pb2" in path.name:
            continue
        module = _module_name(root, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield module, node.lineno, alias.name
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node, path.name == "__init__.py")
                yield module, node.lineno, base
                if names:
                    for alias in node.names:
                        yield module, node.lineno, f"{base}.{alias.name}"


def _forbidden(imported: str, banned: tuple[str, ...]) -> bool:
    return any(imported == b or imported.startswith(b + ".") for b in banned)


def violations(root: Path, rules: Mapping[str, tuple[str, ...]] = RULES) -> list[str]:
    """Every import that breaks a rule, as ``module:line imports name``."""
    found = []
    for package, banned in rules.items():
        if not root.joinpath(*package.split(".")).is_dir():
            continue
        for module, line, imported in imports(root, package):
            if _forbidden(imported, banned):
                found.append(f"{module}:{line} imports {imported} ({package} must not)")
    return sorted(set(found))


def plan_violations(root: Path) -> list[str]:
    """Every import of a specific plan by a generic room of the node, as ``module:line``."""
    found = []
    for room in PLAN_NEUTRAL:
        for module, line, imported in imports(root, room, names=True):
            # node.plans itself (the package's docstring) names no plan.
            specific = imported.startswith("node.plans.")
            if specific and not _forbidden(imported, PLAN_ENTRANCES):
                found.append(f"{module}:{line} imports {imported} (only the plan interface)")
    return sorted(set(found))


def stub_violations(root: Path) -> list[str]:
    """Every import of the generated stubs by a module not allowed to, as ``module:line``."""
    found = []
    for package in PRODUCT:
        if not (root / package).is_dir():
            continue
        for module, line, imported in imports(root, package):
            if module in STUB_IMPORTERS or module == STUBS or module.startswith(STUBS + "."):
                continue
            if _forbidden(imported, (STUBS,)):
                found.append(f"{module}:{line} imports {imported} (only the converter may)")
    return sorted(set(found))


def test_every_package_keeps_its_import_rules() -> None:
    assert violations(REPO) == []


def test_only_the_converter_the_client_and_the_server_import_the_stubs() -> None:
    assert stub_violations(REPO) == []
    # The rule is about something: each module allowed to import the stubs does.
    importers = {m for p in PRODUCT for m, _, i in imports(REPO, p) if _forbidden(i, (STUBS,))}
    assert importers >= STUB_IMPORTERS


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("zerosum/inprocess.py", "from proto.zerosum.v1 import session_pb2 as pb\n"),
        ("node/session/planted.py", "def f():\n    import proto.zerosum.v1.session_pb2\n"),
        ("proto/planted.py", "from .zerosum.v1 import session_pb2_grpc\n"),
        ("node/protocol/planted.py", "from proto.zerosum.v1 import session_pb2 as pb\n"),
    ],
)
def test_a_planted_stub_import_is_caught(tmp_path: Path, path: str, source: str) -> None:
    target = tmp_path / path
    target.parent.mkdir(parents=True)
    for parent in [target.parent, *target.parent.parents]:
        if parent == tmp_path:
            break
        (parent / "__init__.py").write_text("")
    target.write_text(source)
    found = stub_violations(tmp_path)
    assert any(line.startswith(_module_name(tmp_path, target) + ":") for line in found), found


def test_every_package_of_the_rules_exists() -> None:
    for package in RULES:
        assert REPO.joinpath(*package.split(".")).is_dir(), package
    for room in PLAN_NEUTRAL:
        folder = REPO.joinpath(*room.split("."))
        assert folder.is_dir() or folder.with_suffix(".py").is_file(), room


def test_the_generic_rooms_import_no_specific_plan() -> None:
    assert plan_violations(REPO) == []
    # The rule is about something: the generic rooms do reach the plans, through the interface.
    reached = {i for r in PLAN_NEUTRAL for _, _, i in imports(REPO, r) if i in PLAN_ENTRANCES}
    assert reached == set(PLAN_ENTRANCES)


@pytest.mark.parametrize(
    ("path", "source", "names"),
    [
        (
            "node/session/planted.py",
            "from node.plans.deltab.plan import PLAN\n",
            "node.plans.deltab",
        ),
        ("node/review/planted.py", "from node.plans import logreg\n", "node.plans.logreg"),
        ("node/review/planted.py", "from ..plans.deltab import units\n", "node.plans.deltab"),
        ("node/egress/planted.py", "def f():\n    import node.plans.deltab.units\n", "node.plans"),
        ("node/records/planted.py", "from node.plans.ridge import PLAN\n", "node.plans.ridge"),
        ("node/runner.py", "from node.plans.deltab.summary_release import release\n", "node."),
    ],
)
def test_a_planted_plan_import_is_caught(
    tmp_path: Path, path: str, source: str, names: str
) -> None:
    target = tmp_path / path
    target.parent.mkdir(parents=True)
    for parent in [target.parent, *target.parent.parents]:
        if parent == tmp_path:
            break
        (parent / "__init__.py").write_text("")
    target.write_text(source)
    found = plan_violations(tmp_path)
    module = _module_name(tmp_path, target)
    assert any(line.startswith(f"{module}:") and f"imports {names}" in line for line in found)


def test_the_plan_interface_and_the_registry_may_be_imported(tmp_path: Path) -> None:
    target = tmp_path / "node" / "session" / "planted.py"
    target.parent.mkdir(parents=True)
    for folder in (tmp_path / "node", target.parent):
        (folder / "__init__.py").write_text("")
    target.write_text(
        "from node.plans.interface import ModelPlan\nfrom node.plans import registry\n"
        "from ..plans.registry import plan_for\n"
    )
    assert plan_violations(tmp_path) == []


@pytest.mark.parametrize(
    ("package", "source", "names"),
    [
        ("coordinator", "from node.deltab import model\n", "node.deltab"),
        ("coordinator", "def f():\n    import zerosum.pki\n", "zerosum.pki"),
        ("noise", "import grpc\n", "grpc"),
        ("noise", "from proto.federation import config_hash\n", "proto.federation"),
        ("noise", "from bounded.files import read_secret\n", "bounded.files"),
        ("bounded", "import numpy as np\n", "numpy"),
        ("bounded", "from proto.errors import ProtoError\n", "proto.errors"),
        ("node", "from coordinator.session import Session\n", "coordinator.session"),
        ("node/deltab", "from ..client import GrpcGateway\nimport grpc\n", "grpc"),
        ("node/deltab", "import proto.chunks\n", "proto.chunks"),
        ("simulations", "from proto import chunks\n", "proto"),
        ("proto", "from node import errors\n", "node"),
        (
            "node/records",
            "from node.session.context import SessionContext\n",
            "node.session.context",
        ),
        ("node/records", "from ..egress.budget import Budget\n", "node.egress.budget"),
        ("node/records", "from node.plans import registry\n", "node.plans"),
        ("node/egress", "from node.review import report\n", "node.review"),
        ("node/egress", "from ..session import results\n", "node.session"),
        ("node/egress", "import node.runner\n", "node.runner"),
        ("node/egress", "from node.protocol import masking\n", "node.protocol"),
        ("node/records", "from ..protocol.roster import VerifiedRoster\n", "node.protocol.roster"),
        (
            "node/protocol",
            "from node.session.context import SessionContext\n",
            "node.session.context",
        ),
        ("node/protocol", "from ..review import report\n", "node.review"),
        ("node/protocol", "from node.plans import registry\n", "node.plans"),
        ("node/protocol", "def f():\n    import node.runner\n", "node.runner"),
        ("node/protocol", "from node.deltab import model\n", "node.deltab"),
    ],
)
def test_a_planted_violation_is_caught(
    tmp_path: Path, package: str, source: str, names: str
) -> None:
    folder = tmp_path.joinpath(*package.split("/"))
    folder.mkdir(parents=True)
    for parent in [folder, *folder.parents]:
        if parent == tmp_path:
            break
        (parent / "__init__.py").write_text("")
    (folder / "planted.py").write_text(source)
    found = violations(tmp_path)
    assert any(f"imports {names} " in line for line in found), found


def test_relative_imports_are_resolved() -> None:
    tree = ast.parse("from ..client import GrpcGateway\nfrom . import sums\n")
    first, second = (n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert _resolve("node.deltab.model", first, is_package=False) == "node.client"
    assert _resolve("node.deltab.model", second, is_package=False) == "node.deltab"
    assert _resolve("node.deltab", first, is_package=True) == "node.client"


def test_importing_noise_or_node_deltab_loads_no_forbidden_package() -> None:
    """At run time too: the packages these import in turn stay within the rules."""
    modules = sorted(
        _module_name(REPO, path)
        for folder in ("noise", "node/deltab")
        for path in (REPO / folder).glob("*.py")
    )
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert "noise.keys" in loaded and "node.deltab.model" in loaded
    heavy = ("grpc", "sklearn", "coordinator", "proto", "zerosum", "simulations")
    # Importing bounded.files loads the (empty) proto package itself, and nothing else of proto.
    assert [m for m in loaded if m != "proto" and _forbidden(m, heavy)] == []
