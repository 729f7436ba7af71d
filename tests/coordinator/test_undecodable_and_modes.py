"""Bytes that are no request, and who may read the coordinator's state file.

Against a real mutual-TLS server on 127.0.0.1 over a real SQLite state file:

* request bytes that do not decode as the method's message are answered
  INVALID_ARGUMENT with a sentence naming the method (gRPC alone says
  INTERNAL, as if the coordinator had failed), for a unary call and for a
  stream, and the state is unchanged: the other nodes go on;
* ``state.sqlite`` and its ``-wal``/``-shm`` companions are 0600 from the
  start, and a state file an earlier run left 0644 is taken to 0600.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
import pytest

from coordinator.store import Store
from tests.coordinator.server_harness import Certificates, certificates, code_of, start_limited

__all__ = ["certificates"]

pytestmark = pytest.mark.integration

# A field-1 length prefix running past the end: no protobuf message parses it.
GARBAGE = b"\x0a\xff\xff\xff\x0f\x01"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_undecodable_bytes_are_invalid_argument(tmp_path: Path, certificates: Certificates) -> None:
    h = start_limited(tmp_path, certificates)
    try:
        for node in ("a", "b", "c"):
            h.join(node)
        h.stub("a")
        channel = h.channels[-1]
        join = channel.unary_unary("/zerosum.v1.Coordinator/Join")
        code, details = code_of(lambda: join(GARBAGE, timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert details.startswith(f"Join: the request's {len(GARBAGE)} bytes do not decode"), (
            details
        )

        upload = channel.stream_unary("/zerosum.v1.Coordinator/UploadEgress")
        code, details = code_of(lambda: upload(iter([GARBAGE]), timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert "UploadEgress of node 'a'" in details and "do not decode" in details, details
        assert h.server.guard.slots.held("a") == 0
        # Nothing was stored: the session goes on, 'a' still on its roster.
        assert [m.node_id for m in h.session.store.members()] == ["a", "b", "c"]
    finally:
        h.close()


def test_the_state_file_and_its_wal_are_private(tmp_path: Path, certificates: Certificates) -> None:
    h = start_limited(tmp_path, certificates)
    try:
        for node in ("a", "b", "c"):
            h.join(node)
        state = tmp_path / "state.sqlite"
        companions = [state.with_name(state.name + s) for s in ("-wal", "-shm")]
        assert all(p.exists() for p in companions)
        for path in (state, *companions):
            assert _mode(path) == 0o600, f"{path.name} is {_mode(path):o}"
    finally:
        h.close()


def test_a_world_readable_state_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "old" / "state.sqlite"
    Store(path).close()
    for found in path.parent.glob("state.sqlite*"):
        os.chmod(found, 0o644)
    Store(path).close()
    for found in path.parent.glob("state.sqlite*"):
        if found.name.endswith(".lock"):
            continue
        assert _mode(found) == 0o600, f"{found.name} is {_mode(found):o}"
