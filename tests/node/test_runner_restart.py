"""A restarted runner: same key, same bundle, same unmask decisions, nothing released twice.

The runner is driven without a network (a client that answers from fixed
messages and records what the node sends). A *restart* is a second runner
over the same output folder, holding nothing in memory from the first, as
after ``kill -9``. The real-process counterpart is
tests/integration/test_node_restart.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from node.atomic import atomic_write_json
from node.cape_state import CapeMaterial, CapeStore
from node.client import CoordinatorError
from node.egress import EgressBundle, egress_folder
from node.masking import cape_sum_payload, pairwise_masks
from node.release import ReleaseNoise, TensorSensitivity, plan_release
from node.runner import NodeOptions, NodeRefused, NodeRunner, SessionFailed
from node.session_state import SessionStore
from noise.keys import EphemeralKey
from noise.layout import Layout, payload_digest
from proto.federation import FederationConfig
from proto.zerosum.v1 import session_pb2 as pb
from tests.node.test_runner_units import CODEC, SENSITIVITIES, SESSION, _config, _seeds, _tensors
from tests.node.test_unmask_safety import (
    CONFIG_HASH,
    RecordingClient,
    _answer,
    _client,
    _released,
    _request,
    _runner,
    _unmask_entries,
)

IDS = ["a", "b", "c", "d"]
LAYOUT: Layout = Layout.of_tensors(_tensors(0))


class _Plan:
    """The plan methods a model round and its release use, with fixed local tensors."""

    round_names = ("moments", "scatter")

    def tensors(self, name: str) -> dict[str, np.ndarray]:
        return _tensors(0)

    def sensitivities(self, name: str) -> list[TensorSensitivity]:
        return list(SENSITIVITIES)

    def n_used(self) -> int:
        return 150

    def residual_dof(self, name: str) -> int | None:
        return None

    def sdc_notes(self, name: str) -> tuple[str, ...]:
        return ()

    def clipped(self, name: str) -> dict[str, int]:
        return {}


class AnsweringClient(RecordingClient):
    """Also keeps each unmask answer's payload, and answers status and join calls."""

    def __init__(self, status: pb.SessionStatus | None = None) -> None:
        super().__init__()
        self.status = status or pb.SessionStatus()
        self.payloads: list[bytes] = []
        self.joined: list[pb.KeyBundle] = []
        self.join_error: CoordinatorError | None = None

    def submit_unmask(self, *, request: pb.UnmaskRequest, payload: Any, **kwargs: Any) -> None:
        super().submit_unmask(request=request, payload=payload, **kwargs)
        self.payloads.append(np.asarray(payload, dtype=np.uint64).tobytes())

    def get_status(self, session_id: str = "") -> pb.SessionStatus:
        return self.status

    def join(self, bundle: pb.KeyBundle) -> pb.JoinResponse:
        if self.join_error is not None:
            raise self.join_error
        rejoined = any(
            (b.public_key, b.signature) == (bundle.public_key, bundle.signature)
            for b in self.joined
        )
        self.joined.append(bundle)
        return pb.JoinResponse(
            session_id=SESSION, node_id="a", rejoined=rejoined, joined_count=1, federation_size=4
        )


def _node(
    out: Path,
    config: FederationConfig | None = None,
    *,
    status: pb.SessionStatus | None = None,
    options: NodeOptions | None = None,
) -> NodeRunner:
    """A runner over ``out`` that knows nothing but what that folder holds."""
    runner = _runner(out, config or _config(IDS, threshold=1), IDS)
    runner.client = AnsweringClient(status)  # type: ignore[assignment]
    runner.plan = _Plan()  # type: ignore[assignment]
    runner.options = options or NodeOptions()
    runner.resuming = True
    runner._revealed = runner._revealed_in_ledger()
    return runner


def _sent(runner: NodeRunner) -> AnsweringClient:
    assert isinstance(runner.client, AnsweringClient)
    return runner.client


# ---------------------------------------------------------------- unmask answers


def test_a_restart_keeps_the_dropped_set_growing(tmp_path: Path) -> None:
    first = _node(tmp_path)
    noise = _released(first, IDS, [1])
    _answer(first, _request(IDS, 1, ["a", "b", "d"], ["c"]), IDS, noise, awaiting=1)
    restarted = _node(tmp_path)
    assert restarted._revealed[1].dropped == {"c"}
    with pytest.raises(NodeRefused, match=r"reveals pair terms with \{b\} after \{c\}"):
        _answer(restarted, _request(IDS, 1, ["a", "c", "d"], ["b"]), IDS, noise, awaiting=1)
    assert _sent(restarted).answers() == []


def test_a_restart_never_drops_a_survivor_of_an_answered_attempt(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d", "e", "f"]
    config = _config(ids, threshold=2)
    first = _runner(tmp_path, config, ids)
    noise = _released(first, ids, [0])
    _answer(first, _request(ids, 0, list("abcde"), ["f"]), ids, noise, awaiting=0)
    restarted = _runner(tmp_path, config, ids)
    restarted._revealed = restarted._revealed_in_ledger()
    # The uninterrupted node refuses this (the laggard attack); so must the restarted one.
    with pytest.raises(NodeRefused, match="drops 'e', which was a survivor"):
        _answer(restarted, _request(ids, 0, list("abcd"), ["e", "f"]), ids, noise, awaiting=0)
    assert _client(restarted).answers() == []


def test_an_answer_sent_again_after_a_restart_is_the_same_and_recorded_once(
    tmp_path: Path,
) -> None:
    first = _node(tmp_path)
    noise = _released(first, IDS, [1])
    request = _request(IDS, 1, ["a", "b", "c"], ["d"])
    _answer(first, request, IDS, noise, awaiting=1)
    # The answer may never have reached the coordinator; it asks again.
    restarted = _node(tmp_path)
    _answer(restarted, request, IDS, noise, awaiting=1)
    assert _sent(restarted).sent == [("attest", 1), ("answer", 1, ("d",))]
    assert _sent(restarted).payloads == _sent(first).payloads
    assert _unmask_entries(restarted) == [(1, ["d"])]


# ---------------------------------------------------------------- the bundle written before


def _egress(runner: NodeRunner, participants: Sequence[str], index: int) -> tuple[Any, Any]:
    assert runner.config is not None
    noise = plan_release(runner.config, participants, "a", SENSITIVITIES)
    clean = LAYOUT.encode(_tensors(0), CODEC)
    mask = pairwise_masks(noise, _seeds(IDS)["a"], LAYOUT, round_index=index, codec=CODEC)
    return noise, clean + mask


def _at_gate(out: Path) -> tuple[ReleaseNoise, np.ndarray]:
    """Write round 1's bundle the way a node does, then stop at the gate (as if killed)."""
    runner = _node(out, options=NodeOptions(approve="manual", approval_timeout=0.0))
    noise, egress = _egress(runner, IDS, 1)
    with pytest.raises(ValueError, match="no approval appeared"):
        runner._release(
            index=1,
            name="scatter",
            layout=LAYOUT,
            noise=noise,
            clean=LAYOUT.encode(_tensors(0), CODEC),
            egress=egress,
        )
    assert runner.ledger.entries == ()
    return noise, egress


def test_a_bundle_left_at_the_gate_is_approved_and_recorded_once(tmp_path: Path) -> None:
    noise, egress = _at_gate(tmp_path)
    folder = egress_folder(tmp_path, 1)
    payload = (folder / "payload.npy").read_bytes()
    manifest = EgressBundle.manifest_sha256(folder)
    for restart in range(2):
        runner = _node(tmp_path)
        found = runner._bundle_before_restart(1, "scatter")
        assert found is not None and np.array_equal(found.payload, egress)
        again = runner._earlier_noise(found, tuple(IDS), LAYOUT)
        assert again.mu() == noise.mu()
        runner._release_again(
            index=1,
            name="scatter",
            layout=LAYOUT,
            noise=again,
            clean=LAYOUT.encode(_tensors(0), CODEC),
            bundle=found,
        )
        releases = [e for e in runner.ledger.entries if e.kind == "release"]
        assert [(e.round_index, e.details["manifest_sha256"]) for e in releases] == [(1, manifest)]
        if restart == 0:
            approval = (folder / "approval.json").read_bytes()
        else:  # the approval given before is kept, not signed anew
            assert (folder / "approval.json").read_bytes() == approval
    assert (folder / "payload.npy").read_bytes() == payload
    assert EgressBundle.manifest_sha256(folder) == manifest


def test_a_missing_audit_record_is_written_again(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    audit = tmp_path / "audit" / "round-1"
    for path in audit.iterdir():
        path.unlink()
    runner = _node(tmp_path)
    found = runner._bundle_before_restart(1, "scatter")
    assert found is not None
    runner._release_again(
        index=1,
        name="scatter",
        layout=LAYOUT,
        noise=runner._earlier_noise(found, tuple(IDS), LAYOUT),
        clean=LAYOUT.encode(_tensors(0), CODEC),
        bundle=found,
    )
    record = json.loads((audit / "audit.json").read_text())
    assert record["egress_payload_sha256"] == found.payload_sha256


def test_a_folder_without_a_manifest_holds_no_bundle(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    (egress_folder(tmp_path, 1) / "manifest.json").unlink()
    assert _node(tmp_path)._bundle_before_restart(1, "scatter") is None
    assert _node(tmp_path)._bundle_before_restart(2, "scatter") is None


def test_a_damaged_bundle_stops_the_node(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    values = egress_folder(tmp_path, 1) / "values.csv"
    values.write_text(values.read_text().replace(",", ";", 9))
    with pytest.raises(SessionFailed, match=r"failed verification.*never recomputes a release"):
        _node(tmp_path)._bundle_before_restart(1, "scatter")


def test_a_bundle_of_another_round_stops_the_node(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    with pytest.raises(SessionFailed, match=r"not this node's round 1 \('moments'\)"):
        _node(tmp_path)._bundle_before_restart(1, "moments")


def test_only_the_recorded_release_is_sent(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    first = _node(tmp_path)
    first.ledger.record_release(
        session_id=SESSION, round_index=1, round_name="scatter", mu={}, manifest_sha256="ab" * 32
    )
    with pytest.raises(SessionFailed, match="refusing to send anything but the recorded release"):
        _node(tmp_path)._bundle_before_restart(1, "scatter")


def test_a_bundle_planned_with_other_noise_is_not_resubmitted(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    runner = _node(tmp_path)
    found = runner._bundle_before_restart(1, "scatter")
    assert found is not None
    with pytest.raises(SessionFailed, match="with other noise than this node plans"):
        runner._earlier_noise(found, ("a", "b", "c"), LAYOUT)


# ---------------------------------------------------------------- catching up


def _status(*rounds: pb.RoundSummary) -> pb.SessionStatus:
    last = rounds[-1]
    return pb.SessionStatus(
        session_id=SESSION,
        state=pb.SESSION_STATE_RUNNING,
        current_round_index=last.round_index,
        current_round_name=last.round_name,
        rounds=list(rounds),
    )


CAPE = "cape-sum/moments"


def _cape_node(out: Path, *, submitted: Sequence[str] = ("a", "c")) -> NodeRunner:
    """A CAPE runner restarted in round 0 (the first CAPE sum), which ``submitted`` sent."""
    config = _config(IDS, threshold=1, construction="cape", min_nodes=2)
    status = _status(
        pb.RoundSummary(
            round_index=0,
            round_name=CAPE,
            status=pb.ROUND_STATUS_OPEN,
            submitted_node_ids=list(submitted),
        )
    )
    runner = _node(out, config, status=status)
    runner._done = set()
    runner._cape_sent = set()
    return runner


def _saved_draws(out: Path) -> np.ndarray:
    """Round 'moments' CAPE draws saved the way a node saves them before its share leaves."""
    draws = np.random.default_rng(7).integers(0, 2**64, size=21, dtype=np.uint64)
    CapeStore(out).save(
        CapeMaterial(
            session_id=SESSION,
            node_id="a",
            config_hash=CONFIG_HASH,
            round_name="moments",
            layout=LAYOUT,
            planned=tuple(IDS),
            draws=draws,
        )
    )
    return draws


def _note(out: Path, digest: str) -> None:
    atomic_write_json(
        egress_folder(out, 0) / "cape-sum.json",
        {
            "session_id": SESSION,
            "round_index": 0,
            "round_name": CAPE,
            "node_id": "a",
            "participants": IDS,
            "payload_sha256": digest,
        },
    )


def test_a_cape_node_that_sent_a_share_without_saved_material_stops(tmp_path: Path) -> None:
    runner = _cape_node(tmp_path)
    runner._catch_up()
    assert runner._cape_sent == {"moments"}
    with pytest.raises(SessionFailed, match="holds no saved CAPE material for it; drawing afresh"):
        runner._cape_sum_round(0, CAPE, tuple(IDS))
    assert _sent(runner).sent == []
    assert not (tmp_path / "audit").exists()  # nothing was drawn


def test_a_noted_share_without_saved_material_stops_too(tmp_path: Path) -> None:
    # The coordinator may not have the share yet; the note says it may have left.
    _note(tmp_path, "ab" * 32)
    runner = _cape_node(tmp_path, submitted=())
    runner._catch_up()
    with pytest.raises(SessionFailed, match="holds no saved CAPE material"):
        runner._cape_sum_round(0, CAPE, tuple(IDS))
    assert _sent(runner).sent == []


def test_damaged_cape_material_stops_the_node(tmp_path: Path) -> None:
    _saved_draws(tmp_path)
    draws = tmp_path / "audit" / "cape-moments" / "draws.npy"
    draws.write_bytes(draws.read_bytes()[:-1] + b"\x01")
    runner = _cape_node(tmp_path)
    runner._catch_up()
    with pytest.raises(
        SessionFailed,
        match=r"cannot resume the CAPE rounds of 'moments' .*/draws.npy has sha256 .* never draws",
    ):
        runner._cape_sum_round(0, CAPE, tuple(IDS))
    assert _sent(runner).sent == []


def test_a_share_that_differs_from_the_noted_one_is_not_sent(tmp_path: Path) -> None:
    draws = _saved_draws(tmp_path)
    runner = _cape_node(tmp_path)
    share = cape_sum_payload(draws, IDS, "a", _seeds(IDS)["a"], LAYOUT, round_index=0)
    # The noted share went out among other participants (or from other draws).
    _note(tmp_path, payload_digest(share).hex())
    runner._catch_up()
    with pytest.raises(SessionFailed, match=r"is not the share .*cape-sum.json notes"):
        runner._cape_sum_round(0, CAPE, ("a", "b", "c"))
    assert _sent(runner).sent == []
    # Among the noted participants it is the same share, and the saved draws are those used.
    runner._cape.clear()
    assert runner._cape_state("moments", LAYOUT) is not None
    assert np.array_equal(runner._cape["moments"].draws, draws)


def test_a_cape_node_that_sent_nothing_resumes(tmp_path: Path) -> None:
    config = _config(IDS, threshold=1, construction="cape", min_nodes=2)
    lines: list[str] = []
    status = _status(
        pb.RoundSummary(round_index=0, round_name="cape-sum/moments", status=pb.ROUND_STATUS_OPEN)
    )
    runner = _node(tmp_path, config, status=status)
    runner._progress = lines.append
    runner._done = set()
    runner._cape_sent = set()
    runner._catch_up()
    assert lines == [
        f"zerosum node a: resuming session {SESSION}: no round aggregated yet, round 0 "
        "('cape-sum/moments') not written yet here"
    ]


def test_a_node_dropped_while_away_stops(tmp_path: Path) -> None:
    status = _status(
        pb.RoundSummary(
            round_index=0,
            round_name="moments",
            status=pb.ROUND_STATUS_READY,
            submitted_node_ids=["b", "c", "d"],
            dropped_node_ids=["a"],
        ),
        pb.RoundSummary(round_index=1, round_name="scatter", status=pb.ROUND_STATUS_OPEN),
    )
    runner = _node(tmp_path, status=status)
    runner._done = set()
    with pytest.raises(SessionFailed, match=r"dropped this node from round 0 \('moments'\)"):
        runner._catch_up()


# ---------------------------------------------------------------- joining again


def _joining(out: Path, state: pb.SessionState.ValueType = pb.SESSION_STATE_RUNNING) -> NodeRunner:
    status = pb.SessionStatus(session_id=SESSION, state=state, config_hash=CONFIG_HASH)
    runner = _node(out, status=status)
    runner.out = out
    return runner


def test_the_key_is_saved_before_the_join_and_reused_after_a_restart(tmp_path: Path) -> None:
    lines: list[str] = []
    first = _joining(tmp_path)
    first._join()
    assert not first.resuming
    saved = SessionStore(tmp_path).resume(session_id=SESSION, node_id="a", config_hash=CONFIG_HASH)
    assert saved is not None
    assert saved[1].public_bytes() == first.ephemeral.public_bytes()
    restarted = _joining(tmp_path)
    restarted.client = first.client
    restarted._progress = lines.append
    restarted._join()
    assert restarted.resuming
    assert restarted.ephemeral.private_bytes() == first.ephemeral.private_bytes()
    bundles = _sent(restarted).joined
    # Ed25519 is deterministic: the very same signed bundle, which the coordinator takes again.
    assert bundles[0] == bundles[1]
    assert lines == [
        f"zerosum node a: rejoined session {SESSION} with the key saved in "
        f"{tmp_path / 'session.key'} (1 of 4 nodes joined)"
    ]


def test_a_coordinator_holding_another_key_is_explained(tmp_path: Path) -> None:
    runner = _joining(tmp_path)
    _sent(runner).join_error = CoordinatorError(
        "Join",
        grpc.StatusCode.FAILED_PRECONDITION,
        "node 'a' already joined session 'S' with key 1234; a second key 5678 is refused.",
    )
    with pytest.raises(SessionFailed, match="already holds another session key of this node"):
        runner._join()


def test_a_failed_session_discards_its_key(tmp_path: Path) -> None:
    _joining(tmp_path)._join()
    ended = _joining(tmp_path, pb.SESSION_STATE_ABORTED)
    with pytest.raises(SessionFailed, match="has already ended"):
        ended._join()
    assert not (tmp_path / "session.key").exists()


def test_a_completed_session_may_still_be_collected_with_the_saved_key(tmp_path: Path) -> None:
    _joining(tmp_path)._join()
    late = _joining(tmp_path, pb.SESSION_STATE_COMPLETED)
    late._join()
    assert late.resuming
    # Without a saved key there is nothing to collect.
    (tmp_path / "session.key").unlink()
    (tmp_path / "session.json").unlink()
    with pytest.raises(SessionFailed, match="has already ended"):
        _joining(tmp_path, pb.SESSION_STATE_COMPLETED)._join()


def test_the_key_of_an_earlier_session_is_replaced_at_the_next_join(tmp_path: Path) -> None:
    old = EphemeralKey.generate()
    SessionStore(tmp_path).start(session_id="f" * 32, node_id="a", config_hash=CONFIG_HASH, key=old)
    runner = _joining(tmp_path)
    runner._join()
    assert not runner.resuming
    assert (tmp_path / "session.key").read_bytes() == runner.ephemeral.private_bytes()
    assert runner.ephemeral.private_bytes() != old.private_bytes()
    assert _sent(runner).joined[0].public_key == runner.ephemeral.public_bytes()
