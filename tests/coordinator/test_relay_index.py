"""The coordinator's index of relayed sealed copies, grown as a round's rows arrive."""

from __future__ import annotations

from coordinator.steps.views import _RelayIndex, relayed_copies
from noise.transcript import sealed_root
from proto.messages import Sealed

NODES = [f"n{i}" for i in range(6)]
_Copies = tuple[tuple[str, bytes, bytes], ...]


def _copies(sender: str, tag: int) -> _Copies:
    return tuple(
        (r, bytes([tag, NODES.index(r)]) * 24, bytes([tag]) * 64) for r in NODES if r != sender
    )


def _rows(senders: list[str], tag: int = 1) -> dict[str, tuple[object, _Copies]]:
    return {s: (("row", s, tag), _copies(s, tag)) for s in senders}


def _everything(index: _RelayIndex) -> dict[str, tuple[Sealed, ...]]:
    return {r: index.get(r) for r in NODES}


def test_rows_added_one_at_a_time_index_as_all_at_once() -> None:
    grown, whole = _RelayIndex(), _RelayIndex()
    order = ["n3", "n0", "n5", "n1", "n4", "n2"]  # arrival order is not sender order
    for count in range(1, len(order) + 1):
        grown.update(_rows(order[:count]))
        assert [c.sender for c in grown.get("n2")] == sorted(s for s in order[:count] if s != "n2")
    whole.update(_rows(order))
    assert _everything(grown) == _everything(whole)
    for recipient in NODES:
        for copy in grown.get(recipient):
            assert copy.recipient == recipient
            # Each copy leads its recipient to the root its sender signed.
            expected = relayed_copies(copy.sender, _copies(copy.sender, 1))
            root = sealed_root(
                recipient, copy.sealed, index=copy.index, count=copy.count, path=copy.path
            )
            sibling = next(c for c in expected if c.recipient != recipient)
            assert root == sealed_root(
                sibling.recipient,
                sibling.sealed,
                index=sibling.index,
                count=sibling.count,
                path=sibling.path,
            )


def test_a_row_that_changed_or_went_away_rebuilds_the_index() -> None:
    index = _RelayIndex()
    index.update(_rows(NODES[:4]))
    changed = _rows(NODES[:4]) | _rows(["n1"], tag=9)
    index.update(changed)
    assert {c.sealed[0] for c in index.get("n0") if c.sender == "n1"} == {9}
    index.update(_rows(["n0", "n2"]))
    assert [c.sender for c in index.get("n1")] == ["n0", "n2"]
    assert index.get("nobody") == ()
