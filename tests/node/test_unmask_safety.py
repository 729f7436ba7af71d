"""A node answers at most what its noise floor allows, across every unmask attempt of a round.

The node's unmask answers (``node.session.unmask_answers.answer``) are driven
directly with hand-built, correctly signed requests (a coordinator that may
lie), and a fake coordinator that records what the node sent
(``tests.node.fake_gateway``). Each test names the leak it stops:

* a request for a round other than the one awaited (its round check used to
  compare the request with itself);
* two requests for one round whose dropped sets together strip the node;
* a survivor of an answered attempt moved into D (the laggard attack: the
  difference of two answers isolates the pair terms with that node);
* a CAPE rerun among fewer nodes, and a CAPE-sum unmask leading to one, that
  would leave the egress below the floor.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from node.egress.release import ReleaseNoise, cape_floor_shortfall, with_cape_participants
from node.errors import NodeRefused
from node.protocol.masking import MaskPrefetch, cape_draws
from node.records.ledger import Refusal, SecureSumUnmask
from node.session.cape_material import CapeState
from node.session.model_round import run_model_round
from proto.messages import Sealed, UnmaskRequest
from tests.node.nodes import CONFIG_HASH, LAYOUT, Node, joined, restarted
from tests.node.unmask_requests import (
    LAYOUT_ZEROS,
    _answer,
    _node,
    _released,
    _request,
    _unmask_entries,
)
from tests.support.made_up_federation import (
    SENSITIVITIES,
    SESSION,
    _config,
    _identities,
    _tensors,
    release_for,
)
from tests.support.sealed_sets import signed_set

# ---------------------------------------------------------------- 1: the round awaited


def test_a_request_for_another_round_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d"]
    node = _node(tmp_path, _config(ids, threshold=1))
    noise = _released(node, ids, [0, 1])
    # Awaiting round 1, the node is asked about round 0 (which had no dropout).
    with pytest.raises(NodeRefused, match=r"concerns round 0, but I am awaiting .* round 1"):
        _answer(node, _request(ids, 0, ["a", "b", "c"], ["d"]), ids, noise, awaiting=1)
    sent = node.coordinator.sent
    assert [s[0] for s in sent] == ["refuse"]
    assert _unmask_entries(node) == []
    assert [e.kind for e in node.ctx.ledger.entries][-1] == "refusal"


def test_the_attestation_and_answer_carry_the_round_awaited(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d"]
    node = _node(tmp_path, _config(ids, threshold=1))
    noise = _released(node, ids, [0, 1])
    _answer(node, _request(ids, 1, ["a", "b", "c"], ["d"]), ids, noise, awaiting=1)
    assert node.coordinator.sent == [("attest", 1), ("answer", 1, ("d",))]
    assert _unmask_entries(node) == [(1, ["d"])]


# ---------------------------------------------------------------- 2: the dropped set only grows


def test_a_second_dropped_set_of_the_same_round_must_contain_the_first(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d"]
    node = _node(tmp_path, _config(ids, threshold=1))
    noise = _released(node, ids, [1])
    _answer(node, _request(ids, 1, ["a", "b", "d"], ["c"]), ids, noise, awaiting=1)
    # Alone, D = {b} passes the floor check; with {c} already revealed it would not.
    assert noise.floor_shortfall(["b"]) is None
    assert noise.floor_shortfall(["b", "c"]) is not None
    with pytest.raises(
        NodeRefused,
        match=r"reveals pair terms with \{b\} after \{c\} was already revealed; "
        "an unmask may only grow the dropped set",
    ):
        _answer(node, _request(ids, 1, ["a", "c", "d"], ["b"]), ids, noise, awaiting=1)
    assert node.coordinator.sent_answers() == [("answer", 1, ("c",))]
    assert _unmask_entries(node) == [(1, ["c"])]


def test_the_revealed_set_is_kept_per_round(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d"]
    node = _node(tmp_path, _config(ids, threshold=1))
    noise = _released(node, ids, [0, 1])
    _answer(node, _request(ids, 0, ["a", "b", "d"], ["c"]), ids, noise, awaiting=0)
    # Round 1 is another release with other stream keys: a different D is fine there.
    _answer(node, _request(ids, 1, ["a", "c", "d"], ["b"]), ids, noise, awaiting=1)
    assert node.coordinator.sent_answers() == [("answer", 0, ("c",)), ("answer", 1, ("b",))]
    assert _unmask_entries(node) == [(0, ["c"]), (1, ["b"])]


# ---------------------------------------------------------------- 3: no laggard stripping


def test_a_survivor_of_an_answered_attempt_may_not_be_dropped_later(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d", "e", "f"]
    node = _node(tmp_path, _config(ids, threshold=2))
    noise = _released(node, ids, [0])
    _answer(node, _request(ids, 0, list("abcde"), ["f"]), ids, noise, awaiting=0)
    # e attested attempt 1, then went silent; its floor would pass on its own.
    assert noise.floor_shortfall(["e", "f"]) is None
    with pytest.raises(NodeRefused) as refused:
        _answer(node, _request(ids, 0, list("abcd"), ["e", "f"]), ids, noise, awaiting=0)
    reason = str(refused.value)
    assert "drops 'e', which was a survivor when I already sent my pair terms with {f}" in reason
    assert "would strip that node's noise" in reason
    assert node.coordinator.sent_answers() == [("answer", 0, ("f",))]
    assert node.coordinator.sent[-1][0] == "refuse"
    refusal = node.ctx.ledger.entries[-1]
    assert isinstance(refusal, Refusal) and refusal.dropped == ("e", "f")


def test_a_second_survivor_set_for_a_round_is_refused_even_before_anyone_answered(
    tmp_path: Path,
) -> None:
    ids = ["a", "b", "c", "d", "e", "f"]
    node = _node(tmp_path, _config(ids, threshold=2))
    noise = _released(node, ids, [0])
    # e never attests, so nobody can answer this request.
    first = _request(ids, 0, list("abcde"), ["f"], attested=list("abcd"))
    _answer(node, first, ids, noise, awaiting=0)
    assert node.coordinator.sent == [("attest", 0)]
    # The coordinator might have shown e the attestations of a-d and got e's seed,
    # so a smaller set for the same round would strip e: the round is rerun instead.
    with pytest.raises(NodeRefused, match="A survivor set is signed once per round"):
        _answer(node, _request(ids, 0, list("abcd"), ["e", "f"]), ids, noise, awaiting=0)
    assert node.coordinator.sent_answers() == []
    assert _unmask_entries(node) == []


def test_the_signed_survivor_set_binds_a_restarted_node(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d", "e", "f"]
    config = _config(ids, threshold=2)
    first = joined(tmp_path, config)
    noise = _released(first, ids, [0])
    _answer(
        first, _request(ids, 0, list("abcde"), ["f"], attested=list("abcd")), ids, noise, awaiting=0
    )
    again = restarted(tmp_path, config)
    with pytest.raises(NodeRefused, match=r"I already signed survivors \{a, b, c, d, e\}"):
        _answer(again, _request(ids, 0, list("abcd"), ["e", "f"]), ids, noise, awaiting=0)
    assert again.coordinator.sent_answers() == []


# ---------------------------------------------------------------- 4: CAPE among fewer nodes


def _cape_noise(ids: list[str], threshold: int) -> ReleaseNoise:
    config = _config(ids, threshold=threshold, construction="cape", min_nodes=2)
    return release_for(config, ids, "a", SENSITIVITIES)


def test_a_cape_rerun_keeps_the_floor_only_while_the_dropouts_fit_the_threshold() -> None:
    ids = ["a", "b", "c", "d", "e"]
    noise = _cape_noise(ids, threshold=2)
    assert cape_floor_shortfall(noise, 2, 0) is None
    # Two dropped with T = 2: τ²(1 − 1/3) is exactly the target again.
    assert cape_floor_shortfall(with_cape_participants(noise, ids[:3]), 2, 2) is None
    rerun = with_cape_participants(noise, ["a", "b"])
    # τ² is kept, K shrinks: even an outsider now sees less than the target.
    assert rerun.sigma("n") < np.sqrt(rerun.floor_variance("n"))
    reason = cape_floor_shortfall(rerun, 2, 3)
    assert reason is not None
    assert reason.startswith("a CAPE rerun among 2 nodes would leave σ = 6.337 on my egress")
    assert "below my floor of 7.317" in reason
    # The full T colluders among the survivors would leave less than any rerun can keep.
    assert cape_floor_shortfall(with_cape_participants(noise, ids[:4]), 2, 0) is not None


class _Plan:
    """The one plan method a CAPE model round calls before its floor check."""

    def tensors(self, name: str) -> dict[str, np.ndarray]:
        return _tensors(0)


def test_a_cape_rerun_below_the_floor_is_not_released(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d", "e"]
    config = _config(ids, threshold=2, construction="cape", min_nodes=2)
    node = _node(tmp_path, config, plan=_Plan())
    survivors = ("a", "b")
    noise = with_cape_participants(release_for(config, ids, "a", SENSITIVITIES), survivors)
    draws = cape_draws(noise, LAYOUT, seed=bytes([91]) * 32, round_index=0)
    # The CAPE sum of the rerun among a and b is in.
    node.progress.cape["scatter"] = CapeState(
        noise=noise, draws=draws, participants=survivors, total=draws.copy(), planned=tuple(ids)
    )
    with (
        MaskPrefetch(node.ctx.seeds, node.ctx.codec) as masks,
        pytest.raises(NodeRefused, match="a CAPE rerun among 2 nodes would leave σ = "),
    ):
        run_model_round(
            node.ctx, node.progress, masks, index=3, name="scatter", participants=survivors
        )
    assert node.coordinator.sent == []
    assert not (tmp_path / "egress").exists()
    assert node.ctx.ledger.entries == ()


def test_a_cape_sum_unmask_is_floor_checked_and_recorded(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "d", "e"]
    name = "cape-sum/scatter"
    # Threshold 1: losing e leaves four nodes, above the floor.
    node = _node(tmp_path, _config(ids, threshold=1, construction="cape"))
    noise = _cape_noise(ids, threshold=1)
    node.progress.cape["scatter"] = CapeState(noise=noise, draws=LAYOUT_ZEROS, planned=tuple(ids))
    request = _request(ids, 0, ids[:4], ["e"], round_name=name)
    _answer(node, request, ids, noise, awaiting=0, name=name)
    assert node.coordinator.sent_answers() == [("answer", 0, ("e",))]
    entry = node.ctx.ledger.entries[-1]
    assert isinstance(entry, SecureSumUnmask) and entry.kind == "unmask"
    assert entry.dropped == ("e",) and dict(entry.mu) == {}
    assert node.ctx.ledger.release_mu() == {}  # the pads are not a release

    # Threshold 2: a CAPE sum among a and b only would leave the model round below the floor.
    (tmp_path / "t2").mkdir()
    node = _node(tmp_path / "t2", _config(ids, threshold=2, construction="cape"))
    noise = _cape_noise(ids, threshold=2)
    node.progress.cape["scatter"] = CapeState(noise=noise, draws=LAYOUT_ZEROS, planned=tuple(ids))
    request = _request(ids, 0, ["a", "b"], ["c", "d", "e"], round_name=name)
    with pytest.raises(NodeRefused, match="a CAPE rerun among 2 nodes would leave σ"):
        _answer(node, request, ids, noise, awaiting=0, name=name)
    assert node.coordinator.sent_answers() == []
    assert [e.kind for e in node.ctx.ledger.entries] == ["refusal"]


FOUR = ["a", "b", "c", "d"]


def _d_dropped(tmp_path: Path) -> tuple[Node, ReleaseNoise, UnmaskRequest]:
    """Node a of four, round 1 released, asked to unmask it for survivors a, b, c (d dropped)."""
    node = _node(tmp_path, _config(FOUR))
    noise = _released(node, FOUR, [1])
    return node, noise, _request(FOUR, 1, ["a", "b", "c"], ["d"])


def _signed_garbage(sender: str, kind: str, binding: bytes, size: int) -> Sealed:
    """``size`` zero bytes from ``sender`` to a, sealed for nothing but validly signed."""
    (item,) = signed_set(
        _identities(FOUR)[sender],
        config_hash=CONFIG_HASH,
        session_id=SESSION,
        round_index=1,
        kind=kind,
        binding=binding,
        sender=sender,
        bodies={"a": bytes(size)},
        relayed=True,
    )
    return item


def test_an_answer_needs_every_other_survivors_sealed_contribution(tmp_path: Path) -> None:
    node, noise, request = _d_dropped(tmp_path)
    withheld = dataclasses.replace(request, challenge=request.challenge[:-1])
    with pytest.raises(
        NodeRefused, match="does not relay the challenge contribution of survivor 'c'"
    ):
        _answer(node, withheld, FOUR, noise, awaiting=1)
    assert node.coordinator.sent_answers() == []


def test_a_sealed_contribution_altered_in_relay_is_refused(tmp_path: Path) -> None:
    node, noise, request = _d_dropped(tmp_path)
    first, *rest = request.challenge
    altered = dataclasses.replace(
        request,
        challenge=(
            dataclasses.replace(first, sealed=bytes([first.sealed[0] ^ 1]) + first.sealed[1:]),
            *rest,
        ),
    )
    with pytest.raises(NodeRefused, match="does not carry 'b''s valid signature"):
        _answer(node, altered, FOUR, noise, awaiting=1)
    assert node.coordinator.sent_answers() == []
    assert node.coordinator.accused == [""]


def test_a_signed_garbage_contribution_names_its_sender_and_reveals_nothing(
    tmp_path: Path,
) -> None:
    """b signed bytes that do not open for a: a names b, attests nothing, sends no seed."""
    node, noise, request = _d_dropped(tmp_path)
    forged = _signed_garbage("b", "contribution", bytes(32), 48)
    bad = dataclasses.replace(request, challenge=(forged, *request.challenge[1:]))
    _answer(node, bad, FOUR, noise, awaiting=1)
    assert node.coordinator.accused == ["b"]
    assert "survivor 'b' is at fault" in node.coordinator.refusals[0][1]
    assert node.coordinator.sent_answers() == []
    assert node.coordinator.attestations == []
    assert [e.kind for e in node.ctx.ledger.entries] == ["release", "refusal"]


def test_signed_garbage_tags_name_their_sender_before_any_seed_leaves(tmp_path: Path) -> None:
    node, noise, request = _d_dropped(tmp_path)
    garbage = _signed_garbage("c", "tags", request.survivor_hash, 80)
    bad = dataclasses.replace(request, tags=(request.tags[0], garbage))
    _answer(node, bad, FOUR, noise, awaiting=1)
    assert len(node.coordinator.attestations) == 1
    assert node.coordinator.accused == ["c"]
    assert node.coordinator.sent_answers() == []


# ---------------------------------------------------------------- one signature per sender
#
# A sender signs everything it sealed in one call once, over the Merkle tree of
# its copies; the relay hands each recipient its copy with its place and audit
# path in that tree. The relay holds the signature and every copy, but no
# pairwise key.


def _garbage_among_copies(sender: str) -> Sealed:
    """``sender``'s garbage contribution for a, signed once with its copies for c and d,
    as an honest relay hands it to a (with its place and audit path)."""
    bodies = {"a": bytes(48), "c": bytes([1]) * 48, "d": bytes([2]) * 48}
    copies = signed_set(
        _identities(FOUR)[sender],
        config_hash=CONFIG_HASH,
        session_id=SESSION,
        round_index=1,
        kind="contribution",
        binding=bytes(32),
        sender=sender,
        bodies=bodies,
        relayed=True,
    )
    assert copies[0].recipient == "a" and copies[0].count == 3 and len(copies[0].path) == 2
    return copies[0]


def test_garbage_signed_with_the_senders_other_copies_names_the_sender(tmp_path: Path) -> None:
    node, noise, request = _d_dropped(tmp_path)
    relayed = _garbage_among_copies("b")
    bad = dataclasses.replace(request, challenge=(relayed, *request.challenge[1:]))
    _answer(node, bad, FOUR, noise, awaiting=1)
    assert node.coordinator.accused == ["b"]
    assert node.coordinator.sent_answers() == []


@pytest.mark.parametrize(
    "change", ["path cut", "path altered", "path longer", "other place", "other count"]
)
def test_a_relay_that_changes_a_copys_place_or_path_is_blamed_not_the_sender(
    tmp_path: Path, change: str
) -> None:
    """Without the path to the root b signed, b's signature does not hold: the relay is
    at fault."""
    node, noise, request = _d_dropped(tmp_path)
    copy = _garbage_among_copies("b")
    shown = {
        "path cut": dataclasses.replace(copy, path=copy.path[:1]),
        "path altered": dataclasses.replace(copy, path=(bytes(32), *copy.path[1:])),
        "path longer": dataclasses.replace(copy, path=(*copy.path, bytes(32))),
        "other place": dataclasses.replace(copy, index=1),
        "other count": dataclasses.replace(copy, count=4),
    }[change]
    bad = dataclasses.replace(request, challenge=(shown, *request.challenge[1:]))
    with pytest.raises(NodeRefused, match="does not carry 'b''s valid signature"):
        _answer(node, bad, FOUR, noise, awaiting=1)
    assert node.coordinator.accused == [""]
    assert node.coordinator.sent_answers() == []


def test_a_copy_that_opens_is_its_senders_whatever_signature_the_relay_puts_on_it(
    tmp_path: Path,
) -> None:
    """The relay cannot make a copy open (no pairwise key), so one that opens is the
    sender's: a swapped signature or a made-up path beside it change nothing."""
    node, noise, request = _d_dropped(tmp_path)
    first, *rest = request.challenge
    resigned = dataclasses.replace(first, signature=bytes(64), count=9, path=(bytes(32),))
    shown = dataclasses.replace(request, challenge=(resigned, *rest))
    _answer(node, shown, FOUR, noise, awaiting=1)
    honest = _d_dropped(tmp_path / "honest")
    _answer(honest[0], honest[2], FOUR, honest[1], awaiting=1)
    assert node.coordinator.accused == []
    assert node.coordinator.attestations == honest[0].coordinator.attestations
