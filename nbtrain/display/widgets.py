"""Widget view of a RunState: one dashboard per launch, drawn by the kernel process only.

A header (title, elapsed time, the launcher's node-level note), a row per rank (rank and device,
bar, steps/rate/ETA, latest metrics, status), a live metric chart (inline SVG), the ranks' output
(last lines, capped) and a summary line: green only when the run succeeded, red when it failed or
timed out, orange when it was interrupted or stopped. When the launch ends, whatever its outcome,
the dashboard is replaced in place (same display id) by a static HTML + text/plain rendering of
its final state and its widgets are closed: a saved, reopened, converted or GitHub-rendered
notebook shows the final rows, chart and summary, never "model not found" (no widget mimetype
is left in the saved output), and a kernel that launches hundreds of times keeps no comms for
finished runs. Each draw compares versions kept in the
RunState and touches only the widgets whose content changed; ipywidgets then sends a message only
for traits whose value actually differs. The chart and the output area are the heavy parts (each
update resends their whole markup, up to tens of kilobytes): they redraw at most every
CHART_EVERY seconds, and always at the end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any, Protocol

import ipywidgets as widgets

from nbtrain.display.chart import chart_image, rank_color
from nbtrain.display.commpump import CommPump
from nbtrain.display.formatting import format_duration, format_rank, timed_phase
from nbtrain.display.groups import is_wide
from nbtrain.display.rows import (
    BAR_MIN,
    CELL_PADDING,
    COLUMNS,
    LIVE_CSS,
    STATUS_COLORS,
    metrics_html,
    one_line_html,
    row_cells,
    static_dashboard,
    status_html,
)
from nbtrain.display.runstate import RankStatus, RankView, RunState, Verdict
from nbtrain.display.wide import text_lines as wide_text
from nbtrain.shared.options import OutputMode

MAX_LINE_CHARS = 400
MAX_CHARTS = 3  # metrics charted side by side (the first ones logged)
# Seconds between redraws of the chart and of the output area. Each redraw rebuilds and resends
# the whole markup: up to 3 charts of ~15 KB at full history, 200 output lines of ~40 KB. Twice
# a second keeps the kernel's share and the traffic to the browser small (see chart.py) while
# still looking live; rows (a few hundred bytes) follow every draw.
CHART_EVERY = 0.5
VERDICT_COLORS = {
    Verdict.SUCCEEDED: STATUS_COLORS[RankStatus.DONE],
    Verdict.FAILED: STATUS_COLORS[RankStatus.FAILED],
    Verdict.TIMED_OUT: STATUS_COLORS[RankStatus.FAILED],
    Verdict.STOPPED: STATUS_COLORS[RankStatus.STOPPED],
}


class Display(Protocol):
    """Where the dashboard goes: IPython's display machinery, or a recorder in tests."""

    def show(self, bundle: dict[str, Any]) -> None: ...

    def update(self, bundle: dict[str, Any]) -> None: ...


class IPythonDisplay:
    def __init__(self) -> None:
        self._handle: Any = None

    def show(self, bundle: dict[str, Any]) -> None:
        from IPython.display import display

        self._handle = display(bundle, raw=True, display_id=True)

    def update(self, bundle: dict[str, Any]) -> None:
        if self._handle is not None:
            self._handle.update(bundle, raw=True)


class RankRow:
    """The widgets of one rank's row (columns as in rows.COLUMNS, shared with the static row;
    the status spans the empty ones, as there)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.label = _cell("label")
        self.bar = widgets.IntProgress(
            value=0, min=0, max=1, layout=widgets.Layout(flex=COLUMNS["bar"], min_width=BAR_MIN)
        )
        self.steps = _cell("steps")
        self.metrics = _cell("metrics")
        self.status = _cell("status")
        self.box = widgets.HBox(
            [self.label, self.bar, self.steps, self.metrics, self.status],
            layout=widgets.Layout(align_items="center", width="100%"),
        )
        self.box.add_class("nbtrain-span-1")
        self.span = 1
        self.version = -1

    def widgets(self) -> list[widgets.Widget]:
        return [self.label, self.bar, self.steps, self.metrics, self.status, self.box]

    def render(self, view: RankView) -> None:
        # (a phase's duration moves with the clock: such a row is redrawn at every draw, and
        # ipywidgets sends only the cells whose text changed)
        if view.version == self.version and not timed_phase(view):
            return
        self.version = view.version
        cells = row_cells(view)
        self.label.value = cells.label
        with self.bar.hold_sync():
            self.bar.max = cells.maximum
            self.bar.value = cells.value
            self.bar.bar_style = cells.bar_style
        self.steps.value = one_line_html(cells.steps)
        self.metrics.value = metrics_html(cells)
        self.status.value = status_html(cells)
        # The status spans the columns its row leaves empty: a class of the row (rows.LIVE_CSS)
        if cells.span != self.span:
            self.box.remove_class(f"nbtrain-span-{self.span}")
            self.box.add_class(f"nbtrain-span-{cells.span}")
            self.span = cells.span


def _cell(column: str) -> widgets.HTML:
    # Edge to edge (no margin; the space between columns is padding inside them): a spanning
    # status is then exactly as wide as the columns it covers.
    padding = "0" if column == "label" else f"0 0 0 {CELL_PADDING}"
    cell = widgets.HTML(
        layout=widgets.Layout(flex=COLUMNS[column], min_width="0", margin="0", padding=padding)
    )
    cell.add_class("nbtrain-cell")
    cell.add_class(f"nbtrain-{column}")
    return cell


@dataclass
class _Note:
    text: str
    at: float  # wall-clock time it was said: ranks that started later made it stale


class WidgetView:
    def __init__(
        self,
        *,
        output: OutputMode,
        world_size: int,
        display: Display | None = None,
    ) -> None:
        self.output = output
        self.world_size = world_size
        self._display = display if display is not None else IPythonDisplay()
        self.rows: dict[int, RankRow] = {}
        self.title = widgets.HTML(layout=widgets.Layout(flex="1", min_width="0"))
        # "where?": each rank's stack, in the cell (kernel/run/where.py). Its click reaches the
        # kernel while the cell is busy through the launch's loop (commpump.py).
        self.where_button = widgets.Button(
            description="where?",
            tooltip="Where is each rank? Its stack and the collective it waits in, shown in "
            "the cell; the run goes on",
            layout=widgets.Layout(width="auto", flex="0 0 auto"),
        )
        self.where_button.add_class("nbtrain-where")
        if CommPump.for_kernel() is None:  # its click could not arrive while the cell runs
            self.where_button.layout.display = "none"
        self.where_button.on_click(self._where_clicked)
        self.header = widgets.HBox(
            [self.title, self.where_button],
            layout=widgets.Layout(align_items="center", width="100%"),
        )
        self._where_asked = False
        self.charts = widgets.HTML(layout=widgets.Layout(display="none"))
        self.summary = widgets.HTML(layout=widgets.Layout(display="none"))
        self.box: widgets.VBox | None = None
        self._drawn = -1  # RunState.version last drawn
        self._metrics_drawn = -1
        self._chart_at = -CHART_EVERY  # monotonic time of the last chart redraw
        self._note: _Note | None = None
        self._state: RunState | None = None
        self._final_text = ""
        self._closed = False
        self.wide: Any = None  # a wide run's rows and selector (widebody.WideBody)

    def draw(self, state: RunState, *, final: bool = False) -> None:
        if self._closed:
            return
        if self.box is None:
            self._build(state)
        self._state = state
        self._draw_title(state)  # the elapsed time moves even when nothing else does
        if state.version != self._drawn:
            self._drawn = state.version
            for rank, row in self.rows.items():
                row.render(state.ranks[rank])
            self._draw_summary(state)
        else:  # nothing new, but a phase's duration moved on
            for rank, row in self.rows.items():
                if timed_phase(state.ranks[rank]):
                    row.render(state.ranks[rank])
        if self.wide is not None:
            self.wide.draw(state, final=final)
        # The ranks' output is the cell's own output (kernel/run/cellout.py), not the dashboard's.
        now = time.monotonic()
        if state.metrics_version != self._metrics_drawn and (
            final or now - self._chart_at >= CHART_EVERY
        ):
            self._metrics_drawn, self._chart_at = state.metrics_version, now
            self._draw_charts(state)

    def where_buttons(self) -> set[str]:
        """The comm ids whose clicks the launch's loop handles while the cell is busy."""
        comm = getattr(self.where_button, "comm", None)
        if self._closed or self.box is None or comm is None:
            return set()
        return {comm.comm_id} | (self.wide.comm_ids() if self.wide is not None else set())

    def take_where(self) -> bool:
        """Was "where?" clicked since the last call?"""
        asked, self._where_asked = self._where_asked, False
        return asked

    def _where_clicked(self, button: widgets.Button) -> None:
        self._where_asked = True

    def note(self, text: str) -> None:
        """A node-level message in the header, until ranks start again or the run ends."""
        self._note = _Note(text, time.time()) if text else None
        if self.box is not None and self._state is not None:
            self._draw_title(self._state)

    def close(self, state: RunState) -> None:
        """The launch ended: its final state replaces the live dashboard (see the module doc)."""
        if self._closed:
            return
        self.draw(state, final=True)
        assert self.box is not None
        self._closed = True
        # Frontends without HTML (and terminals reading the saved notebook) show this text.
        self._final_text = final_text(state)
        parts = (self.charts, self.summary)
        extras = [w.value for w in parts if w.layout.display != "none"]
        if self.wide is not None:  # the same rows as live, the charts as they ended
            extras = [self.wide.html(state), self.wide.charts_html(state, final=True),
                      self.summary.value]
            self._final_text = "\n".join([*wide_text(state), state.summary])
        ranks = [state.ranks[rank] for rank in self.rows]
        html = static_dashboard(self._title_html(state), ranks, extras)
        self._display.update({"text/html": html, "text/plain": self._final_text})
        for widget in [
            self.title, self.where_button, self.header, self.charts, self.summary, self.box
        ]:
            close_widget(widget)
        for row in self.rows.values():
            for widget in row.widgets():
                close_widget(widget)
        for widget in self.wide.widgets() if self.wide is not None else []:
            close_widget(widget)
        self.box = None

    # -- building -------------------------------------------------------------------------------

    def _build(self, state: RunState) -> None:
        if is_wide(len(state.ranks)):  # groups of ranks, not a row each (widebody.py)
            from nbtrain.display.widebody import WideBody

            self.wide = WideBody(state)
            self.header.children = (*self.header.children, self.wide.selector)
        else:
            self.rows = {rank: RankRow(rank) for rank in sorted(state.ranks)}
        self.box = widgets.VBox(
            [
                self.header,
                *(row.box for row in self.rows.values()),
                *([self.wide.rows] if self.wide is not None else []),
                self.charts,
                self.summary,
            ],
            layout=widgets.Layout(width="100%"),
        )
        self.box.add_class("nbtrain-dashboard")
        self.title.add_class("nbtrain-cell")
        self._display.show(self._bundle(f"nbtrain: {len(state.ranks)} rank(s) running"))

    def _bundle(self, text: str) -> dict[str, Any]:
        assert self.box is not None
        bundle = dict(self.box._repr_mimebundle_())
        bundle["text/plain"] = text
        return bundle

    # -- parts ----------------------------------------------------------------------------------

    def _draw_title(self, state: RunState) -> None:
        self.title.value = LIVE_CSS + self._title_html(state)

    def _title_html(self, state: RunState) -> str:
        name = state.title or f"{len(state.ranks)} ranks"
        note = self._current_note(state)
        note = " · ".join(part for part in (state.resumed, note) if part)
        note_html = f' · <span class="nbtrain-note">{escape(note)}</span>' if note else ""
        elapsed = format_duration(state.elapsed)
        # A narrow notebook cuts the note ("... (interrupt again to stop at once)"): whole on
        # hover.
        return one_line_html_markup(
            f"<b>nbtrain</b> · {escape(name)} · {elapsed}{note_html}",
            tooltip=" · ".join(part for part in (f"nbtrain · {name} · {elapsed}", note) if part),
        )

    def _current_note(self, state: RunState) -> str:
        note = self._note
        if note is None:
            return ""
        started_since = any(
            view.started_at is not None and view.started_at > note.at
            for view in state.ranks.values()
        )
        if started_since or state.summary:
            self._note = None  # said before ranks (re)started, or the summary says the rest
            return ""
        return note.text

    def _draw_charts(self, state: RunState) -> None:
        if self.wide is not None:  # the mean and a min-max band across ranks
            self.charts.value = self.wide.charts_html(state)
            self.charts.layout.display = "" if self.charts.value else "none"
            return
        names = _charted_names(state)[:MAX_CHARTS]
        if not names:
            return
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
        self.charts.value = (
            f'<div style="font-size:11px">{legend}{_more_metrics(state, names)}</div>'
            f'<div style="display:flex;flex-wrap:wrap;gap:8px">{charts}</div>'
        )
        self.charts.layout.display = ""

    def _draw_summary(self, state: RunState) -> None:
        if not state.summary:
            return
        color = summary_color(state)
        # A long unbroken word (a path, a repeated character) wraps instead of overflowing.
        self.summary.value = (
            f'<div style="overflow-wrap:anywhere"><b style="color:{color}">'
            f"{escape(state.summary)}</b></div>"
        )
        self.summary.layout.display = ""


def close_widget(widget: widgets.Widget) -> None:
    # A widget's layout and style are models (comms) of their own; close() leaves them open.
    for part in (getattr(widget, "layout", None), getattr(widget, "style", None)):
        if isinstance(part, widgets.Widget):
            part.close()
    widget.close()


def summary_color(state: RunState) -> str:
    """Green only for a run that succeeded with every rank done; never guessed from the text."""
    if state.succeeded:
        return VERDICT_COLORS[Verdict.SUCCEEDED]
    if state.verdict is None or state.verdict is Verdict.SUCCEEDED:
        return VERDICT_COLORS[Verdict.STOPPED]  # "succeeded" with a rank not done: not green
    return VERDICT_COLORS[state.verdict]


def final_text(state: RunState) -> str:
    """The dashboard as plain text: one line per rank and the summary (the ranks' output is in
    the cell's own stream output)."""
    lines = [format_rank(view) for _, view in sorted(state.ranks.items())]
    if state.summary:
        lines.append(state.summary)
    return "\n".join(lines)


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


def one_line_html_markup(markup: str, tooltip: str = "") -> str:
    """Markup kept on one line (the title): it ends in "…" when the dashboard is narrow, with
    ``tooltip`` (plain text) shown whole on hover."""
    title = f' title="{escape(tooltip)}"' if tooltip else ""
    return (
        f'<div{title} style="white-space:nowrap;overflow:hidden;text-overflow:ellipsis">'
        f"{markup}</div>"
    )
