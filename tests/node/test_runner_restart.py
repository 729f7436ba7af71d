"""A restarted node: same key, same bundle, same unmask decisions, nothing released twice.

The session steps (``node.session``) are driven without a network: a fake
coordinator answers from fixed values and records what the node sends
(``tests.node.fake_gateway``). A *restart* is a new session context and
progress over the same output folder, holding nothing in memory from the
first, as after ``kill -9`` (``tests.node.nodes.restarted``). The
real-process counterpart is tests/integration/test_node_restart.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from node.egress.bundle import EgressBundle, egress_folder
from node.egress.release import ReleaseNoise
from node.errors import AlreadyJoined, NodeRefused, SessionFailed
from node.protocol.masking import MaskPrefetch, cape_sum_payload
from node.records.atomic import atomic_write_json
from node.records.cape_state import CapeMaterial, CapeStore
from node.records.ledger import Release
from node.records.session_state import SessionStore
from node.runner import NodeRunner
from node.session.cape_material import cape_state
from node.session.cape_round import run_cape_sum_round
from node.session.context import NodeOptions, SessionContext
from node.session.egress_steps import (
    bundle_before_restart,
    check_bundle_noise,
    release_again,
)
from node.session.joining import join
from node.session.model_round import run_model_round
from node.session.resume import catch_up
from noise.keys import EphemeralKey
from noise.layout import payload_sha256
from proto.messages import RoundState, RoundSummary, SessionState, SessionStatus
from tests.node.fake_gateway import FakeCoordinator, running
from tests.node.nodes import (
    CONFIG_HASH,
    LAYOUT,
    Node,
    joined,
    local_setup,
    peer_bundles,
    restarted,
)
from tests.node.restarts import CLEAN, IDS, U64, _at_gate, _node
from tests.node.unmask_requests import _answer, _released, _request, _unmask_entries
from tests.support.made_up_federation import (
    SENSITIVITIES,
    SESSION,
    _config,
    _seeds,
    release_for,
)

# ---------------------------------------------------------------- unmask answers


def test_a_restart_keeps_the_dropped_set_growing(tmp_path: Path) -> None:
    first = _node(tmp_path)
    noise = _released(first, IDS, [1])
    _answer(first, _request(IDS, 1, ["a", "b", "d"], ["c"]), IDS, noise, awaiting=1)
    again = _node(tmp_path)
    assert again.progress.revealed[1].dropped == {"c"}
    with pytest.raises(NodeRefused, match=r"reveals pair terms with \{b\} after \{c\}"):
        _answer(again, _request(IDS, 1, ["a", "c", "d"], ["b"]), IDS, noise, awaiting=1)
    assert again.coordinator.sent_answers() == []


def test_a_restart_never_drops_a_survivor_of_an_answered_attempt(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d", "e", "f"]
    config = _config(ids, threshold=2)
    first = joined(tmp_path, config)
    noise = _released(first, ids, [0])
    _answer(first, _request(ids, 0, list("abcde"), ["f"]), ids, noise, awaiting=0)
    again = restarted(tmp_path, config)
    # The uninterrupted node refuses this (the laggard attack); so must the restarted one.
    with pytest.raises(NodeRefused, match="drops 'e', which was a survivor"):
        _answer(again, _request(ids, 0, list("abcd"), ["e", "f"]), ids, noise, awaiting=0)
    assert again.coordinator.sent_answers() == []


def test_an_answer_sent_again_after_a_restart_is_the_same_and_recorded_once(
    tmp_path: Path,
) -> None:
    first = _node(tmp_path)
    noise = _released(first, IDS, [1])
    request = _request(IDS, 1, ["a", "b", "c"], ["d"])
    _answer(first, request, IDS, noise, awaiting=1)
    # The answer may never have reached the coordinator; it asks again.
    again = _node(tmp_path)
    _answer(again, request, IDS, noise, awaiting=1)
    # Its attestation is already in the request, so it is not signed again.
    assert again.coordinator.sent == [("answer", 1, ("d",))]
    assert [a.payload for a in again.coordinator.answers] == [
        a.payload for a in first.coordinator.answers
    ]
    assert _unmask_entries(again) == [(1, ["d"])]


# ---------------------------------------------------------------- the bundle written before


def _planned_now(node: Node, found: EgressBundle) -> ReleaseNoise:
    """The noise the node plans for round 1 now, checked against the one ``found`` declares.

    This is how a model round takes up a bundle written before a restart
    (``node.session.model_round.run_model_round``).
    """
    noise = release_for(node.ctx.config, IDS, "a", SENSITIVITIES)
    check_bundle_noise(found, noise, LAYOUT)
    return noise


def test_a_bundle_left_at_the_gate_is_approved_and_recorded_once(tmp_path: Path) -> None:
    noise, egress = _at_gate(tmp_path)
    folder = egress_folder(tmp_path, 1)
    payload = (folder / "payload.npy").read_bytes()
    manifest = EgressBundle.manifest_sha256(folder)
    for restart in range(2):
        node = _node(tmp_path)
        found = bundle_before_restart(node.ctx, 1, "scatter")
        assert found is not None and np.array_equal(found.payload, egress)
        again = _planned_now(node, found)
        assert again.mu() == noise.mu()
        release_again(
            node.ctx,
            index=1,
            name="scatter",
            layout=LAYOUT,
            noise=again,
            clean=CLEAN,
            bundle=found,
        )
        releases = [e for e in node.ctx.ledger.entries if isinstance(e, Release)]
        assert [(e.round_index, e.manifest_sha256) for e in releases] == [(1, manifest)]
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
    node = _node(tmp_path)
    found = bundle_before_restart(node.ctx, 1, "scatter")
    assert found is not None
    release_again(
        node.ctx,
        index=1,
        name="scatter",
        layout=LAYOUT,
        noise=_planned_now(node, found),
        clean=CLEAN,
        bundle=found,
    )
    record = json.loads((audit / "audit.json").read_text())
    assert record["egress_payload_sha256"] == found.payload_sha256


def test_checksum_records_a_kill_left_unwritten_are_restored(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    records = egress_folder(tmp_path, 1) / "checksums"
    kept = {path.name: path.read_text() for path in records.iterdir()}
    assert set(kept) == {
        f"{n}.txt" for n in ("manifest.json", "payload.npy", "values.csv", "results.json")
    }
    # Killed after the manifest, while writing checksums/: ACRO's records are
    # missing, and the temporary file of an interrupted atomic write is left.
    shutil.rmtree(records)
    records.mkdir()
    (records / ".values.csv.txt.k3j2h1.tmp").write_text("0123")
    assert bundle_before_restart(_node(tmp_path).ctx, 1, "scatter") is not None
    assert {path.name: path.read_text() for path in records.iterdir()} == kept


def test_a_folder_without_a_manifest_holds_no_bundle(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    (egress_folder(tmp_path, 1) / "manifest.json").unlink()
    assert bundle_before_restart(_node(tmp_path).ctx, 1, "scatter") is None
    assert bundle_before_restart(_node(tmp_path).ctx, 2, "scatter") is None


def test_a_damaged_bundle_stops_the_node(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    values = egress_folder(tmp_path, 1) / "values.csv"
    values.write_text(values.read_text().replace(",", ";", 9))
    with pytest.raises(SessionFailed, match=r"failed verification.*never recomputes a release"):
        bundle_before_restart(_node(tmp_path).ctx, 1, "scatter")


def test_a_bundle_of_another_round_stops_the_node(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    with pytest.raises(SessionFailed, match=r"not this node's round 1 \('moments'\)"):
        bundle_before_restart(_node(tmp_path).ctx, 1, "moments")


def test_only_the_recorded_release_is_sent(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    first = _node(tmp_path)
    first.ctx.ledger.record_release(
        session_id=SESSION,
        round_index=1,
        round_name="scatter",
        mu={},
        manifest_sha256="ab" * 32,
        payload_sha256="cd" * 32,
    )
    with pytest.raises(SessionFailed, match="refusing to send anything but the recorded release"):
        bundle_before_restart(_node(tmp_path).ctx, 1, "scatter")


def test_a_bundle_planned_with_other_noise_is_not_resubmitted(tmp_path: Path) -> None:
    _at_gate(tmp_path)
    node = _node(tmp_path)
    # Round 1 opens again among three nodes: the bundle was planned for four.
    with (
        MaskPrefetch(node.ctx.seeds, node.ctx.codec) as masks,
        pytest.raises(SessionFailed, match="with other noise than this node plans"),
    ):
        run_model_round(
            node.ctx, node.progress, masks, index=1, name="scatter", participants=("a", "b", "c")
        )
    assert node.coordinator.sent == []


# ---------------------------------------------------------------- catching up


def _status(*rounds: RoundSummary) -> SessionStatus:
    return running(SESSION, *rounds)


CAPE = "cape-sum/moments"


def _cape_node(out: Path, *, submitted: Sequence[str] = ("a", "c")) -> Node:
    """A CAPE node restarted in round 0 (the first CAPE sum), which ``submitted`` sent."""
    config = _config(IDS, threshold=1, construction="cape", min_nodes=2)
    status = _status(RoundSummary(0, CAPE, RoundState.OPEN, submitted=tuple(submitted), dropped=()))
    return _node(out, config, status=status)


def _saved_draws(out: Path) -> U64:
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


def _cape_sum_round(node: Node, participants: Sequence[str] = IDS) -> None:
    run_cape_sum_round(
        node.ctx, node.progress, index=0, name=CAPE, participants=tuple(participants)
    )


def test_a_cape_node_that_sent_a_share_without_saved_material_stops(tmp_path: Path) -> None:
    node = _cape_node(tmp_path)
    catch_up(node.ctx, node.progress)
    assert node.progress.cape_sent == {"moments"}
    with pytest.raises(SessionFailed, match="holds no saved CAPE material for it; drawing afresh"):
        _cape_sum_round(node)
    assert node.coordinator.sent == []
    assert not (tmp_path / "audit").exists()  # nothing was drawn


def test_a_noted_share_without_saved_material_stops_too(tmp_path: Path) -> None:
    # The coordinator may not have the share yet; the note says it may have left.
    _note(tmp_path, "ab" * 32)
    node = _cape_node(tmp_path, submitted=())
    catch_up(node.ctx, node.progress)
    with pytest.raises(SessionFailed, match="holds no saved CAPE material"):
        _cape_sum_round(node)
    assert node.coordinator.sent == []


def test_damaged_cape_material_stops_the_node(tmp_path: Path) -> None:
    _saved_draws(tmp_path)
    draws = tmp_path / "audit" / "cape-moments" / "draws.npy"
    draws.write_bytes(draws.read_bytes()[:-1] + b"\x01")
    node = _cape_node(tmp_path)
    catch_up(node.ctx, node.progress)
    with pytest.raises(
        SessionFailed,
        match=r"cannot resume the CAPE rounds of 'moments' .*/draws.npy has sha256 .* never draws",
    ):
        _cape_sum_round(node)
    assert node.coordinator.sent == []


def test_a_share_that_differs_from_the_noted_one_is_not_sent(tmp_path: Path) -> None:
    draws = _saved_draws(tmp_path)
    node = _cape_node(tmp_path)
    share = cape_sum_payload(draws, IDS, "a", _seeds(IDS)["a"], LAYOUT, round_index=0)
    # The noted share went out among other participants (or from other draws).
    _note(tmp_path, payload_sha256(share).hex())
    catch_up(node.ctx, node.progress)
    with pytest.raises(SessionFailed, match=r"is not the share .*cape-sum.json notes"):
        _cape_sum_round(node, ("a", "b", "c"))
    assert node.coordinator.sent == []
    # Among the noted participants it is the same share, and the saved draws are those used.
    node.progress.cape.clear()
    assert cape_state(node.ctx, node.progress, "moments", LAYOUT) is not None
    assert np.array_equal(node.progress.cape["moments"].draws, draws)


def test_a_cape_node_that_sent_nothing_resumes(tmp_path: Path) -> None:
    config = _config(IDS, threshold=1, construction="cape", min_nodes=2)
    status = _status(RoundSummary(0, "cape-sum/moments", RoundState.OPEN, submitted=(), dropped=()))
    node = _node(tmp_path, config, status=status)
    catch_up(node.ctx, node.progress)
    assert node.lines == [
        f"zerosum node a: resuming session {SESSION}: no round aggregated yet, round 0 "
        "('cape-sum/moments') not written yet here"
    ]


def test_a_node_dropped_while_away_stops(tmp_path: Path) -> None:
    status = _status(
        RoundSummary(0, "moments", RoundState.READY, submitted=("b", "c", "d"), dropped=("a",)),
        RoundSummary(1, "scatter", RoundState.OPEN, submitted=(), dropped=()),
    )
    node = _node(tmp_path, status=status)
    with pytest.raises(SessionFailed, match=r"dropped this node from round 0 \('moments'\)"):
        catch_up(node.ctx, node.progress)


# ---------------------------------------------------------------- joining again


def _coordinator(state: SessionState = SessionState.RUNNING) -> FakeCoordinator:
    """A coordinator whose session is in ``state``, with b, c and d on its roster."""
    status = SessionStatus(
        session_id=SESSION, state=state, config_hash=CONFIG_HASH, reason="", rounds=()
    )
    return FakeCoordinator("a", status_reply=status, peers=peer_bundles(_config(IDS)))


def _join(
    out: Path, coordinator: FakeCoordinator, lines: list[str] | None = None
) -> SessionContext:
    """Node a joins over ``out``, knowing nothing but what that folder holds."""
    say = NodeRunner(out, "a", progress=(lines if lines is not None else []).append).say
    setup = local_setup(out, _config(IDS, threshold=1))
    return join(setup, coordinator, NodeOptions(approve="auto"), say, lambda: None)


def test_the_key_is_saved_before_the_join_and_reused_after_a_restart(tmp_path: Path) -> None:
    lines: list[str] = []
    coordinator = _coordinator()
    first = _join(tmp_path, coordinator)
    assert not first.resuming
    saved = SessionStore(tmp_path).resume(session_id=SESSION, node_id="a", config_hash=CONFIG_HASH)
    assert saved is not None
    assert saved[1].public_bytes() == first.ephemeral.public_bytes()
    again = _join(tmp_path, coordinator, lines)
    assert again.resuming
    assert again.ephemeral.private_bytes() == first.ephemeral.private_bytes()
    bundles = coordinator.joined
    # Ed25519 is deterministic: the very same signed bundle, which the coordinator takes again.
    assert bundles[0] == bundles[1]
    assert lines == [
        f"zerosum node a: rejoined session {SESSION} with the key saved in "
        f"{tmp_path / 'session.key'} (1 of 4 nodes joined)",
        "zerosum node a: roster verified: {a, b, c, d}",
    ]


def test_a_coordinator_holding_another_key_is_explained(tmp_path: Path) -> None:
    coordinator = _coordinator()
    coordinator.join_error = AlreadyJoined(
        "Join",
        "FAILED_PRECONDITION",
        "node 'a' already joined session 'S' with key 1234; a second key 5678 is refused.",
    )
    with pytest.raises(SessionFailed, match="already holds another session key of this node"):
        _join(tmp_path, coordinator)


def test_a_failed_session_discards_its_key(tmp_path: Path) -> None:
    _join(tmp_path, _coordinator())
    with pytest.raises(SessionFailed, match="has already ended"):
        _join(tmp_path, _coordinator(SessionState.ABORTED))
    assert not (tmp_path / "session.key").exists()


def test_a_completed_session_may_still_be_collected_with_the_saved_key(tmp_path: Path) -> None:
    _join(tmp_path, _coordinator())
    late = _join(tmp_path, _coordinator(SessionState.COMPLETED))
    assert late.resuming
    # Without a saved key there is nothing to collect.
    (tmp_path / "session.key").unlink()
    (tmp_path / "session.json").unlink()
    with pytest.raises(SessionFailed, match="replaying"):
        _join(tmp_path, _coordinator(SessionState.COMPLETED))


def test_the_key_of_an_earlier_session_is_replaced_at_the_next_join(tmp_path: Path) -> None:
    old = EphemeralKey.generate()
    SessionStore(tmp_path).start(session_id="f" * 32, node_id="a", config_hash=CONFIG_HASH, key=old)
    coordinator = _coordinator()
    ctx = _join(tmp_path, coordinator)
    assert not ctx.resuming
    assert (tmp_path / "session.key").read_bytes() == ctx.ephemeral.private_bytes()
    assert ctx.ephemeral.private_bytes() != old.private_bytes()
    assert coordinator.joined[0].public_key == ctx.ephemeral.public_bytes()


def test_a_restart_leaves_a_checkers_approval_being_written_alone(tmp_path: Path) -> None:
    # An output checker's atomic write of approval.json goes through its own
    # temporary file; a node restarting at that moment must not delete it.
    _at_gate(tmp_path)
    folder = egress_folder(tmp_path, 1)
    checker = folder / ".approval.json.a1b2c3.tmp"
    checker.write_text("{}")
    node_left = folder / ".values.csv.z9y8x7.tmp"
    node_left.write_text("0123")
    assert bundle_before_restart(_node(tmp_path).ctx, 1, "scatter") is not None
    assert checker.exists() and not node_left.exists()
