"""Widget view of a RunState: one dashboard per launch, drawn by the kernel process only.

A header (title, elapsed time, the launcher's node-level note, the "where?" button), a row per
rank (rank and device, bar, steps/rate/ETA, latest metrics, status), a live metric chart (an SVG
image) and a summary line: green only when the run succeeded, red when it failed or timed out,
orange when it was interrupted or stopped. When the launch ends, whatever its outcome, the
dashboard is replaced in place (same display id) by a static HTML + text/plain rendering of its
final state and its widgets are closed: a saved, reopened, converted or GitHub-rendered notebook
shows the final rows, chart and summary, never "model not found" (no widget mimetype is left in
the saved output), and a kernel that launches hundreds of times keeps no comms for finished runs.
(One exception: a page opened while the launch ran, a browser reload, gets none of the cell's later
output, so the dashboard keeps its box open with the final view for it: reloaded.py.)

Messages to the frontend stay a few a second whatever the number of ranks. Every rank's row is
in one HTML widget (the rows' static markup, rows.static_rows: the same as the saved form), so a
redraw of every row is one message, sent at most every ROWS_EVERY seconds and only when the
markup changed (a row per widget sent one message per changed cell of every rank: 278 a second
at 8 ranks). The title changes once a second (its elapsed time); the chart, the heavy part (its
whole markup resent, up to tens of kilobytes), redraws at most every CHART_EVERY seconds; all of
them are drawn at the end. Beyond groups.WIDE ranks the rows are groups (widebody.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import Any, Protocol

import ipywidgets as widgets

from nbtrain.display.chart import rank_charts_html
from nbtrain.display.closing import close_widget
from nbtrain.display.commpump import CommPump
from nbtrain.display.formatting import format_duration, format_rank, timed_phase
from nbtrain.display.groups import is_wide
from nbtrain.display.reloaded import ReloadedPages
from nbtrain.display.rows import LIVE_CSS, STATUS_COLORS, static_dashboard, static_rows
from nbtrain.display.runstate import RankStatus, RunState, Verdict
from nbtrain.display.wide import Throttle
from nbtrain.display.wide import text_lines as wide_text
from nbtrain.shared.options import OutputMode

# Seconds between redraws of the rows: four a second looks live, and with the title and the chart
# (once a second each) the dashboard sends at most 6 messages a second (and a few once at the
# end: the final rows, chart and summary); the ranks' lines, written to the cell at most four
# times a second (kernel/run/lifecycle.py), make it 10.
ROWS_EVERY = 0.25
# Seconds between redraws of the chart. Each redraw rebuilds and resends the whole markup: up to
# 3 charts of ~15 KB at full history. Once a second (as the band charts of a wide run) keeps the
# kernel's share and the traffic to the browser small (see chart.py) while still looking live.
CHART_EVERY = 1.0
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
        self.rows: widgets.HTML | None = None  # every rank's row (None in a wide run)
        self.title = widgets.HTML(
            layout=widgets.Layout(flex="1", min_width="0"), _dom_classes=("nbtrain-cell",)
        )
        # "where?": each rank's stack, in the cell (kernel/run/where.py). Its click reaches the
        # kernel while the cell is busy through the launch's loop (commpump.py).
        self.where_button = widgets.Button(
            description="where?",
            tooltip="Where is each rank? Its stack and the collective it waits in, shown in "
            "the cell; the run goes on",
            layout=widgets.Layout(width="auto", flex="0 0 auto"),
            _dom_classes=("nbtrain-where",),
        )
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
        self._drawn = -1  # RunState.version last drawn (the summary)
        self._rows_drawn = -1  # ... in the rows
        self._rows_due = Throttle(ROWS_EVERY)
        self._metrics_drawn = -1
        self._chart_at = -CHART_EVERY  # monotonic time of the last chart redraw
        self._note: _Note | None = None
        self._state: RunState | None = None
        self._final_text = ""
        self._closed = False
        self.wide: Any = None  # a wide run's rows and selector (widebody.WideBody)
        self.reloaded: ReloadedPages | None = None  # a page opened mid-launch (reloaded.py)

    def draw(self, state: RunState, *, now: bool = False, final: bool = False) -> None:
        if self._closed:
            return
        if self.box is None:
            self._build(state)
        self._state = state
        self._draw_title(state)  # the elapsed time moves even when nothing else does
        if state.version != self._drawn:
            self._drawn = state.version
            self._draw_summary(state)
        if self.rows is not None:
            self._draw_rows(state, now=final or now)
        if self.wide is not None:
            self.wide.draw(state, final=final or now)
        # The ranks' output is the cell's own output (kernel/run/cellout.py), not the dashboard's.
        clock = time.monotonic()
        if state.metrics_version != self._metrics_drawn and (
            final or clock - self._chart_at >= CHART_EVERY
        ):
            self._metrics_drawn, self._chart_at = state.metrics_version, clock
            self._draw_charts(state)
        if self.reloaded is not None:
            self.reloaded.draw(now=final or now)

    def follow_reloaded(self) -> Callable[[str], None] | None:
        """A page was opened while the cell runs: from now on the dashboard also shows the
        cell's newest lines, and keeps its final view for that page (reloaded.py). Returns
        where the cell's text is copied to; None once the dashboard is closed."""
        if self._closed or self.box is None:
            return None
        if self.reloaded is None:
            self.reloaded = ReloadedPages()
            self.box.children = (*self.box.children, self.reloaded.lines)
        return self.reloaded.write

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
        ranks = [state.ranks[r] for r in sorted(state.ranks)] if self.rows is not None else []
        html = static_dashboard(self._title_html(state), ranks, extras)
        self._display.update({"text/html": html, "text/plain": self._final_text})
        if self.reloaded is not None:  # the box stays, for the page opened meanwhile
            self.reloaded.keep(self.box, html)
        for widget in [self.title, self.where_button, self.header, self.charts, self.summary]:
            close_widget(widget)
        if self.reloaded is None:
            close_widget(self.box)
        if self.rows is not None:
            close_widget(self.rows)
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
            # (nbtrain-cell: LIVE_CSS keeps its markup to its width)
            self.rows = widgets.HTML(
                layout=widgets.Layout(width="100%"), _dom_classes=("nbtrain-cell", "nbtrain-rows")
            )
        self.box = widgets.VBox(
            [
                self.header,
                *([self.rows] if self.rows is not None else []),
                *([self.wide.rows] if self.wide is not None else []),
                self.charts,
                self.summary,
            ],
            layout=widgets.Layout(width="100%"),
            _dom_classes=("nbtrain-dashboard",),
        )
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

    def _draw_rows(self, state: RunState, *, now: bool) -> None:
        """Every rank's row, when one changed (or a phase's shown seconds moved on), at most
        every ROWS_EVERY seconds (unless ``now``); one message, and none when the markup is
        what the frontend has."""
        assert self.rows is not None
        views = [state.ranks[rank] for rank in sorted(state.ranks)]
        moved = state.version != self._rows_drawn or any(timed_phase(v) for v in views)
        if not moved or not self._rows_due.due(force=now):
            return
        self._rows_drawn = state.version
        markup = static_rows(views)
        if markup != self.rows.value:
            self.rows.value = markup

    def _draw_charts(self, state: RunState) -> None:
        if self.wide is not None:  # the mean and a min-max band across ranks
            self.charts.value = self.wide.charts_html(state)
        else:
            self.charts.value = rank_charts_html(state) or self.charts.value
        self.charts.layout.display = "" if self.charts.value else "none"

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


def one_line_html_markup(markup: str, tooltip: str = "") -> str:
    """Markup kept on one line (the title): it ends in "…" when the dashboard is narrow, with
    ``tooltip`` (plain text) shown whole on hover."""
    title = f' title="{escape(tooltip)}"' if tooltip else ""
    return (
        f'<div{title} style="white-space:nowrap;overflow:hidden;text-overflow:ellipsis">'
        f"{markup}</div>"
    )
