"""Regenerate (or check) the committed Python stubs for ``proto/zerosum/v1/*.proto``.

Run from anywhere as ``python -m proto.generate``; ``make proto`` does exactly that.
``python -m proto.generate --check`` regenerates into a temporary folder and
compares with the committed files, exiting 1 and naming each stale, missing or
orphaned file, so a test (and CI) can fail when someone edits a ``.proto``
without regenerating.

The compiler runs with ``-I .`` from the repository root, so a generated module
imports its siblings as ``from proto.zerosum.v1 import session_pb2``: the same
path the rest of the project imports them by. Four outputs per ``.proto``:
``*_pb2.py`` (messages), ``*_pb2.pyi`` (message types, mypy-protobuf),
``*_pb2_grpc.py`` (service stub and servicer base) and ``*_pb2_grpc.pyi``
(their types, mypy-protobuf's gRPC plugin).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import sys
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from proto.errors import ProtoError

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = Path("proto") / "zerosum" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


class ProtocError(ProtoError, RuntimeError):
    """protoc (or one of its plugins) failed or could not be found."""


def proto_sources(root: Path = REPO_ROOT) -> list[Path]:
    """The ``.proto`` files to compile, relative to ``root``, sorted."""
    return sorted(p.relative_to(root) for p in (root / PROTO_DIR).glob("*.proto"))


def _plugin(name: str) -> Path:
    # The mypy-protobuf plugins are console scripts installed next to the
    # interpreter running this module (the project's virtualenv).
    candidate = Path(sys.executable).parent / name
    if not candidate.exists():
        raise ProtocError(
            f"protoc plugin {name!r} not found next to {sys.executable}; "
            "install the development extras (mypy-protobuf)."
        )
    return candidate


def generate(out_dir: Path, root: Path = REPO_ROOT) -> list[Path]:
    """Compile every ``.proto`` under ``root`` into ``out_dir``; return the files written.

    Paths in the result are relative to ``out_dir`` (e.g.
    ``proto/zerosum/v1/session_pb2.py``).
    """
    from grpc_tools import protoc

    sources = proto_sources(root)
    if not sources:
        raise ProtocError(f"no .proto files under {root / PROTO_DIR}.")
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        "-I.",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out=quiet:{out_dir}",
        f"--mypy_grpc_out=quiet:{out_dir}",
        *(s.as_posix() for s in sources),
    ]
    previous = Path.cwd()
    try:
        # protoc records paths relative to the include root, so it must run
        # from the repository root for the generated imports to be right.
        os.chdir(root)
        status = protoc.main(args)
    finally:
        os.chdir(previous)
    if status != 0:
        raise ProtocError(f"protoc exited with status {status} compiling {len(sources)} file(s).")
    return committed_stubs(out_dir)


def committed_stubs(root: Path = REPO_ROOT) -> list[Path]:
    """Generated files present under ``root/proto/zerosum/v1``, relative to ``root``."""
    if not (root / PROTO_DIR).is_dir():
        return []
    found = [
        p.relative_to(root)
        for p in (root / PROTO_DIR).iterdir()
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    ]
    return sorted(found)


def stale_files(root: Path = REPO_ROOT) -> list[str]:
    """Names of committed stubs that differ from a fresh generation.

    Covers three cases: content differs, a stub is missing, and a stub has no
    ``.proto`` source any more. An empty list means the stubs are current.
    """
    with tempfile.TemporaryDirectory(prefix="zerosum-proto-") as tmp:
        fresh = set(generate(Path(tmp), root))
        committed = set(committed_stubs(root))
        problems: list[str] = []
        for rel in sorted(fresh | committed):
            if rel not in committed:
                problems.append(f"{rel.as_posix()} (missing)")
            elif rel not in fresh:
                problems.append(f"{rel.as_posix()} (no .proto source)")
            elif not filecmp.cmp(Path(tmp) / rel, root / rel, shallow=False):
                problems.append(f"{rel.as_posix()} (out of date)")
        return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proto.generate",
        description="Regenerate the committed gRPC/protobuf stubs, or check they are current.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 and list stale stubs if regeneration would change anything",
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = stale_files()
        if problems:
            print("stale generated stubs (run `make proto`):", file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
            return 1
        print("generated stubs are current.")
        return 0
    written = generate(REPO_ROOT)
    for rel in written:
        if rel.name.endswith(GENERATED_SUFFIXES):
            print(f"wrote {rel.as_posix()}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
