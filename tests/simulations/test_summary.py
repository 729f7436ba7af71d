"""Intervals and the headline checks, on hand-made tables."""

from __future__ import annotations

import math

import pytest

from simulations.summary import Tables, estimate, must_show


def _rows(independent_offset: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for rep in range(6):
        base = 5.0 + 0.3 * (rep % 3)
        for scheme, construction, mae in (
            ("none", "-", base),
            ("zerosum", "pairwise", base),
            ("independent", "-", base + independent_offset + 0.05 * rep),
        ):
            rows.append(
                {
                    "scheme": scheme,
                    "construction": construction,
                    "cell": "c1",
                    "rep": rep,
                    "n_nodes": 5,
                    "epsilon": 1.0,
                    "mae_years": mae,
                }
            )
    return rows


def _check(rows: list[dict[str, object]], claim: str) -> bool:
    tables = Tables(utility=rows, attack=[], reconstruction=[], overtheair=[])
    return next(c.passed for c in must_show(tables) if c.claim.startswith(claim))


def test_paired_comparison_decides_clearly_worse() -> None:
    assert _check(_rows(2.0), "independent MAE clearly worse")
    assert not _check(_rows(0.0), "independent MAE clearly worse")
    assert _check(_rows(2.0), "zerosum MAE within 2%")


def test_estimate_is_a_t_interval_over_finite_values() -> None:
    e = estimate([1.0, 2.0, 3.0, math.nan])
    assert e.mean == 2.0 and e.n == 3 and e.missing == 1
    assert e.half_width == pytest.approx(4.302652729911275 * 1.0 / math.sqrt(3))
    assert estimate([math.inf, math.inf]).text() == "∞"
    assert estimate([]).text() == "—"
