"""A metric chart: an SVG with one polyline per rank, shown as an image, redrawn live about once
a second.

The SVG is shown as ``<img src="data:image/svg+xml;base64,...">``, never inline: a notebook that
is not trusted (every freshly cloned one) has its HTML outputs sanitised by JupyterLab, which
removes ``<svg>`` elements but keeps ``<img>`` with its ``src`` (only href/cite are checked for
their scheme), so the chart survives a reopen, as it does nbconvert and nbviewer. An image
cannot run anything, and the ``alt`` text says what the chart shows where no image is drawn.

Pure string building (no plotting library): a few hundred points per line at most, so one chart
is a few kilobytes of markup. Measured at the point budget (2000 points per rank thinned): 0.9 ms
and 7 KB for 2 ranks, 1.7 ms and 15 KB for 8. The dashboard shows up to three charts and every
redraw resends their whole markup, so redrawing at the 10 updates a second the ranks send would
cost the kernel ~5% of a core and the browser ~450 KB/s; widgets.CHART_EVERY (1 s) keeps that
to ~0.5% and ~45 KB/s while the curves still move visibly, and the final chart is always drawn.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from html import escape

from nbtrain.display.runstate import RunState

COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)
MAX_POINTS = 300  # per line: more would not show at this size anyway
MAX_CHARTS = 3  # metrics charted side by side (the first ones logged)
POINT_BUDGET = 1200  # per chart, so many ranks still make a few kilobytes of markup
WIDTH, HEIGHT = 300, 130
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 18, 20  # margins inside the SVG for the axis labels

Series = Sequence[tuple[int, float]]


def rank_color(rank: int) -> str:
    return COLORS[rank % len(COLORS)]


def svg_chart(name: str, lines: Mapping[int, Series]) -> str:
    """An SVG of ``name`` over steps, one line per rank (``lines``: rank -> [(step, value)])."""
    limit = max(30, min(MAX_POINTS, POINT_BUDGET // max(1, len(lines))))
    points = {rank: _finite(_thin(series, limit)) for rank, series in lines.items()}
    points = {rank: series for rank, series in points.items() if series}
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" class="nbtrain-chart" data-metric="{escape(name)}" '
        'style="font: 10px sans-serif; background: transparent; width: 100%; height: auto">'
    )
    parts = [head, f'<text x="{LEFT}" y="11" font-weight="bold">{escape(name)}</text>']
    if not points:
        return "".join([*parts, "</svg>"])
    xs = [step for series in points.values() for step, _ in series]
    ys = [value for series in points.values() for _, value in series]
    x0, x1 = _span(min(xs), max(xs))
    y0, y1 = _span(min(ys), max(ys))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#bbb" stroke-width="0.5"/>'
    )
    parts += _axis_labels(x0, x1, y0, y1)
    for rank, series in sorted(points.items()):
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in series)
        parts.append(
            f'<polyline data-rank="{rank}" points="{coords}" fill="none" '
            f'stroke="{rank_color(rank)}" stroke-width="1.5"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def chart_image(name: str, lines: Mapping[int, Series]) -> str:
    """``svg_chart`` as an ``<img>`` (see the module doc) at its own size, never scaled: the
    axis text keeps its size however narrow the notebook, and charts wrap instead."""
    encoded = base64.b64encode(svg_chart(name, lines).encode()).decode("ascii")
    return (
        f'<img class="nbtrain-chart" src="data:image/svg+xml;base64,{encoded}" '
        f'width="{WIDTH}" height="{HEIGHT}" alt="{escape(chart_alt(name, lines))}" '
        f'title="{escape(name)}" style="max-width:100%;height:auto">'
    )


def chart_alt(name: str, lines: Mapping[int, Series]) -> str:
    """The chart in words: 'loss: rank 0 8 points, last 0.474 at step 383; rank 1 ...'."""
    parts = []
    for rank, series in sorted(lines.items()):
        points = _finite(series)
        if points:
            step, value = points[-1]
            parts.append(f"rank {rank} {len(points)} points, last {_axis(value)} at step {step}")
    return f"{name}: " + ("; ".join(parts) or "no points")


def _axis_labels(x0: float, x1: float, y0: float, y1: float) -> list[str]:
    bottom = HEIGHT - BOTTOM
    return [
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{_axis(y1)}</text>',
        f'<text x="{LEFT - 4}" y="{bottom}" text-anchor="end">{_axis(y0)}</text>',
        f'<text x="{LEFT}" y="{HEIGHT - 6}">{x0:g}</text>',
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 6}" text-anchor="end">step {x1:g}</text>',
    ]


def _axis(value: float) -> str:
    return f"{value:.3g}"


def _thin(series: Series, limit: int) -> Series:
    if len(series) <= limit:
        return series
    stride = math.ceil(len(series) / limit)
    thinned = list(series[::stride])
    if thinned[-1] != series[-1]:
        thinned.append(series[-1])  # the newest point always shows
    return thinned


def _finite(series: Series) -> list[tuple[int, float]]:
    return [(x, y) for x, y in series if math.isfinite(y)]


def _span(low: float, high: float) -> tuple[float, float]:
    if high > low:
        return low, high
    pad = abs(low) * 0.1 or 1.0  # a flat line sits in the middle of the box
    return low - pad, high + pad


def rank_charts_html(state: RunState) -> str:
    """A chart of each of the first MAX_CHARTS metrics, a line per rank, under a legend of the
    ranks' colours ('' before any metric has two points)."""
    names = _charted_names(state)[:MAX_CHARTS]
    if not names:
        return ""
    legend = " ".join(  # an entry never breaks between its square and its number
        f'<span style="white-space:nowrap"><span style="color:{rank_color(rank)}">■</span> '
        f"rank {rank}</span>"
        for rank in sorted(state.ranks)
    )
    # Each chart keeps its size (readable text, all alike); they wrap when the width is short.
    charts = "".join(
        chart_image(name, {r: v.history.get(name, []) for r, v in state.ranks.items()})
        for name in names
    )
    return (
        f'<div style="font-size:11px">{legend}{_more_metrics(state, names)}</div>'
        f'<div style="display:flex;flex-wrap:wrap;gap:8px">{charts}</div>'
    )


def _more_metrics(state: RunState, charted: list[str]) -> str:
    """' · also logged, not charted: lr, grad_norm': more metrics than MAX_CHARTS exist."""
    names = {name: None for view in state.ranks.values() for name in view.history}
    rest = [name for name in names if name not in charted]
    if not rest:
        return ""
    return f" · also logged, not charted: {escape(', '.join(rest))}"


def _charted_names(state: RunState) -> list[str]:
    """Metrics with a line to draw: two points on some rank. A metric logged once (or not yet
    twice) is shown by its value in the rows, not as an empty box with made-up axes."""
    names: dict[str, None] = {}
    for _, view in sorted(state.ranks.items()):
        names.update(
            (name, None) for name, series in view.history.items() if _drawable(series)
        )
    return list(names)


def _drawable(series: Sequence[tuple[int, float]]) -> bool:
    return sum(1 for _, value in series if math.isfinite(value)) >= 2
