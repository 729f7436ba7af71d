"""Round names parsed once into a kind and a model round (proto/rounds.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proto.rounds import CAPE_SUM_PREFIX, RoundKind, RoundRef

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "kind", "model_round"),
    [
        ("sums", RoundKind.MODEL, "sums"),
        ("cape-sum/sums", RoundKind.CAPE_SUM, "sums"),
        ("cape-sum/scatter", RoundKind.CAPE_SUM, "scatter"),
        ("cape-summary", RoundKind.MODEL, "cape-summary"),  # the prefix is the whole "cape-sum/"
    ],
)
def test_parse_and_name_round_trip(name: str, kind: RoundKind, model_round: str) -> None:
    ref = RoundRef.parse(name)
    assert (ref.kind, ref.model_round) == (kind, model_round)
    assert ref.is_cape_sum is (kind is RoundKind.CAPE_SUM)
    assert ref.name == name == str(ref)


def test_the_cape_sum_of_a_model_round() -> None:
    ref = RoundRef.cape_sum("sums")
    assert ref == RoundRef.parse("cape-sum/sums")
    assert ref.name == CAPE_SUM_PREFIX + "sums"
    assert RoundRef.parse(ref.model_round) == RoundRef(RoundKind.MODEL, "sums")


def test_no_product_module_handles_the_prefix_itself() -> None:
    """Only proto/rounds.py knows how a CAPE sum's name is made; everyone else asks RoundRef."""
    offenders = []
    for package in ("noise", "proto", "node", "coordinator", "simulations", "zerosum"):
        for path in (REPO / package).rglob("*.py"):
            if path == REPO / "proto" / "rounds.py" or "_pb2" in path.name:
                continue
            text = path.read_text(encoding="utf-8")
            if re.search(r"CAPE_SUM_PREFIX|[\"']cape-sum/[\"']", text):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
