"""The committed gRPC/protobuf stubs must match their .proto sources."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proto import generate


def test_committed_stubs_are_current() -> None:
    problems = generate.stale_files()
    assert problems == [], "stale stubs; run `make proto`:\n" + "\n".join(problems)


def test_check_mode_exits_zero_when_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--check"]) == 0
    assert "current" in capsys.readouterr().out


@pytest.fixture
def copy_of_repo(tmp_path: Path) -> Path:
    source = generate.REPO_ROOT / generate.PROTO_DIR
    target = tmp_path / generate.PROTO_DIR
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_check_names_every_kind_of_stale_stub(copy_of_repo: Path) -> None:
    folder = copy_of_repo / generate.PROTO_DIR
    proto = folder / "session.proto"
    proto.write_text(
        proto.read_text().replace(
            "message GetStatusRequest {\n  string session_id = 1;\n}",
            "message GetStatusRequest {\n  string session_id = 1;\n  bool verbose = 2;\n}",
        )
    )
    (folder / "session_pb2_grpc.pyi").unlink()
    (folder / "retired_pb2.py").write_text("# left behind\n")
    problems = generate.stale_files(copy_of_repo)
    assert "proto/zerosum/v1/session_pb2.py (out of date)" in problems
    assert "proto/zerosum/v1/session_pb2_grpc.pyi (missing)" in problems
    assert "proto/zerosum/v1/retired_pb2.py (no .proto source)" in problems
    # The gRPC stub does not depend on message fields, so it stays current.
    assert not any(p.startswith("proto/zerosum/v1/session_pb2_grpc.py ") for p in problems)


def test_generate_writes_importable_paths(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert [p.as_posix() for p in written] == [
        "proto/zerosum/v1/session_pb2.py",
        "proto/zerosum/v1/session_pb2.pyi",
        "proto/zerosum/v1/session_pb2_grpc.py",
        "proto/zerosum/v1/session_pb2_grpc.pyi",
    ]
    stub = (tmp_path / "proto/zerosum/v1/session_pb2_grpc.py").read_text()
    assert "from proto.zerosum.v1 import session_pb2" in stub


def test_no_sources_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(generate.ProtocError, match=r"no \.proto files"):
        generate.generate(tmp_path / "out", root=tmp_path)
