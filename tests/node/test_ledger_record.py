"""The typed privacy record: one frozen class per event, and old ledgers read the same."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from node.records.ledger import (
    LaplaceRelease,
    LedgerError,
    NoiseFacts,
    PrivacyLedger,
    Refusal,
    Release,
    SecureSumUnmask,
    UnmaskReveal,
)
from node.records.ledger_entry import entry_from_json
from noise.accounting import Observer
from tests.support.ledger_entries import release

# Written by the ledger code of format version 2 before the typed record
# existed (LedgerEntry(kind, details)); its "totals" block is what that code
# composed.
FIXTURE = Path(__file__).parent / "data" / "ledger_version_2.json"
NODE, DELTA = "site-a", 1e-6


def _document() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _number(value: float | str) -> float:
    return math.inf if value == "inf" else float(value)


def test_a_ledger_written_in_todays_format_gives_the_same_totals() -> None:
    document = _document()
    ledger = PrivacyLedger.open(FIXTURE, NODE, DELTA)
    totals = {t.label: t for t in ledger.totals()}
    assert list(totals) == list(document["totals"])
    for label, stored in document["totals"].items():
        total = totals[label]
        assert total.observer == Observer.parse(label)
        assert total.releases == stored["releases"], label
        assert total.mu == pytest.approx(_number(stored["mu"]), rel=1e-12), label
        assert total.epsilon == pytest.approx(_number(stored["epsilon"]), rel=1e-12), label
    assert totals["colluders:1"].laplace_epsilon == pytest.approx(0.05)


def test_each_entry_of_the_old_file_is_its_own_event_class_and_writes_back_unchanged() -> None:
    document = _document()
    ledger = PrivacyLedger.open(FIXTURE, NODE, DELTA)
    assert [type(e) for e in ledger.entries] == [
        Release,
        Release,
        UnmaskReveal,
        Refusal,
        LaplaceRelease,
        SecureSumUnmask,
        Release,
        Release,
    ]
    assert [e.to_json() for e in ledger.entries] == document["entries"]
    first, _, unmask, refusal, laplace, pads, cape_model, _ = ledger.entries
    assert isinstance(first, Release) and first.noise == NoiseFacts(
        "discrete Gaussian on the fixed-point grid", 0.0, 1.5e-12
    )
    assert first.tensors == ("xtx", "xty") and first.payload_sha256 == "a" * 64
    assert isinstance(unmask, UnmaskReveal) and unmask.payload_sha256 == "b" * 64
    assert unmask.dropped == ("site-c",) and unmask.mu["coalition:1"] == 0.31
    assert isinstance(refusal, Refusal) and refusal.reason.startswith("survivor set of 1")
    assert isinstance(laplace, LaplaceRelease) and laplace.epsilon == 0.05
    assert laplace.statistics == ("mae", "bias")
    assert isinstance(pads, SecureSumUnmask) and dict(pads.mu) == {}
    assert isinstance(cape_model, Release) and cape_model.noise is None
    assert math.isinf(cape_model.mu["coordinator"])


def test_an_old_ledger_merged_into_a_new_one_adds_each_event_once(tmp_path: Path) -> None:
    old = PrivacyLedger.open(FIXTURE, NODE, DELTA)
    fresh = PrivacyLedger.open(tmp_path / "ledger.json", NODE, DELTA)
    assert fresh.merge(old) == len(old.entries)
    assert fresh.merge(old) == 0
    again = PrivacyLedger.open(tmp_path / "ledger.json", NODE, DELTA)
    assert [t.epsilon for t in again.totals()] == [t.epsilon for t in old.totals()]


def test_events_are_immutable_and_keep_no_reference_to_the_callers_mu() -> None:
    mu = {"outsider": 0.2}
    event = Release(
        session_id="s",
        round_index=0,
        round_name="r",
        timestamp="t",
        mu=mu,
        payload_sha256="a" * 64,
        manifest_sha256="m",
        tensors=["w"],  # type: ignore[arg-type]  # a list is taken, kept as a tuple
    )
    mu["outsider"] = 9.0
    assert event.mu["outsider"] == 0.2 and event.tensors == ("w",)
    with pytest.raises(TypeError):
        event.mu["outsider"] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.round_index = 1  # type: ignore[misc]
    reveal = Refusal(
        session_id="s",
        round_index=0,
        round_name="r",
        timestamp="t",
        dropped=("c", "b"),
        survivors=("a",),
        reason="why",
    )
    assert reveal.dropped == ("b", "c")  # kept sorted, as the file writes them


def _entry(index: int) -> dict[str, Any]:
    return copy.deepcopy(_document()["entries"][index])


@pytest.mark.parametrize(
    ("index", "change", "named"),
    [
        (0, lambda e: e["details"].update(note="free text"), "unknown field(s) 'note'"),
        (0, lambda e: e["mu"].update({"colluders:02": 0.1}), "'colluders:02'"),
        (0, lambda e: e["mu"].update({"coalition:0": 0.1}), "'coalition:0'"),
        (0, lambda e: e["mu"].update({"outsider": -1.0}), "must be >= 0"),
        (0, lambda e: e["details"].update(payload_sha256="ABC"), "payload_sha256"),
        (0, lambda e: e["details"]["noise"].pop("delta_sampler"), "lacks 'delta_sampler'"),
        (0, lambda e: e["details"].pop("manifest_sha256"), "lacks 'manifest_sha256'"),
        (0, lambda e: e.update(kind="gift"), "kind 'gift' is unknown"),
        (3, lambda e: e["mu"].update(outsider=0.1), "a refusal entry carries no μ"),
        (4, lambda e: e["details"].update(epsilon=0.0), "finite ε > 0"),
        (4, lambda e: e["details"].update(mechanism="gaussian"), "must be 'laplace'"),
        (5, lambda e: e["mu"].update(outsider=0.1), "a secure-sum unmask carries no μ"),
        (5, lambda e: e["details"].update(secure_sum=False), "secure_sum must be true"),
        (2, lambda e: e["details"].update(dropped="site-c"), "dropped must be a list"),
    ],
)
def test_an_entry_that_does_not_fit_its_class_is_refused_naming_what_is_wrong(
    index: int, change: Any, named: str
) -> None:
    entry = _entry(index)
    change(entry)
    with pytest.raises(LedgerError, match="is malformed") as caught:
        entry_from_json(entry)
    assert named in str(caught.value)


def test_a_ledger_file_with_a_malformed_entry_does_not_open(tmp_path: Path) -> None:
    document = _document()
    document["entries"][1]["details"]["tensors"] = "xtx"
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(LedgerError, match="tensors must be a list"):
        PrivacyLedger.open(path, NODE, DELTA)


def test_a_version_1_ledger_reads_as_typed_events_keyed_by_manifest(tmp_path: Path) -> None:
    document = _document()
    document["version"] = 1
    for entry in document["entries"]:
        if entry["kind"] in ("release", "unmask"):
            entry["details"].pop("payload_sha256", None)
            entry["details"].pop("noise", None)
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    ledger = PrivacyLedger.open(path, NODE, DELTA)
    first = ledger.entries[0]
    assert isinstance(first, Release) and first.payload_sha256 == ""
    assert first.release_key == ("s-2026-01", 0, "manifest:" + "1" * 64)
    assert [e.to_json() for e in ledger.entries] == document["entries"]
    # A version-1 unmask corrects every release of its round, so colluders
    # (not raised by it) keep their totals and no cost is dropped.
    v2 = {t.label: t for t in PrivacyLedger.open(FIXTURE, NODE, DELTA).totals()}
    for total in ledger.totals():
        assert total.epsilon >= v2[total.label].epsilon * (1 - 1e-12)
    assert ledger.total("colluders:2").epsilon == pytest.approx(v2["colluders:2"].epsilon)


def test_a_release_with_an_unknown_class_is_refused_and_the_ledger_is_unchanged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger.open(path, NODE, DELTA)
    release(ledger, ("s", 0, "r"), {"outsider": 0.2}, "1" * 64, "a" * 64)
    before = path.read_bytes()
    for mu in ({"bystander": 0.1}, {"colluders:01": 0.1}, {"outsider": math.nan}):
        with pytest.raises(LedgerError, match=r"observer class|must be >= 0"):
            release(ledger, ("s", 1, "r"), mu, "2" * 64, "b" * 64)
    with pytest.raises(LedgerError, match="noise must be NoiseFacts"):
        release(
            ledger,
            ("s", 1, "r"),
            {"outsider": 0.1},
            "2" * 64,
            "b" * 64,
            noise={"mechanism": "gaussian"},
        )
    assert path.read_bytes() == before and len(ledger.entries) == 1
