"""What a restarted node reads back from its ledger: the release of a round, what it revealed."""

from __future__ import annotations

from pathlib import Path

from node.records.ledger import PrivacyLedger
from tests.support.ledger_entries import refusal, release, unmask

DELTA = 1e-6


def _ledger(tmp_path: Path) -> PrivacyLedger:
    ledger = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    for session, index in (("s1", 0), ("s1", 1), ("s2", 0)):
        release(
            ledger,
            (session, index, f"r{index}"),
            {"outsider": 0.3},
            f"{session}-{index}",
            f"{index:02d}" * 32,
        )
    return ledger


def _unmask(ledger: PrivacyLedger, session: str, dropped: list[str], survivors: list[str]) -> None:
    unmask(ledger, (session, 0, "r0"), dropped, survivors, {"outsider": 0.3, "coordinator": 0.5})


def test_the_release_entry_of_a_round_is_found_by_session_and_round(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    found = ledger.release_entry("s1", 1)
    assert found is not None and found.manifest_sha256 == "s1-1"
    assert ledger.release_entry("s2", 1) is None
    assert ledger.has_release("s2", 0) and not ledger.has_release("s3", 0)


def test_revealed_is_the_union_over_the_answers_of_each_round(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    _unmask(ledger, "s1", ["d"], ["a", "b", "c", "e"])
    _unmask(ledger, "s1", ["d", "e"], ["a", "b", "c"])
    _unmask(ledger, "s2", ["b"], ["a", "c"])
    refusal(ledger, ("s1", 1, "r1"), ["c"], ["a", "b"], "below the floor")
    ledger.record_secure_sum_unmask(
        session_id="s1", round_index=2, round_name="cape-sum/r1", dropped=["b"], survivors=["a"]
    )
    reopened = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    assert reopened.revealed("s1") == {
        0: (frozenset({"d", "e"}), frozenset({"a", "b", "c", "e"})),
        2: (frozenset({"b"}), frozenset({"a"})),
    }
    assert reopened.revealed("s2") == {0: (frozenset({"b"}), frozenset({"a", "c"}))}
    assert reopened.revealed("s3") == {}


def test_an_unmask_is_matched_by_both_its_sets_in_any_order(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    _unmask(ledger, "s1", ["d"], ["a", "b", "c"])
    assert ledger.has_unmask("s1", 0, dropped=["d"], survivors=["c", "a", "b"])
    assert not ledger.has_unmask("s1", 0, dropped=["d"], survivors=["a", "b"])
    assert not ledger.has_unmask("s1", 0, dropped=["c", "d"], survivors=["a", "b", "c"])
    assert not ledger.has_unmask("s2", 0, dropped=["d"], survivors=["a", "b", "c"])
