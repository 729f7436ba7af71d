"""The review as one self-contained HTML page: verdict and checks first, then the figures.

No scripts and no external resources (a TRE's review machine is offline): the
styles are inline and the plots are inline SVG. With an audit record, each
tensor gets a scatter of the released value against the TRE's local
(un-noised) value, in the units the bundle sends, with the line y = x and a
band of ±2σ of the declared noise around it: a checker sees at a glance that
the points scatter about the line by about the declared amount — all on the
line would mean nothing was added.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from node.review.report import Review
from noise.fixed_point import FixedPointCodec

__all__ = ["review_html"]

_LEVEL_TEXT = {"pass": "ok", "note": "note", "look": "LOOK", "fail": "FAIL"}
# Points drawn per plot at most (evenly spaced entries of larger tensors).
_MAX_POINTS = 400
_SIZE = 270  # each plot's width and height, px
_PAD_LEFT, _PAD_RIGHT, _PAD_TOP = 52, 10, 10  # room for the y tick values; the x ticks below

_STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 72em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.verdict { font-size: 1.2em; padding: 0.5em 0.8em; display: inline-block; border-radius: 4px; }
.v0 { background: #e3f4e3; } .v1 { background: #fff2d6; } .v2 { background: #fbe0e0; }
table { border-collapse: collapse; } td, th { padding: 0.25em 0.7em; text-align: left;
  vertical-align: top; border-bottom: 1px solid #ddd; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td.level { color: #b00; font-weight: bold; } tr.look td.level { color: #a60;
  font-weight: bold; } tr.pass td.level { color: #070; }
pre { background: #f6f6f6; padding: 1em; font-size: 0.85em; white-space: pre-wrap;
  overflow-wrap: anywhere; }
.plots { display: flex; flex-wrap: wrap; gap: 1.2em; }
figure { margin: 0; } figcaption { font-size: 0.8em; max-width: 270px; color: #444; }
svg text { fill: #333; }
"""


def _fmt(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.4g}"


def _checks(review: Review) -> str:
    rows = "\n".join(
        f"<tr class='{f.level}'><td class='level'>{_LEVEL_TEXT[f.level]}</td>"
        f"<td>{html.escape(f.check)}</td><td>{html.escape(f.message)}</td></tr>"
        for f in review.findings
    )
    return f"<table><tr><th></th><th>check</th><th>finding</th></tr>\n{rows}\n</table>"


def _tensor_table(review: Review) -> str:
    bundle = review.bundle
    if bundle is None:
        return ""
    meaning = {view.name: view.meaning for view in review.views}
    rows = "\n".join(
        f"<tr><td>{html.escape(t.name)}</td><td>{'×'.join(map(str, t.shape)) or 'scalar'}</td>"
        f"<td class='num'>{_fmt(t.sigma)}</td><td class='num'>{_fmt(t.sensitivity)}</td>"
        f"<td>{html.escape(meaning.get(t.name, ''))}</td></tr>"
        for t in bundle.tensors
    )
    return (
        "<table><tr><th>tensor</th><th>shape</th><th>noise σ</th><th>sensitivity</th>"
        f"<th>what it is</th></tr>\n{rows}\n</table>"
    )


def _receipt(review: Review) -> str:
    bundle = review.bundle
    if bundle is None:
        return ""
    rows = []
    totals = {t.label: t for t in bundle.dp.cumulative}
    for r in bundle.dp.release:
        label = r.label
        total = totals.get(label)
        rows.append(
            f"<tr><td>{html.escape(label)}</td><td class='num'>{_fmt(r.mu)}</td>"
            f"<td class='num'>{_fmt(r.epsilon)}</td>"
            f"<td class='num'>{_fmt(total.epsilon) if total else '—'}</td></tr>"
        )
    return (
        f"<p>{html.escape(bundle.dp.mechanism)}, δ = {bundle.dp.delta:g}; "
        f"δ_sampler = {bundle.dp.delta_sampler:g}, "
        f"δ_discretisation = {bundle.dp.delta_discretisation:.2g}</p>"
        "<table><tr><th>observer</th><th>μ (this release)</th><th>ε (this release)</th>"
        "<th>ε with the ledger</th></tr>\n" + "\n".join(rows) + "\n</table>"
    )


def _noise_table(review: Review) -> str:
    if not review.noise:
        return ""
    rows = "\n".join(
        f"<tr><td>{html.escape(t.name)}</td><td class='num'>{t.entries}</td>"
        f"<td class='num'>{_fmt(t.empirical_std)}</td><td class='num'>{_fmt(t.declared_sigma)}"
        f"</td><td class='num'>{t.ratio:.3f}</td></tr>"
        for t in review.noise
    )
    return (
        "<table><tr><th>tensor</th><th>entries</th><th>found std</th><th>declared σ</th>"
        f"<th>ratio</th></tr>\n{rows}\n</table>"
    )


def _ticks(lo: float, hi: float) -> list[float]:
    """At least three round values in [lo, hi]: the largest step of 1, 2 or 5 × 10^k that fits.

    Steps fall by at most a factor 2.5, so the count stays at eight or fewer.
    """
    power = 10.0 ** math.floor(math.log10(hi - lo))
    values: list[float] = []
    for step in (m * power for m in (5.0, 2.0, 1.0, 0.5, 0.2, 0.1)):
        first = math.ceil(lo / step) * step
        values = [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]
        if len(values) >= 3:
            break
    return values


def _tick_label(value: float) -> str:
    return f"{value:.4g}" if abs(value) > 1e-12 else "0"


def _scatter(
    name: str, local: NDArray[np.float64], released: NDArray[np.float64], sigma: float
) -> str:
    """One SVG scatter of released against local values with y = x and a ±2σ band.

    Both axes share one scale (so y = x is the diagonal) with round tick
    values; everything drawn is clipped to the frame, and the range is
    padded so that no point sits on the frame's edge.
    """
    shown = local.size
    if local.size > _MAX_POINTS:
        keep = np.linspace(0, local.size - 1, _MAX_POINTS).astype(int)
        local, released = local[keep], released[keep]
    values = np.concatenate([local, released, local - 2 * sigma, local + 2 * sigma])
    lo, hi = float(values.min()), float(values.max())
    if not hi > lo:
        lo, hi = lo - 1.0, hi + 1.0
    margin = 0.04 * (hi - lo)
    lo, hi = lo - margin, hi + margin
    left, top = _PAD_LEFT, _PAD_TOP
    span = _SIZE - _PAD_LEFT - _PAD_RIGHT
    bottom = top + span

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * span

    def y(v: float) -> float:
        return bottom - (v - lo) / (hi - lo) * span

    band = (
        f"{x(lo):.1f},{y(lo + 2 * sigma):.1f} {x(hi - 2 * sigma):.1f},{y(hi):.1f} "
        f"{x(hi):.1f},{y(hi):.1f} {x(hi):.1f},{y(hi - 2 * sigma):.1f} "
        f"{x(lo + 2 * sigma):.1f},{y(lo):.1f} {x(lo):.1f},{y(lo):.1f}"
    )
    dots = "".join(
        f"<circle cx='{x(a):.1f}' cy='{y(b):.1f}' r='1.8'/>"
        for a, b in zip(local.tolist(), released.tolist(), strict=True)
    )
    marks = []
    for value in _ticks(lo, hi):
        label = html.escape(_tick_label(value))
        marks.append(
            f"<line x1='{x(value):.1f}' y1='{bottom}' x2='{x(value):.1f}' y2='{bottom + 4}' "
            "stroke='#666'/>"
            f"<text x='{x(value):.1f}' y='{bottom + 14}' text-anchor='middle'>{label}</text>"
            f"<line x1='{left - 4}' y1='{y(value):.1f}' x2='{left}' y2='{y(value):.1f}' "
            "stroke='#666'/>"
            f"<text x='{left - 6}' y='{y(value) + 3:.1f}' text-anchor='end'>{label}</text>"
        )
    middle = left + span / 2
    axes = (
        "".join(marks)
        + f"<text x='{middle:.1f}' y='{bottom + 30}' text-anchor='middle'>local value</text>"
        + f"<text x='12' y='{top + span / 2:.1f}' text-anchor='middle' "
        f"transform='rotate(-90 12 {top + span / 2:.1f})'>released value</text>"
    )
    clip = f"clip-{html.escape(name)}"
    return (
        f"<figure><svg xmlns='http://www.w3.org/2000/svg' width='{_SIZE}' height='{_SIZE}' "
        f"viewBox='0 0 {_SIZE} {_SIZE}' font-size='10' font-family='sans-serif' "
        f"role='img' aria-label='{html.escape(name)}: released against local values'>"
        f"<defs><clipPath id='{clip}'><rect x='{left}' y='{top}' width='{span}' "
        f"height='{span}'/></clipPath></defs>"
        f"<g clip-path='url(#{clip})'>"
        f"<polygon points='{band}' fill='#cfe3ff' opacity='0.6'/>"
        f"<line x1='{x(lo):.1f}' y1='{y(lo):.1f}' x2='{x(hi):.1f}' y2='{y(hi):.1f}' "
        "stroke='#36c'/>"
        f"<g fill='#c33'>{dots}</g></g>"
        f"<rect x='{left}' y='{top}' width='{span}' height='{span}' fill='none' stroke='#999'/>"
        f"{axes}</svg>"
        f"<figcaption><b>{html.escape(name)}</b>: released vs local, band ±2σ "
        f"(σ = {_fmt(sigma)}) about the line y = x; {local.size} of {shown} entries, "
        "in the units sent (sums of values pre-scaled to [-1, 1])</figcaption></figure>"
    )


def _plots(review: Review) -> str:
    bundle, record = review.bundle, review.record
    if bundle is None or record is None or record.payload.size != bundle.payload.size:
        return ""
    codec = FixedPointCodec(bundle.fixed_point_bits)
    released = codec.decode(bundle.payload)
    local = codec.decode(record.payload)
    figures = [
        _scatter(
            t.name,
            local[t.offset : t.offset + t.size],
            released[t.offset : t.offset + t.size],
            t.sigma,
        )
        for t in bundle.tensors
        if t.size
    ]
    return "<div class='plots'>" + "".join(figures) + "</div>"


def _section(title: str, body: str) -> str:
    return f"<h2>{html.escape(title)}</h2>\n{body}\n" if body else ""


def review_html(review: Review, text_sections: Sequence[str]) -> str:
    """The page: verdict, checks, facts, receipt, noise test and plots, then every value.

    ``text_sections`` are the terminal report's lines (header, every value in
    real units), kept verbatim in a preformatted block at the end.
    """
    title = f"zerosum review: {review.folder}"
    plots = _plots(review)
    plot_note = (
        ""
        if plots or review.record is None
        else "<p>The audit record's layout is not the bundle's; no plot.</p>"
    )
    without_audit = (
        "<p>No audit record given (<code>--audit</code>): no noise test and no plots.</p>"
        if review.record is None
        else ""
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f"<p class='verdict v{review.exit_code}'>Verdict: <b>{html.escape(review.verdict)}</b> "
        f"(exit {review.exit_code})</p>\n"
        + _section("Checks", _checks(review))
        + _section("Tensors", _tensor_table(review))
        + _section("DP receipt", _receipt(review))
        + _section("Noise against the audit record", _noise_table(review) or without_audit)
        + _section("Released against local values", plots or plot_note)
        + _section(
            "Every value, as sent and in real units",
            "<pre>" + html.escape("\n".join(text_sections)) + "</pre>",
        )
        + "</body></html>\n"
    )
