"""noise/ stays pure: it never imports the protocol, transport or model layers."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import noise

NOISE_DIR = Path(noise.__file__).resolve().parent
REPO_ROOT = NOISE_DIR.parent
FORBIDDEN = ("grpc", "proto", "node", "coordinator", "sklearn")


def _noise_modules() -> list[str]:
    return sorted(
        "noise" if path.stem == "__init__" else f"noise.{path.stem}"
        for path in NOISE_DIR.glob("*.py")
    )


def _is_forbidden(module: str) -> bool:
    top = module.split(".", maxsplit=1)[0]
    return top in FORBIDDEN


def test_the_modules_under_test_exist() -> None:
    modules = _noise_modules()
    for expected in ("noise.keys", "noise.seeds", "noise.stream", "noise.fixed_point"):
        assert expected in modules


def test_importing_noise_loads_no_forbidden_package() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for name in {_noise_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert "noise.keys" in loaded  # the subprocess really imported noise/
    assert [m for m in loaded if _is_forbidden(m)] == []


def test_no_noise_source_imports_a_forbidden_package() -> None:
    offenders: list[str] = []
    for path in sorted(NOISE_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [
                f"{path.name}:{node.lineno} imports {n}" for n in names if _is_forbidden(n)
            ]
    assert offenders == []


def test_the_static_check_would_catch_an_offender() -> None:
    assert _is_forbidden("grpc.aio")
    assert _is_forbidden("proto.zerosum.v1.session_pb2")
    assert _is_forbidden("sklearn")
    assert not _is_forbidden("numpy")
    assert not _is_forbidden("noise.nodes")
