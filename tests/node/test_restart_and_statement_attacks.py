"""Lying coordinators, crashes and second processes around node restarts and upload statements.

Each test drives the runner (or the session store) the way a lying
coordinator, a crash or a second process would, and names what it stops:

* an aggregate that counts a node whose pair terms this node revealed when
  the coordinator reported it dropped (the coordinator then holds that
  node's upload and the terms that strip its noise);
* an aggregate that leaves out a node whose pair terms this node never
  revealed (its mask terms with that node are still in the sum);
* a round aggregated while the node was down that counts another payload of
  this node than the bundle it wrote;
* a node that refused an unmask request, was restarted, and would have
  cooperated again in the same session;
* two processes running one node on one output folder;
* a half-written copy of the session key left behind by ``kill -9``;
* a federation file without a pinned reference stream, which used to skip
  the stream check without a word.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from node.release import ReleaseNoise
from node.runner import NodeRefused, NodeRunner, SessionFailed
from node.session_state import KEY_FILE, SessionStateError, SessionStore
from node.statements import sign_upload_statement
from noise.keys import EphemeralKey
from noise.layout import payload_digest
from proto.federation import load_federation
from proto.zerosum.v1 import session_pb2 as pb
from tests.node.test_runner_restart import IDS, LAYOUT, AnsweringClient, _at_gate, _node, _Plan
from tests.node.test_runner_units import SESSION, _identities
from tests.node.test_unmask_safety import CONFIG_HASH, _answer, _released, _request
from zerosum.commands import federation as federation_command

ROSTER_HASH = bytes(range(32))
KEYS = _identities(IDS)
AGGREGATE = np.arange(LAYOUT.size, dtype=np.uint64)


def _digest(node: str) -> bytes:
    return bytes([ord(node)]) * 32


def _statement(node: str, index: int, sha256: bytes) -> pb.UploadStatement:
    return pb.UploadStatement(
        node_id=node,
        round_name="scatter",
        roster_hash=ROSTER_HASH,
        payload_sha256=sha256,
        signature=sign_upload_statement(
            KEYS[node],
            config_hash=CONFIG_HASH,
            session_id=SESSION,
            round_index=index,
            round_name="scatter",
            roster_hash=ROSTER_HASH,
            payload_sha256=sha256,
        ),
    )


def _ready(
    index: int, survivors: Sequence[str], digests: dict[str, bytes] | None = None
) -> pb.ResultHeader:
    """A READY header whose statements are validly signed by every survivor."""
    digests = digests or {}
    return pb.ResultHeader(
        session_id=SESSION,
        round_index=index,
        round_name="scatter",
        status=pb.ROUND_STATUS_READY,
        survivor_node_ids=list(survivors),
        statements=[_statement(n, index, digests.get(n, _digest(n))) for n in survivors],
    )


class ResultClient(AnsweringClient):
    """Also serves one round's result, and knows what this process uploaded."""

    def __init__(self, header: pb.ResultHeader, uploaded: bytes | None) -> None:
        super().__init__()
        self.header = header
        self.uploaded = uploaded

    def get_result(self, session_id: str, round_index: int) -> tuple[pb.ResultHeader, Any]:
        return self.header, AGGREGATE

    def uploaded_sha256(self, session_id: str, round_index: int) -> bytes | None:
        return self.uploaded


class ReceivingPlan(_Plan):
    def __init__(self) -> None:
        self.received: list[str] = []

    def receive(self, name: str, tensors: dict[str, Any]) -> None:
        self.received.append(name)


def _awaiting(out: Path) -> tuple[NodeRunner, ReleaseNoise]:
    """Node a after releasing round 1, past its roster."""
    runner = _node(out)
    runner.roster = SimpleNamespace(roster_hash=ROSTER_HASH)  # type: ignore[assignment]
    return runner, _released(runner, IDS, [1])


def _serve(runner: NodeRunner, header: pb.ResultHeader, uploaded: bytes | None) -> None:
    runner.client = ResultClient(header, uploaded)  # type: ignore[assignment]


# ---------------------------------------------------------------- the nodes an aggregate counts


def test_an_aggregate_counting_a_node_reported_dropped_is_refused(tmp_path: Path) -> None:
    runner, noise = _awaiting(tmp_path)
    # The coordinator says d missed the deadline; a attests and sends its pair terms with d.
    _answer(runner, _request(IDS, 1, ["a", "b", "c"], ["d"]), IDS, noise, awaiting=1)
    # Then it publishes the sum over all four, d's upload included, with d's valid statement.
    _serve(runner, _ready(1, IDS), _digest("a"))
    with pytest.raises(SessionFailed, match=r"counts \{d\}, whose pair terms with me I revealed"):
        runner._await_result(1, "scatter", LAYOUT, tuple(IDS), noise)


def test_an_aggregate_leaving_out_a_node_never_unmasked_is_refused(tmp_path: Path) -> None:
    runner, noise = _awaiting(tmp_path)
    _serve(runner, _ready(1, ["a", "b", "c"]), _digest("a"))
    with pytest.raises(SessionFailed, match=r"leaves out \{d\}, but I revealed no pair terms"):
        runner._await_result(1, "scatter", LAYOUT, tuple(IDS), noise)


def test_the_survivors_of_the_answered_unmask_are_accepted(tmp_path: Path) -> None:
    runner, noise = _awaiting(tmp_path)
    _answer(runner, _request(IDS, 1, ["a", "b", "c"], ["d"]), IDS, noise, awaiting=1)
    _serve(runner, _ready(1, ["a", "b", "c"]), _digest("a"))
    result = runner._await_result(1, "scatter", LAYOUT, tuple(IDS), noise)
    assert result is not None and np.array_equal(result, AGGREGATE)
    assert runner._last_survivors == ("a", "b", "c")


def test_a_restarted_node_still_knows_what_it_revealed(tmp_path: Path) -> None:
    first, noise = _awaiting(tmp_path)
    _answer(first, _request(IDS, 1, ["a", "b", "c"], ["d"]), IDS, noise, awaiting=1)
    restarted = _node(tmp_path)  # knows nothing but what the output folder holds
    restarted.roster = SimpleNamespace(roster_hash=ROSTER_HASH)  # type: ignore[assignment]
    _serve(restarted, _ready(1, IDS), _digest("a"))
    with pytest.raises(SessionFailed, match=r"counts \{d\}"):
        restarted._await_result(1, "scatter", LAYOUT, tuple(IDS), noise)


# ---------------------------------------------------------------- my own payload after a restart


def test_a_round_aggregated_while_down_must_count_the_payload_of_my_bundle(
    tmp_path: Path,
) -> None:
    _at_gate(tmp_path)
    runner = _node(tmp_path)
    runner.roster = SimpleNamespace(roster_hash=ROSTER_HASH)  # type: ignore[assignment]
    runner.plan = ReceivingPlan()  # type: ignore[assignment]
    # A statement of a for another payload of round 1 (a node that signed two
    # releases of one round: the aggregate is not of the bundle it recorded).
    _serve(runner, _ready(1, IDS, {"a": _digest("x")}), None)
    with pytest.raises(SessionFailed, match="counts a payload of mine with sha256"):
        runner._take_published(1, "scatter", tuple(IDS))
    assert runner.plan.received == []  # type: ignore[attr-defined]


def test_a_round_aggregated_while_down_with_my_bundle_is_taken(tmp_path: Path) -> None:
    _, egress = _at_gate(tmp_path)
    runner = _node(tmp_path)
    runner.roster = SimpleNamespace(roster_hash=ROSTER_HASH)  # type: ignore[assignment]
    runner.plan = ReceivingPlan()  # type: ignore[assignment]
    _serve(runner, _ready(1, IDS, {"a": payload_digest(egress)}), None)
    runner._take_published(1, "scatter", tuple(IDS))
    assert runner.plan.received == ["scatter"]  # type: ignore[attr-defined]


# ---------------------------------------------------------------- a refusal before the restart


def test_a_node_that_refused_stays_stopped_after_a_restart(tmp_path: Path) -> None:
    first, noise = _awaiting(tmp_path)
    # Awaiting round 1, a is asked about round 0: it refuses, and its refusal
    # may never reach the coordinator (it is swallowed when the call fails).
    with pytest.raises(NodeRefused):
        _answer(first, _request(IDS, 0, ["a", "b", "c"], ["d"]), IDS, noise, awaiting=1)
    status = pb.SessionStatus(
        session_id=SESSION,
        state=pb.SESSION_STATE_RUNNING,
        current_round_index=1,
        current_round_name="scatter",
        rounds=[
            pb.RoundSummary(
                round_index=1,
                round_name="scatter",
                status=pb.ROUND_STATUS_AWAITING_UNMASK,
                submitted_node_ids=IDS,
            ),
        ],
    )
    restarted = _node(tmp_path, status=status)
    restarted._done = set()
    with pytest.raises(NodeRefused, match=r"refused to unmask round 0 .* before it restarted"):
        restarted._catch_up()
    assert restarted.client.sent == []  # type: ignore[attr-defined]


# ---------------------------------------------------------------- one process per output folder


def test_a_second_holder_of_one_output_folder_is_refused(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "out")
    busy = pytest.raises(SessionStateError, match=f"in use by another process.*{os.getpid()}")
    with store.exclusive(), busy, SessionStore(tmp_path / "out").exclusive():
        pass  # pragma: no cover - never entered
    with SessionStore(tmp_path / "out").exclusive():
        pass  # free again once the first hold ended


def test_another_process_on_the_folder_stops_the_runner_until_it_dies(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from node.session_state import SessionStore
                with SessionStore({str(out)!r}).exclusive():
                    print("held", flush=True)
                    sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        runner = _node(out)
        runner.out = out
        busy = pytest.raises(SessionFailed, match=f"process {holder.pid} holds node.lock")
        with busy, runner._hold_output():
            pass  # pragma: no cover - never entered
    finally:
        holder.kill()  # as with kill -9, the operating system drops the lock
        holder.communicate()
    with runner._hold_output():
        pass


# ---------------------------------------------------------------- no copy of the key left behind


def test_a_half_written_key_is_deleted_with_the_key(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    key = EphemeralKey.generate()
    store.start(session_id=SESSION, node_id="a", config_hash=CONFIG_HASH, key=key)
    # What kill -9 between mkstemp and rename leaves of the next key written here.
    leftover = tmp_path / f".{KEY_FILE}.k3y5tmp.tmp"
    leftover.write_bytes(EphemeralKey.generate().private_bytes())
    leftover.chmod(0o600)
    store.complete()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.json"]


# ---------------------------------------------------------------- an unpinned reference stream


def test_a_federation_without_a_stream_check_is_said_not_skipped_silently(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    fed = tmp_path / "fed"
    args = ["init", "--nodes", "a,b", "--out", str(fed), "--synthetic", "--seed", "1"]
    args += ["--n-features", "4", "--n-components", "2", "--cohort-sizes", "110,110"]
    assert federation_command.run(parser.parse_args(args)) == 0
    # A federation file made before stream_check existed, or written by hand.
    toml = fed / "federation.toml"
    toml.write_text(re.sub(r"(?m)^stream_check = .*\n", "", toml.read_text()))
    assert load_federation(toml).stream_check is None
    lines: list[str] = []
    NodeRunner(fed, "a", progress=lines.append).prepare()
    assert any("pins no stream_check" in line for line in lines)
