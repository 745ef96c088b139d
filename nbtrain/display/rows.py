"""What a rank's row shows, and the dashboard as static HTML: one layout for both renderings.

The live dashboard (widgets.py) and its static replacement (what a saved, converted or
GitHub-rendered notebook keeps once the launch ended) take their cells from ``row_cells`` and
their column widths from ``COLUMNS``, so both look alike and a reopened notebook shows the run
as it ended. Column widths are fixed (pixels or a share of the row), never sized by their text:
nothing shifts as texts change length, and a text too long for its column ends in "…" with the
full text as its tooltip.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from html import escape

from nbtrain.display.formatting import format_metrics, format_status, format_steps, has_progress
from nbtrain.display.runstate import RankStatus, RankView

# flex of each column of a row: the bar takes what the others leave (at least BAR_MIN). The
# text columns' sizes come from the row's width only (min-width 0: never from their text); when
# the row is too narrow for them all they shrink together, so nothing leaves the row.
COLUMNS = {
    "label": "0 1 180px",  # 'rank 10 · cuda:10 · fsdp2' at 13 px; longer ends in "…"
    "bar": "1 1 0px",
    "steps": "0 1 27%",
    "metrics": "0 1 25%",
    "status": "0 1 16%",
}
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
_ONE_LINE = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;display:block;min-width:0"

# ipywidgets wraps an HTML widget's markup in a flex item (.widget-html-content) whose
# min-width stays 'auto': it grows with its text, so an ellipsis never applies and a long step
# text is drawn over the next column. Scoped to the dashboard's own class.
LIVE_CSS = (
    "<style>"
    ".nbtrain-dashboard .nbtrain-cell,"
    ".nbtrain-dashboard .nbtrain-cell .widget-html-content"
    "{min-width:0;overflow:hidden}"
    ".nbtrain-dashboard .nbtrain-cell .widget-html-content{display:block}"
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
    status: str
    status_color: str | None


def row_cells(view: RankView) -> RowCells:
    value, maximum = bar_position(view)
    return RowCells(
        label=label_html(view),
        value=value,
        maximum=maximum,
        bar_style=BAR_STYLES[view.status],
        steps=format_steps(view) if has_progress(view) else "",
        metrics=format_metrics(view.metrics) if view.metrics else "",
        status=format_status(view),
        status_color=STATUS_COLORS.get(view.status),
    )


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


def one_line_html(text: str, style: str = "") -> str:
    """A cell that never wraps (rows keep their height); the full text shows on hover."""
    if not text:
        return ""
    shown = escape(text)
    return f'<span title="{shown}" style="{_ONE_LINE}{style}">{shown}</span>'


def status_html(cells: RowCells) -> str:
    color = cells.status_color
    return one_line_html(cells.status, f";color:{color};font-weight:bold" if color else "")


def static_row(view: RankView, columns: Mapping[str, str] = COLUMNS) -> str:
    """The row as plain HTML (a CSS bar), laid out like the live row."""
    cells = row_cells(view)
    percent = 100 * cells.value / cells.maximum if cells.maximum else 0
    color = BAR_COLORS.get(cells.bar_style, BAR_COLORS[""])
    column = "min-width:0;overflow:hidden;flex:"
    parts = [
        f'<div class="nbtrain-label" style="{column}{columns["label"]}">{cells.label}</div>',
        f'<div class="nbtrain-bar" data-value="{cells.value}" data-max="{cells.maximum}" '
        f'data-style="{cells.bar_style}" style="flex:{columns["bar"]};min-width:{BAR_MIN};'
        'height:14px;background:#eee">'
        f'<div style="width:{percent:.1f}%;height:100%;background:{color}"></div></div>',
        f'<div class="nbtrain-steps" style="{column}{columns["steps"]};padding-left:6px">'
        f"{one_line_html(cells.steps)}</div>",
        f'<div class="nbtrain-metrics" style="{column}{columns["metrics"]}">'
        f"{one_line_html(cells.metrics)}</div>",
        f'<div class="nbtrain-status" style="{column}{columns["status"]}">'
        f"{status_html(cells)}</div>",
    ]
    return (
        f'<div class="nbtrain-row" data-rank="{view.rank}" data-status="{view.status.value}" '
        'style="display:flex;align-items:center;gap:4px;height:24px">'
        f"{''.join(parts)}</div>"
    )


def static_dashboard(title: str, ranks: Iterable[RankView], extras: Iterable[str]) -> str:
    """The whole dashboard as static HTML: title, a row per rank, then ``extras`` (markup of
    the charts, output and summary, as the live dashboard last showed them)."""
    views = list(ranks)
    columns = COLUMNS
    if not any(view.metrics for view in views):
        # Nothing logged: the status (a failure's reason) gets the metrics' share of the row.
        columns = {**COLUMNS, "metrics": "0 0 0px", "status": "0 1 41%"}
    rows = "".join(static_row(view, columns) for view in views)
    tail = "".join(f"<div>{part}</div>" for part in extras if part)
    return (
        '<div class="nbtrain-static" style="width:100%;font-size:13px;line-height:1.4">'
        f"<div>{title}</div>{rows}{tail}</div>"
    )
