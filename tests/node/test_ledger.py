"""The privacy ledger composes releases exactly in μ-GDP and survives reloads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from node.records.ledger import LedgerError, PrivacyLedger, UnmaskReveal, observer_of
from noise.accounting import Observer, gaussian_epsilon
from tests.support.ledger_entries import refusal, release, unmask

DELTA = 1e-6


def _release(ledger: PrivacyLedger, round_index: int, mu: dict[str, float]) -> None:
    release(
        ledger,
        ("s1", round_index, f"r{round_index}"),
        mu,
        "00" * 32,
        f"{round_index:02d}" * 32,
        tensors=["n"],
    )


def test_empty_ledger_has_no_totals(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    assert ledger.totals() == ()
    assert ledger.total("outsider").epsilon == 0.0
    assert not (tmp_path / "ledger.json").exists()


def test_releases_compose_as_root_sum_of_squares(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    _release(ledger, 0, {"outsider": 0.3, "coordinator": 0.1})
    _release(ledger, 1, {"outsider": 0.4, "coordinator": 0.2})
    outsider = ledger.total("outsider")
    assert outsider.mu == pytest.approx(0.5, rel=1e-15)
    assert outsider.epsilon == pytest.approx(gaussian_epsilon(0.5, DELTA), rel=1e-12)
    assert outsider.releases == 2
    assert ledger.total("coordinator").mu == pytest.approx(math.hypot(0.1, 0.2))


def test_unmask_raises_the_release_cost_to_its_new_mu(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    _release(ledger, 0, {"outsider": 0.3, "coordinator": 0.1})
    _release(ledger, 1, {"outsider": 0.4, "coordinator": 0.2})
    unmask(ledger, ("s1", 1, "r1"), ["c"], ["b", "a"], {"outsider": 0.4, "coordinator": 0.6})
    # round 1 now costs 0.6 against the coordinator (not 0.2 + 0.6)
    assert ledger.total("coordinator").mu == pytest.approx(math.hypot(0.1, 0.6))
    assert ledger.total("coordinator").releases == 2
    assert ledger.total("outsider").mu == pytest.approx(0.5)
    last = ledger.entries[-1]
    assert isinstance(last, UnmaskReveal) and last.survivors == ("a", "b")


def test_unbounded_mu_makes_the_class_unbounded(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    _release(ledger, 0, {"outsider": 0.3, "coordinator": math.inf})
    total = ledger.total("coordinator")
    assert total.mu == math.inf
    assert total.epsilon == math.inf
    document = json.loads((tmp_path / "ledger.json").read_text())
    assert document["totals"]["coordinator"]["epsilon"] == "inf"
    assert document["entries"][0]["mu"]["coordinator"] == "inf"


def test_reload_reproduces_entries_and_totals(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger.open(path, "a", DELTA)
    _release(ledger, 0, {"outsider": 0.3, "coalition:1": 0.5, "coordinator": math.inf})
    refusal(
        ledger,
        ("s1", 0, "r0"),
        ["c"],
        ["a"],
        "survivor set of 1 is below the federation minimum of 2",
    )
    again = PrivacyLedger.open(path, "a", DELTA)
    assert again.entries == ledger.entries
    assert again.totals() == ledger.totals()
    assert [t.label for t in again.totals()] == ["outsider", "coordinator", "coalition:1"]
    document = json.loads(path.read_text())
    assert document["format"] == "zerosum-ledger"
    assert document["entries"][1]["details"]["reason"].startswith("survivor set of 1")


def test_projection_does_not_change_the_ledger(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    _release(ledger, 0, {"outsider": 0.3})
    before = ledger.to_json()["entries"]
    projected = ledger.projected_epsilon("outsider", {"outsider": 0.4})
    assert projected == pytest.approx(gaussian_epsilon(0.5, DELTA), rel=1e-12)
    assert ledger.to_json()["entries"] == before


def test_rejected_entries_leave_ledger_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger.open(path, "a", DELTA)
    _release(ledger, 0, {"outsider": 0.3})
    saved = path.read_bytes()
    # The same payload of the same round again is the same release: nothing is added.
    _release(ledger, 0, {"outsider": 0.3})
    with pytest.raises(LedgerError, match="payload_sha256 must be 64 lowercase hex digits"):
        release(ledger, ("s1", 1, "r1"), {"outsider": 0.3}, "00" * 32, "not-a-digest")
    with pytest.raises(LedgerError, match="no release for it"):
        unmask(ledger, ("s1", 5, "r5"), ["c"], ["a"], {"outsider": 1.0})
    with pytest.raises(LedgerError, match="must be >= 0"):
        _release(ledger, 1, {"outsider": -1.0})
    with pytest.raises(LedgerError, match="observer class 'insider'"):
        _release(ledger, 1, {"insider": 1.0})
    assert path.read_bytes() == saved
    assert len(ledger.entries) == 1


def test_ledger_of_another_node_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    _release(PrivacyLedger.open(path, "a", DELTA), 0, {"outsider": 0.3})
    with pytest.raises(LedgerError, match="belongs to node 'a', not 'b'"):
        PrivacyLedger.open(path, "b", DELTA)
    path.write_text("{not json")
    with pytest.raises(LedgerError, match="not valid JSON"):
        PrivacyLedger.open(path, "a", DELTA)


def test_observer_labels() -> None:
    assert observer_of("outsider") == Observer("outsider")
    assert observer_of("coalition:3") == Observer("coalition", 3)
    with pytest.raises(LedgerError):
        observer_of("coalition:0")


def _payload_release(ledger: PrivacyLedger, payload: str, mu: float = 0.3) -> None:
    release(ledger, ("s1", 0, "sums"), {"outsider": mu}, "00" * 32, payload)


def test_a_different_payload_for_the_same_round_is_a_second_release(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    _payload_release(ledger, "aa" * 32)
    _payload_release(ledger, "aa" * 32)  # the same bytes again (a restart): one release
    assert ledger.total("outsider").releases == 1
    _payload_release(ledger, "bb" * 32, mu=0.4)
    total = ledger.total("outsider")
    assert total.releases == 2
    assert total.mu == pytest.approx(0.5, rel=1e-15)
    assert [e.payload_sha256 for e in ledger.release_entries("s1", 0)] == ["aa" * 32, "bb" * 32]
    reloaded = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    assert reloaded.total("outsider").releases == 2


def test_an_unmask_raises_only_the_release_it_names(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(tmp_path / "ledger.json", "a", DELTA)
    _payload_release(ledger, "aa" * 32)
    _payload_release(ledger, "bb" * 32)
    unmask(ledger, ("s1", 0, "sums"), ["c"], ["a", "b"], {"outsider": 0.3, "coordinator": 0.9})
    assert ledger.entries[-1].payload_sha256 == "bb" * 32  # the round's latest release
    costs = ledger.release_mu()
    assert costs[("s1", 0, "aa" * 32)] == {"outsider": 0.3}
    assert costs[("s1", 0, "bb" * 32)] == {"outsider": 0.3, "coordinator": 0.9}
    assert ledger.total("coordinator").releases == 1


def test_merge_adds_only_what_is_missing(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(tmp_path / "one.json", "a", DELTA)
    _payload_release(ledger, "aa" * 32)
    other = PrivacyLedger.open(tmp_path / "two.json", "a", DELTA)
    other.merge(ledger)
    _payload_release(other, "bb" * 32)
    assert ledger.merge(other) == 1
    assert ledger.merge(other) == 0
    assert ledger.total("outsider").releases == 2
    with pytest.raises(LedgerError, match="belongs to node 'b'"):
        ledger.merge(PrivacyLedger.open(tmp_path / "three.json", "b", DELTA))


def test_a_version_1_release_is_the_same_release_when_its_bundle_is_resent(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger.open(path, "a", DELTA)
    _payload_release(ledger, "aa" * 32)
    document = json.loads(path.read_text())
    document["version"] = 1
    del document["entries"][0]["details"]["payload_sha256"]  # as version 1 wrote it
    path.write_text(json.dumps(document))
    old = PrivacyLedger.open(path, "a", DELTA)
    # The same bundle (same manifest) resubmitted after an upgrade: still one release.
    _payload_release(old, "aa" * 32)
    assert old.total("outsider").releases == 1
    assert old.recorded_release("s1", 0, payload_sha256="aa" * 32, manifest_sha256="00" * 32)
