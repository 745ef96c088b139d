"""What a rank's row shows, and the dashboard as static HTML: one layout for both renderings.

The live dashboard (widgets.py: every row in one HTML widget) and its static replacement (what a
saved, converted or GitHub-rendered notebook keeps once the launch ended) show the same markup
(``static_rows``), so both look alike and a reopened notebook shows the run as it ended. Column
widths are fixed (pixels or a share of the row), never sized by their text: nothing shifts as
texts change length, and a text too long for its column ends in "…" with the full text as its
tooltip.

The status takes the columns to its left that its row leaves empty (``RowCells.span``): a
starting rank's phase spans the steps and metrics columns it has nothing for yet, and a failed
rank's error takes the metrics column too (the error says more than the last loss, which the
chart and the tooltip keep). A span starts and ends on the columns' own edges, so every row
stays aligned with the others; cells sit edge to edge (no gap: spacing is inside a cell) so
that a span's width is exactly the sum of the columns it covers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape

from nbtrain.display.formatting import (
    MAX_METRICS,
    format_metrics,
    format_steps,
    has_progress,
    status_parts,
)
from nbtrain.display.runstate import RankStatus, RankView

# flex of each column of a row: the bar takes what the others leave (at least BAR_MIN). The
# text columns' sizes come from the row's width only (min-width 0: never from their text); when
# the row is too narrow for them all they shrink together, so nothing leaves the row. The label
# shrinks fastest (its "rank N" comes first; the device is on hover): in JupyterLab at 900 px
# the failed rank's status then still shows "failed: ValueError:".
COLUMNS = {
    "label": "0 4 180px",  # 'rank 10 · cuda:10 · fsdp2' at 13 px; longer ends in "…"
    "bar": "1 1 0px",
    "steps": "0 1 25%",
    "metrics": "0 1 25%",
    "status": "0 1 18%",  # 'stopped' whole at 900 px in JupyterLab
}
# The status column's flex when it spans 1, 2 or 3 columns (status; metrics + status; steps +
# metrics + status): the sum of the spanned columns' shares, so its edges are theirs.
STATUS_SPANS = {1: COLUMNS["status"], 2: "0 1 43%", 3: "0 1 68%"}
SPANNED = {2: ("metrics",), 3: ("steps", "metrics")}  # the columns a span hides
CELL_PADDING = "6px"  # left of each text column after the bar: the space between columns
BAR_MIN = "60px"
BAR_COLORS = {"": "#2196f3", "success": "#4caf50", "danger": "#e53935", "warning": "#fb8c00"}
BAR_STYLES = {
    RankStatus.STARTING: "",
    RankStatus.RUNNING: "",
    RankStatus.DONE: "success",
    RankStatus.FAILED: "danger",
    RankStatus.STOPPED: "warning",
}
STATUS_COLORS = {
    RankStatus.DONE: "#2e7d32",
    RankStatus.FAILED: "#c62828",
    RankStatus.STOPPED: "#ef6c00",
}
HOLDING_UP_COLOR = "#ef6c00"
_ONE_LINE = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;display:block;min-width:0"

# ipywidgets wraps an HTML widget's markup in a flex item (.widget-html-content) whose
# min-width stays 'auto': it grows with its text, so an ellipsis never applies and a long text
# is drawn over the next column. Its line height (28 px, a widget's) would also make a row's text
# taller than the row: the live rows take the static dashboard's. Scoped to the dashboard's class.
LIVE_CSS = (
    "<style>"
    ".nbtrain-dashboard .nbtrain-cell,"
    ".nbtrain-dashboard .nbtrain-cell .widget-html-content"
    "{min-width:0;overflow:hidden;box-sizing:border-box}"
    ".nbtrain-dashboard .nbtrain-cell .widget-html-content{display:block}"
    ".nbtrain-dashboard .nbtrain-row{font-size:13px;line-height:1.4}"
    "</style>"
)


@dataclass(frozen=True)
class RowCells:
    """One rank's row as text: the same for the live widgets and the static rendering."""

    label: str  # markup
    value: int
    maximum: int
    bar_style: str
    steps: str
    metrics: str
    status: str  # cut at its end when its column is too narrow
    status_tail: str  # kept whole after the status (a phase's seconds)
    status_color: str | None
    span: int  # columns the status takes: 1, 2 (and metrics') or 3 (and steps')

    metrics_title: str = ""  # every metric, whole: the metrics cell's tooltip

    @property
    def status_title(self) -> str:
        """The status whole, and the metrics its span hides (whole too: it is a tooltip)."""
        whole = self.status + self.status_tail
        hidden = (self.metrics_title or self.metrics) if self.span >= 2 else ""
        return f"{whole}\nlast logged: {hidden}" if hidden else whole


def row_cells(view: RankView) -> RowCells:
    value, maximum = bar_position(view)
    steps = format_steps(view) if has_progress(view) else ""
    metrics = compact_metrics(view.metrics) if view.metrics else ""
    status, tail = status_parts(view)
    return RowCells(
        label=label_html(view),
        value=value,
        maximum=maximum,
        bar_style="warning" if _holds_up(view) else BAR_STYLES[view.status],
        steps=steps,
        metrics=metrics,
        status=status,
        status_tail=tail,
        status_color=HOLDING_UP_COLOR if _holds_up(view) else STATUS_COLORS.get(view.status),
        span=status_span(
            steps, metrics, failed=view.status is RankStatus.FAILED,
            phase=bool(view.note) and not view.finished,
        ),
        metrics_title=format_metrics(view.metrics) if view.metrics else "",
    )


def _holds_up(view: RankView) -> bool:
    """The others wait for this running rank (a where-picture said so): orange, like a stop,
    so it stands out among the blue rows that wait for it."""
    return view.holding_up and not view.finished


METRIC_NAME_CHARS = 10  # a metric's name in a row: 'train/learning_rate' -> 'learning_…'


def compact_metrics(values: dict[str, float]) -> str:
    """The row's metrics, short enough that two or three fit its column at 1,400 px (the
    first alone filled it): a name's last '/' part, cut to METRIC_NAME_CHARS, and 3
    significant digits ('loss 0.452 · accuracy 0.881 · learning_… 0.0009'). The chart and
    the tooltip keep the rest."""
    parts = []
    for name, value in list(values.items())[:MAX_METRICS]:
        short = name.rsplit("/", 1)[-1] or name
        if len(short) > METRIC_NAME_CHARS:
            short = short[: METRIC_NAME_CHARS - 1] + "…"
        parts.append(f"{short} {value:.3g}" if math.isfinite(value) else f"{short} {value}")
    return " · ".join(parts)


def status_span(steps: str, metrics: str, *, failed: bool, phase: bool = False) -> int:
    """Columns the status takes (see the module doc): the empty ones before it, and a failed
    rank's metrics column, or a waiting rank's (a phase: 'saving checkpoint… (4s)' whole at
    900 px, where the status column alone showed 'sa… (4s)'; its loop is not moving, so the
    metrics wait in the tooltip)."""
    if metrics and not failed and not phase:
        return 1
    return 2 if steps else 3


def label_html(view: RankView) -> str:
    """'<b>rank 0</b> · cpu · fsdp2' (the device and, when not plain data parallelism, the
    strategy) on one line: a long device or rank number ends in "…" instead of wrapping onto
    the next row; the whole label is its tooltip."""
    extra = [text for text in (view.device, view.strategy) if text]
    whole = escape(" · ".join([f"rank {view.rank}", *extra]))
    device = "".join(f" · {escape(text)}" for text in extra)
    return f'<span title="{whole}" style="{_ONE_LINE}"><b>rank {view.rank}</b>{device}</span>'


def bar_position(view: RankView) -> tuple[int, int]:
    """(value, max) of the bar; a rank that reported no total fills its bar when done."""
    if view.total:
        return min(view.step, view.total), view.total
    done = view.status is RankStatus.DONE
    return (1 if done else 0), 1


def one_line_html(text: str, style: str = "", *, tail: str = "", title: str = "") -> str:
    """A cell that never wraps (rows keep their height); the full text (or ``title``) shows
    on hover. ``tail`` stays visible after ``text`` however narrow the cell: the text is an
    inline block that leaves the tail its width (in ``ch``: a digit's width; an inline block,
    not a flex item, so the cell's innerText stays one line), and ends in "…" when cut."""
    if not text and not tail:
        return ""
    shown = escape(text)
    if tail:
        shown = (
            f'<span style="display:inline-block;vertical-align:top;overflow:hidden;'
            f'text-overflow:ellipsis;max-width:calc(100% - {len(tail)}ch)">{shown}</span>'
            f'<span class="nbtrain-tail">{escape(tail)}</span>'
        )
    whole = escape(title or text + tail)
    return f'<span title="{whole}" style="{_ONE_LINE}{style}">{shown}</span>'


def metrics_html(cells: RowCells) -> str:
    return one_line_html(cells.metrics, title=cells.metrics_title)


def status_html(cells: RowCells) -> str:
    color = cells.status_color
    return one_line_html(
        cells.status,
        f";color:{color};font-weight:bold" if color else "",
        tail=cells.status_tail,
        title=cells.status_title,
    )


def static_row(view: RankView) -> str:
    """The row as plain HTML (a CSS bar), laid out like the live row."""
    cells = row_cells(view)
    percent = 100 * cells.value / cells.maximum if cells.maximum else 0
    color = BAR_COLORS.get(cells.bar_style, BAR_COLORS[""])
    hidden = SPANNED.get(cells.span, ())

    def column(name: str, flex: str, content: str) -> str:
        shown = "display:none;" if name in hidden else ""
        return (
            f'<div class="nbtrain-{name}" style="{shown}min-width:0;overflow:hidden;'
            f'box-sizing:border-box;padding-left:{CELL_PADDING};flex:{flex}">{content}</div>'
        )

    parts = [
        f'<div class="nbtrain-label" style="min-width:0;overflow:hidden;flex:{COLUMNS["label"]}">'
        f"{cells.label}</div>",
        f'<div class="nbtrain-bar" data-value="{cells.value}" data-max="{cells.maximum}" '
        f'data-style="{cells.bar_style}" style="flex:{COLUMNS["bar"]};min-width:{BAR_MIN};'
        'height:14px;margin:0 4px;background:#eee">'
        f'<div style="width:{percent:.1f}%;height:100%;background:{color}"></div></div>',
        column("steps", COLUMNS["steps"], one_line_html(cells.steps)),
        column("metrics", COLUMNS["metrics"], metrics_html(cells)),
        column("status", STATUS_SPANS[cells.span], status_html(cells)),
    ]
    return (
        f'<div class="nbtrain-row" data-rank="{view.rank}" data-status="{view.status.value}" '
        'style="display:flex;align-items:center;height:24px">'
        f"{''.join(parts)}</div>"
    )


def static_rows(ranks: Iterable[RankView]) -> str:
    """A row per rank, as the live dashboard shows them (one HTML widget) and a saved one."""
    return "".join(static_row(view) for view in ranks)


def static_dashboard(title: str, ranks: Iterable[RankView], extras: Iterable[str]) -> str:
    """The whole dashboard as static HTML: title, a row per rank, then ``extras`` (markup of
    the charts, output and summary, as the live dashboard last showed them)."""
    rows = static_rows(ranks)
    tail = "".join(f"<div>{part}</div>" for part in extras if part)
    return (
        '<div class="nbtrain-static" style="width:100%;font-size:13px;line-height:1.4">'
        f"<div>{title}</div>{rows}{tail}</div>"
    )
