"""A wide run's metric chart: the mean across ranks, with the band from the least to the most.

One line per rank is unreadable past a handful of ranks, and redrawing 1,024 ranks' histories
would cost the kernel a tenth of a second each time. ``Bands`` folds every point as it is logged
(a RunState metric listener) into at most MAX_BINS bins of steps per metric, each holding the
count, sum, least and most of the values logged in it: a redraw reads the bins only, whatever
the number of ranks. When the steps outgrow the bins, neighbouring bins merge (the bin width
doubles), so the chart always spans the whole run.

Drawn like chart.py's charts (an SVG shown as an ``<img>``, its words in ``alt``).
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from html import escape

from nbtrain.display.chart import (
    BOTTOM,
    HEIGHT,
    LEFT,
    RIGHT,
    TOP,
    WIDTH,
    _axis,
    _axis_labels,
    _span,
)
from nbtrain.display.runstate import RunState
from nbtrain.shared.events import Log

MAX_BINS = 150
MEAN_COLOR = "#1f77b4"
BAND_COLOR = "#1f77b4"


@dataclass
class _Bin:
    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    last: int = 0  # the newest step logged in it: where the chart draws the bin

    def add(self, step: int, value: float) -> None:
        self.last = max(self.last, step)
        self.count += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def merge(self, other: _Bin) -> None:
        self.count += other.count
        self.total += other.total
        self.low = min(self.low, other.low)
        self.high = max(self.high, other.high)
        self.last = max(self.last, other.last)


@dataclass
class Series:
    width: int = 1  # steps per bin
    bins: dict[int, _Bin] = field(default_factory=dict)
    points: int = 0

    def add(self, step: int, value: float) -> None:
        if not math.isfinite(value):
            return
        self.points += 1
        self.bins.setdefault(step // self.width, _Bin()).add(step, value)
        if len(self.bins) > MAX_BINS:
            self._widen()

    def _widen(self) -> None:
        self.width *= 2
        merged: dict[int, _Bin] = {}
        for index, found in self.bins.items():
            merged.setdefault(index // 2, _Bin()).merge(found)
        self.bins = merged

    def rows(self) -> list[tuple[float, float, float, float]]:
        """(step, mean, least, most) per bin, in step order (a bin's step: its newest)."""
        return [(b.last, b.total / b.count, b.low, b.high) for _, b in sorted(self.bins.items())]


class Bands:
    """Every metric's bins, fed from the RunState as Log events are applied."""

    def __init__(self, state: RunState) -> None:
        self.series: dict[str, Series] = {}
        self.version = 0
        for view in state.ranks.values():  # what was logged before this view was made
            for name, history in view.history.items():
                for step, value in history:
                    self._add(name, step, value)
        state.add_metric_listener(self.take)

    def take(self, event: Log) -> None:
        step = event.step if event.step is not None else 0
        for at, values in (*event.earlier, (step, event.values)):
            for name, value in values.items():
                self._add(name, at, value)
        self.version += 1

    def _add(self, name: str, step: int, value: float) -> None:
        series = self.series.get(name)
        if series is None:
            series = self.series[name] = Series()
        series.add(step, value)

    def drawable(self) -> list[str]:
        """Metrics with at least two bins: a line to draw."""
        return [name for name, series in self.series.items() if len(series.bins) >= 2]


def band_svg(name: str, series: Series, ranks: int) -> str:
    rows = series.rows()
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" class="nbtrain-chart" data-metric="{escape(name)}" '
        'style="font: 10px sans-serif; background: transparent; width: 100%; height: auto">'
    )
    parts = [head, f'<text x="{LEFT}" y="11" font-weight="bold">{escape(name)}</text>']
    if not rows:
        return "".join([*parts, "</svg>"])
    x0, x1 = _span(rows[0][0], rows[-1][0])
    y0, y1 = _span(min(r[2] for r in rows), max(r[3] for r in rows))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def point(x: float, y: float) -> str:
        return (f"{LEFT + (x - x0) / (x1 - x0) * plot_w:.1f},"
                f"{TOP + (1 - (y - y0) / (y1 - y0)) * plot_h:.1f}")

    band = [point(x, high) for x, _, _, high in rows] + [
        point(x, low) for x, _, low, _ in reversed(rows)
    ]
    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#bbb" stroke-width="0.5"/>'
    )
    parts += _axis_labels(x0, x1, y0, y1)
    parts.append(f'<polygon class="nbtrain-band" points="{" ".join(band)}" '
                 f'fill="{BAND_COLOR}" fill-opacity="0.18" stroke="none"/>')
    mean = " ".join(point(x, m) for x, m, _, _ in rows)
    parts.append(f'<polyline class="nbtrain-mean" points="{mean}" fill="none" '
                 f'stroke="{MEAN_COLOR}" stroke-width="1.5"/>')
    parts.append("</svg>")
    return "".join(parts)


def band_image(name: str, series: Series, ranks: int) -> str:
    encoded = base64.b64encode(band_svg(name, series, ranks).encode()).decode("ascii")
    return (
        f'<img class="nbtrain-chart nbtrain-band-chart" src="data:image/svg+xml;base64,'
        f'{encoded}" width="{WIDTH}" height="{HEIGHT}" '
        f'alt="{escape(band_alt(name, series, ranks))}" title="{escape(name)}" '
        'style="max-width:100%;height:auto">'
    )


def band_alt(name: str, series: Series, ranks: int) -> str:
    """'loss across 64 ranks: at step 199 mean 0.005, least 0.005, most 0.006'."""
    rows = series.rows()
    if not rows:
        return f"{name}: no points"
    step, mean, low, high = rows[-1]
    return (f"{name} across {ranks} ranks: at step {step:g} mean {_axis(mean)}, "
            f"least {_axis(low)}, most {_axis(high)}")


def legend(ranks: int) -> str:
    return (
        f'<span style="color:{MEAN_COLOR}">━</span> mean of {ranks} ranks '
        f'<span style="color:{BAND_COLOR};opacity:0.35">■</span> least to most'
    )
