"""Lying coordinators, crashes and second processes around node restarts and upload statements.

Each test drives the node's session steps (``node.session``, with the fake
coordinator of ``tests.node.fake_gateway``), the runner or the session store
the way a lying coordinator, a crash or a second process would, and names
what it stops:

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
import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from node.egress.release import ReleaseNoise
from node.errors import CoordinatorUnreachable, NodeRefused, SessionFailed
from node.protocol.statements import sign_upload_statement
from node.records.session_state import KEY_FILE, SessionStateError, SessionStore
from node.records.survivor_sets import SignedSet, SurvivorSets
from node.runner import NodeRunner
from node.session.results import Outcome, await_result
from node.session.resume import catch_up, take_aggregated
from noise.aggregate_check import TAG_MODULUS, challenge_vectors, tags
from noise.keys import EphemeralKey
from noise.layout import Layout, payload_digest
from proto.federation import load_federation
from proto.messages import (
    RoundResult,
    RoundState,
    RoundSummary,
    SessionState,
    SessionStatus,
    UploadStatement,
)
from tests.node.fake_gateway import FakeCoordinator, running
from tests.node.nodes import CONFIG_HASH, LAYOUT, ROSTER_HASH, FakePlan, Node
from tests.node.peer_checks import sealed_tags
from tests.node.restarts import IDS, _at_gate, _node
from tests.node.unmask_requests import _answer, _released, _request
from tests.support.made_up_federation import SESSION, _identities, _seeds
from zerosum.commands import federation as federation_command

KEYS = _identities(IDS)
AGGREGATE = np.arange(LAYOUT.size, dtype=np.uint64)


def _digest(node: str) -> bytes:
    return bytes([ord(node)]) * 32


def _statement(node: str, index: int, digest: bytes) -> UploadStatement:
    return UploadStatement(
        node_id=node,
        round_name="scatter",
        roster_hash=ROSTER_HASH,
        payload_digest=digest,
        signature=sign_upload_statement(
            KEYS[node],
            config_hash=CONFIG_HASH,
            session_id=SESSION,
            round_index=index,
            round_name="scatter",
            roster_hash=ROSTER_HASH,
            payload_digest=digest,
        ),
    )


def _ready(
    index: int, survivors: Sequence[str], digests: dict[str, bytes] | None = None
) -> RoundResult:
    """A READY result whose statements are validly signed by every survivor."""
    digests = digests or {}
    return RoundResult(
        round_index=index,
        round_name="scatter",
        state=RoundState.READY,
        reason="",
        survivors=tuple(survivors),
        dropped=tuple(n for n in IDS if n not in survivors),
        statements=tuple(_statement(n, index, digests.get(n, _digest(n))) for n in survivors),
        aggregate=AGGREGATE,
    )


def _vouched(node: Node, result: RoundResult) -> RoundResult:
    """``result`` with the other survivors' sealed tags adding up to its aggregate's tag.

    Only the sum is checked, so one other survivor carries what a's own tags lack.
    """
    signed = SurvivorSets(node.ctx.state.folder, SESSION).signed(result.round_index)
    assert signed is not None and signed.challenge_key is not None
    assert signed.own_tags is not None and result.aggregate is not None
    rho = challenge_vectors(signed.challenge_key, LAYOUT.size, round_index=result.round_index)
    whole = tags(result.aggregate, rho)
    rest = [(w - o) % TAG_MODULUS for w, o in zip(whole, signed.own_tags, strict=True)]
    others = [n for n in result.survivors if n != "a"]
    values = {n: rest if i == 0 else [0] * len(rest) for i, n in enumerate(others)}
    sealed = sealed_tags(
        "a",
        values,
        identities=KEYS,
        seeds=_seeds(IDS),
        config_hash=CONFIG_HASH,
        session_id=SESSION,
        round_index=result.round_index,
        survivor_hash=signed.survivor_hash,
    )
    return dataclasses.replace(result, tags=sealed)


def _awaiting(out: Path, *, plan: FakePlan | None = None) -> tuple[Node, ReleaseNoise]:
    """Node a after releasing round 1, past its roster (whose hash is ROSTER_HASH)."""
    node = _node(out, plan=plan)
    return node, _released(node, IDS, [1])


def _serve(node: Node, result: RoundResult, uploaded: bytes | None) -> None:
    """The coordinator publishes ``result``; ``uploaded``: what this process uploaded, if any."""
    node.coordinator.results[result.round_index] = result
    if uploaded is not None:
        node.coordinator.uploaded[result.round_index] = uploaded


def _await(node: Node, noise: ReleaseNoise) -> Outcome | None:
    return await_result(
        node.ctx,
        node.progress,
        index=1,
        name="scatter",
        layout=LAYOUT,
        participants=tuple(IDS),
        noise=noise,
        contribution=None,
    )


# ---------------------------------------------------------------- the nodes an aggregate counts


@pytest.mark.parametrize("state", [RoundState.SUPERSEDED, RoundState.FAILED])
def test_a_superseded_round_is_waited_out_like_a_failed_one(
    tmp_path: Path, state: RoundState
) -> None:
    node, noise = _awaiting(tmp_path)
    rerun = "superseded by round 2 (a CAPE rerun among the survivors)"
    _serve(node, RoundResult(1, "scatter", state, rerun, ("a", "b"), ("c", "d")), None)
    node.coordinator.results = _Once(node.coordinator.results)  # asked twice: fails, never hangs
    assert _await(node, noise) is None  # the session runs on: the node waits for the rerun
    assert "status" in node.coordinator.calls


class _Once(dict[int, RoundResult]):
    """Results handed out once each (a node polling the same round again gets none)."""

    def get(self, key: int, default: RoundResult | None = None) -> RoundResult | None:  # type: ignore[override]
        return self.pop(key, default)


def test_an_aggregate_counting_a_node_reported_dropped_is_refused(tmp_path: Path) -> None:
    node, noise = _awaiting(tmp_path)
    # The coordinator says d missed the deadline; a attests and sends its pair terms with d.
    _answer(node, _request(IDS, 1, ["a", "b", "c"], ["d"]), IDS, noise, awaiting=1)
    # Then it publishes the sum over all four, d's upload included, with d's valid statement.
    _serve(node, _ready(1, IDS), _digest("a"))
    with pytest.raises(SessionFailed, match=r"counts \{d\}, whose pair terms with me I revealed"):
        _await(node, noise)


def test_an_aggregate_leaving_out_a_node_never_unmasked_is_refused(tmp_path: Path) -> None:
    node, noise = _awaiting(tmp_path)
    _serve(node, _ready(1, ["a", "b", "c"]), _digest("a"))
    with pytest.raises(SessionFailed, match=r"leaves out \{d\}, but I revealed no pair terms"):
        _await(node, noise)


def test_the_survivors_of_the_answered_unmask_are_accepted(tmp_path: Path) -> None:
    node, noise = _awaiting(tmp_path)
    _answer(node, _request(IDS, 1, ["a", "b", "c"], ["d"]), IDS, noise, awaiting=1)
    _serve(node, _vouched(node, _ready(1, ["a", "b", "c"])), _digest("a"))
    result = _await(node, noise)
    assert result is not None and np.array_equal(result.aggregate, AGGREGATE)
    assert result.survivors == ("a", "b", "c")


def test_the_same_aggregate_without_tags_that_add_up_is_refused(tmp_path: Path) -> None:
    node, noise = _awaiting(tmp_path)
    _answer(node, _request(IDS, 1, ["a", "b", "c"], ["d"]), IDS, noise, awaiting=1)
    honest = _vouched(node, _ready(1, ["a", "b", "c"]))
    forged = dataclasses.replace(honest, aggregate=AGGREGATE + np.uint64(1))
    _serve(node, forged, _digest("a"))
    with pytest.raises(SessionFailed, match="fails 4 of 4 secret checks"):
        _await(node, noise)
    untagged = dataclasses.replace(honest, tags=honest.tags[:-1])
    _serve(node, untagged, _digest("a"))
    with pytest.raises(SessionFailed, match="tags of survivor 'c' are not relayed"):
        _await(node, noise)


def test_a_restarted_node_still_knows_what_it_revealed(tmp_path: Path) -> None:
    first, noise = _awaiting(tmp_path)
    _answer(first, _request(IDS, 1, ["a", "b", "c"], ["d"]), IDS, noise, awaiting=1)
    again = _node(tmp_path)  # knows nothing but what the output folder holds
    _serve(again, _ready(1, IDS), _digest("a"))
    with pytest.raises(SessionFailed, match=r"counts \{d\}"):
        _await(again, noise)


# ---------------------------------------------------------------- my own payload after a restart


def _aggregated_while_down() -> SessionStatus:
    """Round 1, whose bundle a wrote before it went down, was aggregated meanwhile."""
    return running(SESSION, RoundSummary(1, "scatter", RoundState.READY, tuple(IDS), ()))


def test_a_round_aggregated_while_down_must_count_the_payload_of_my_bundle(
    tmp_path: Path,
) -> None:
    _at_gate(tmp_path)
    plan = FakePlan()
    node = _node(tmp_path, plan=plan, status=_aggregated_while_down())
    # A statement of a for another payload of round 1 (a node that signed two
    # releases of one round: the aggregate is not of the bundle it recorded).
    _serve(node, _ready(1, IDS, {"a": _digest("x")}), None)
    with pytest.raises(SessionFailed, match="counts a payload of mine with digest"):
        take_aggregated(node.ctx, node.progress, node.coordinator.status_reply)
    assert plan.received == []


def test_a_round_aggregated_while_down_with_my_bundle_is_taken(tmp_path: Path) -> None:
    _, egress = _at_gate(tmp_path)
    plan = FakePlan()
    node = _node(tmp_path, plan=plan, status=_aggregated_while_down())
    # What left is the bundle's egress under a's self-mask of round 1.
    sent = node.ctx.sent_payload(1, egress, Layout.of_tensors(plan.tensors("scatter")))
    ready = _ready(1, IDS, {"a": payload_digest(sent)})
    # Never answered (no challenge key kept): the round cannot hold a's seed, so refuse.
    _serve(node, ready, None)
    with pytest.raises(SessionFailed, match="holds no challenge key"):
        take_aggregated(node.ctx, node.progress, node.coordinator.status_reply)
    assert plan.received == []
    # Answered before going down: the record kept the survivor set and its challenge key.
    sets = SurvivorSets(node.ctx.state.folder, SESSION)
    sets.sign(1, SignedSet(b"\x01" * 32, tuple(IDS), ()))
    sets.note_challenge(1, b"\x02" * 32, (0, 0, 0, 0))
    again = _node(tmp_path, plan=plan, status=_aggregated_while_down())
    _serve(again, _vouched(again, ready), None)
    take_aggregated(again.ctx, again.progress, again.coordinator.status_reply)
    assert plan.received == ["scatter"]


# ---------------------------------------------------------------- a refusal before the restart


def test_a_node_that_refused_stays_stopped_after_a_restart(tmp_path: Path) -> None:
    first, noise = _awaiting(tmp_path)
    # Awaiting round 1, a is asked about round 0: it refuses, and its refusal
    # may never reach the coordinator (it is swallowed when the call fails).
    first.coordinator.refuse_error = CoordinatorUnreachable(
        "RefuseUnmask", "UNAVAILABLE", "connection refused", attempts=3, seconds=1.0
    )
    with pytest.raises(NodeRefused):
        _answer(first, _request(IDS, 0, ["a", "b", "c"], ["d"]), IDS, noise, awaiting=1)
    assert first.coordinator.refusals == []
    status = running(
        SESSION, RoundSummary(1, "scatter", RoundState.AWAITING_UNMASK, tuple(IDS), ())
    )
    again = _node(tmp_path, status=status)
    with pytest.raises(NodeRefused, match=r"refused to unmask round 0 .* before it restarted"):
        catch_up(again.ctx, again.progress)
    assert again.coordinator.sent == []


# ---------------------------------------------------------------- one process per output folder


def test_a_second_holder_of_one_output_folder_is_refused(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "out")
    busy = pytest.raises(SessionStateError, match=f"in use by another process.*{os.getpid()}")
    with store.exclusive(), busy, SessionStore(tmp_path / "out").exclusive():
        pass  # pragma: no cover - never entered
    with SessionStore(tmp_path / "out").exclusive():
        pass  # free again once the first hold ended


def _federation(tmp_path: Path) -> Path:
    """A two-node federation with synthetic cohorts, as ``zerosum federation init`` writes it."""
    parser = argparse.ArgumentParser()
    federation_command.add_arguments(parser)
    fed = tmp_path / "fed"
    args = ["init", "--nodes", "a,b", "--out", str(fed), "--synthetic", "--seed", "1"]
    args += ["--n-features", "4", "--n-components", "2", "--cohort-sizes", "110,110"]
    assert federation_command.run(parser.parse_args(args)) == 0
    return fed


def test_another_process_on_the_folder_stops_the_runner_until_it_dies(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # The session has ended: a runner that gets past the hold on OUT learns so when it joins.
    ended = SessionStatus(
        session_id=SESSION, state=SessionState.ABORTED, config_hash=b"", reason="over", rounds=()
    )
    coordinator = FakeCoordinator("a", status_reply=ended)
    runner = NodeRunner(
        _federation(tmp_path),
        "a",
        out=out,
        progress=lambda line: None,
        gateway=coordinator.factory(),
    )
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from node.records.session_state import SessionStore
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
        with pytest.raises(SessionFailed, match=f"process {holder.pid} holds node.lock"):
            runner.run()
        assert coordinator.calls == ["close"]  # stopped before it asked the coordinator anything
    finally:
        holder.kill()  # as with kill -9, the operating system drops the lock
        holder.communicate()
    with pytest.raises(SessionFailed, match=r"has already ended \(over\)"):
        runner.run()  # past the hold, it joins
    assert coordinator.calls == ["close", "status", "close"]


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
    fed = _federation(tmp_path)
    # A federation file made before stream_check existed, or written by hand.
    toml = fed / "federation.toml"
    toml.write_text(re.sub(r"(?m)^stream_check = .*\n", "", toml.read_text()))
    assert load_federation(toml).stream_check is None
    lines: list[str] = []
    NodeRunner(fed, "a", progress=lines.append).prepare()
    assert any("pins no stream_check" in line for line in lines)
