"""The HTML review's plots: labelled axes with values, everything inside its frame."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from node.review.html_report import _ticks
from tests.support.bundles import make_bundle, review
from zerosum.cli import main

_NUMBER = r"-?[0-9.]+(?:e[+-]?[0-9]+)?"


def _svgs(page: str) -> list[str]:
    return re.findall(r"<svg .*?</svg>", page, flags=re.S)


@pytest.fixture
def page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    folder = make_bundle(tmp_path)
    target = tmp_path / "review.html"
    assert main(review(folder, "--html", str(target))) == 0
    capsys.readouterr()
    return target.read_text()


def test_every_plot_has_labelled_axes_with_values_on_both(page: str) -> None:
    svgs = _svgs(page)
    assert svgs
    for svg in svgs:
        assert ">local value</text>" in svg and ">released value</text>" in svg
        x_values = re.findall(rf"text-anchor='middle'>({_NUMBER})</text>", svg)
        y_values = re.findall(rf"text-anchor='end'>({_NUMBER})</text>", svg)
        assert len(x_values) >= 3 and x_values == y_values  # one scale on both axes
        assert [float(v) for v in x_values] == sorted(float(v) for v in x_values)


def test_every_point_the_band_and_the_line_stay_inside_the_frame(page: str) -> None:
    for svg in _svgs(page):
        frame = re.search(
            rf"<clipPath id='[^']+'><rect x='({_NUMBER})' y='({_NUMBER})' "
            rf"width='({_NUMBER})' height='({_NUMBER})'/>",
            svg,
        )
        assert frame is not None
        x0, y0, w, h = map(float, frame.groups())
        clipped = svg[svg.index("<g clip-path=") :]
        assert "clip-path='url(#" in svg
        for cx, cy in re.findall(rf"<circle cx='({_NUMBER})' cy='({_NUMBER})'", clipped):
            # Inside by more than the dot's radius: the range is padded.
            assert x0 + 1.8 <= float(cx) <= x0 + w - 1.8
            assert y0 + 1.8 <= float(cy) <= y0 + h - 1.8


def test_the_all_values_block_wraps_instead_of_running_off_the_page(page: str) -> None:
    assert "white-space: pre-wrap" in page and "overflow-x: auto" not in page


@pytest.mark.parametrize(
    ("lo", "hi"), [(-1.0, 1.0), (361.2, 487.9), (-1.3e4, 2e3), (0.1, 0.11), (2.0, 2.9), (0.0, 99.9)]
)
def test_ticks_are_three_to_eight_round_values_within_the_range(lo: float, hi: float) -> None:
    ticks = _ticks(lo, hi)
    assert 3 <= len(ticks) <= 8
    assert all(lo <= t <= hi for t in ticks)
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** (len(str(int(step))) - 1) if step >= 1 else None
    assert mantissa is None or round(mantissa, 9) in (1.0, 2.0, 5.0)
