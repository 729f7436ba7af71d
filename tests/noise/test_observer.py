"""One Observer type names every observer class; labels parse in one canonical form."""

from __future__ import annotations

import math
import re

import pytest

from node.egress.receipt import LayoutError, ObserverRelease
from noise.accounting import Observer, privacy_report
from noise.designs import complete_design
from noise.errors import ObserverError

CLASSES = [
    (Observer("outsider"), "outsider", "an outsider"),
    (Observer("colluders", 1), "colluders:1", "an outsider with 1 colluding node"),
    (Observer("colluders", 3), "colluders:3", "an outsider with 3 colluding nodes"),
    (Observer("coordinator"), "coordinator", "the coordinator"),
    (Observer("coalition", 2), "coalition:2", "the coordinator with 2 colluding nodes"),
]


@pytest.mark.parametrize(("observer", "label", "words"), CLASSES)
def test_a_class_writes_its_label_and_parses_back(
    observer: Observer, label: str, words: str
) -> None:
    assert observer.label == label
    assert Observer.parse(label) == observer
    assert observer.describe() == words
    assert observer.sees_every_egress == (observer.kind in ("coordinator", "coalition"))


def test_classes_order_outsider_colluders_coordinator_coalitions() -> None:
    shuffled = [CLASSES[i][0] for i in (4, 2, 0, 3, 1)]
    assert sorted(shuffled, key=lambda o: o.order) == [c[0] for c in CLASSES]


@pytest.mark.parametrize(
    "label",
    [
        "",
        "crowd",
        "outsider:1",
        "coordinator:0",
        "coalition",
        "coalition:0",
        "colluders:02",
        "colluders:-1",
        "colluders:²",
        "colluders:1 ",
        " outsider",
    ],
)
def test_a_label_outside_the_four_classes_is_refused(label: str) -> None:
    with pytest.raises(ObserverError, match=re.escape(repr(label))):
        Observer.parse(label)


@pytest.mark.parametrize(
    ("kind", "size", "reason"),
    [
        ("crowd", 0, "is not one of"),
        ("outsider", 1, "has no colluding nodes"),
        ("coalition", 0, "needs at least 1 colluding node"),
        ("colluders", True, "whole number"),
    ],
)
def test_a_class_that_cannot_exist_is_not_built(kind: str, size: int, reason: str) -> None:
    with pytest.raises(ObserverError, match=reason):
        Observer.named(kind, size)


def test_receipt_rows_and_privacy_report_rows_name_their_class_with_the_same_type() -> None:
    row = ObserverRelease.of(Observer("coalition", 1), math.inf, math.inf, 1e-6)
    assert (row.observer, row.coalition_size, row.label) == ("coalition", 1, "coalition:1")
    assert row.observer_class == Observer("coalition", 1)
    with pytest.raises(ObserverError):
        ObserverRelease("coalition", 0, 1.0, 1.0, 1e-6)
    bad = {"observer": "everyone", "coalition_size": 0, "mu": 1.0, "epsilon": 1.0, "delta": 1e-6}
    with pytest.raises(LayoutError, match="everyone"):
        ObserverRelease.from_json(bad)
    report = privacy_report(
        complete_design(["a", "b", "c"], 1.0),
        residual_variance=0.1,
        sensitivity=1.0,
        delta=1e-6,
        coalition_sizes=[1],
    )
    assert [r.observer_class.label for r in report[:3]] == [
        "outsider",
        "coordinator",
        "coalition:1",
    ]
