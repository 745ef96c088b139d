"""Widget view of a RunState: one dashboard per launch, drawn by the kernel process only.

A header (title, elapsed time, the launcher's node-level note), a row per rank (rank and device,
bar, steps/rate/ETA, latest metrics, status), a live metric chart (inline SVG), the ranks' output
(last lines, capped) and a summary line: green only when the run succeeded, red when it failed or
timed out, orange when it was interrupted or stopped. Each draw compares versions kept in the
RunState and touches only the widgets whose content changed; ipywidgets then sends a message only
for traits whose value actually differs. The chart and the output area are the heavy parts (each
update resends their whole markup, up to tens of kilobytes): they redraw at most every
CHART_EVERY / OUTPUT_EVERY seconds, and always at the end.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from typing import Any, Protocol

import ipywidgets as widgets

from ..config import OutputMode
from ..monitor import OutputLine, RankStatus, RankView, RunState, Verdict
from .chart import rank_color, svg_chart
from .formatting import format_duration, format_metrics, format_status, format_steps
from .text import format_rank

MAX_OUTPUT_LINES = 200  # lines the browser holds; the kernel keeps more (monitor.OUTPUT_CAP)
MAX_LINE_CHARS = 400
TEXT_TAIL_LINES = 12  # output lines kept in the plain-text version (saved notebooks stay small)
TEXT_TAIL_CHARS = 200
MAX_CHARTS = 3  # metrics charted side by side (the first ones logged)
# Seconds between redraws of the chart and of the output area. Each redraw rebuilds and resends
# the whole markup: up to 3 charts of ~15 KB at full history, 200 output lines of ~40 KB. Twice
# a second keeps the kernel's share and the traffic to the browser small (see chart.py) while
# still looking live; rows (a few hundred bytes) follow every draw.
CHART_EVERY = 0.5
OUTPUT_EVERY = 0.5
LIVE_DASHBOARDS = 8  # finished dashboards kept as live widgets; older ones become static HTML

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


# Finished dashboards still holding widgets, oldest first. Every widget is a comm in the kernel
# and a model in the browser: a kernel that launches hundreds of times must not keep them all.
_finished: deque[WidgetView] = deque()


def _retire_old_dashboards() -> None:
    while len(_finished) > LIVE_DASHBOARDS:
        _finished.popleft().freeze()


class RankRow:
    """The widgets of one rank's row."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.label = widgets.HTML(layout=widgets.Layout(width="120px"))
        self.bar = widgets.IntProgress(
            value=0, min=0, max=1, layout=widgets.Layout(flex="1 1 auto", min_width="120px")
        )
        self.steps = widgets.HTML(layout=widgets.Layout(width="250px"))
        self.metrics = widgets.HTML(layout=widgets.Layout(width="220px"))
        self.status = widgets.HTML(layout=widgets.Layout(width="240px"))
        self.box = widgets.HBox(
            [self.label, self.bar, self.steps, self.metrics, self.status],
            layout=widgets.Layout(align_items="center", width="100%"),
        )
        self.version = -1

    def static_html(self) -> str:
        """The row as plain HTML (a CSS bar), for a dashboard whose widgets were released."""
        bar = self.bar
        percent = 100 * bar.value / bar.max if bar.max else 0
        color = {"success": "#4caf50", "danger": "#e53935", "warning": "#fb8c00"}.get(
            bar.bar_style, "#2196f3"
        )
        cells = [
            f'<div style="width:120px">{self.label.value}</div>',
            '<div style="flex:1 1 auto;min-width:120px;height:14px;background:#eee">'
            f'<div style="width:{percent:.0f}%;height:100%;background:{color}"></div></div>',
            f'<div style="width:250px;padding-left:6px">{self.steps.value}</div>',
            f'<div style="width:220px">{self.metrics.value}</div>',
            f'<div style="width:240px">{self.status.value}</div>',
        ]
        return f'<div style="display:flex;align-items:center;gap:4px">{"".join(cells)}</div>'

    def widgets(self) -> list[widgets.Widget]:
        return [self.label, self.bar, self.steps, self.metrics, self.status, self.box]

    def render(self, view: RankView) -> None:
        if view.version == self.version:
            return
        self.version = view.version
        device = "".join(f" · {escape(text)}" for text in (view.device, view.strategy) if text)
        self.label.value = f"<b>rank {view.rank}</b>{device}"
        value, maximum = _bar_position(view)
        with self.bar.hold_sync():
            self.bar.max = maximum
            self.bar.value = value
            self.bar.bar_style = BAR_STYLES[view.status]
        self.steps.value = _one_line_html(format_steps(view)) if _has_steps(view) else ""
        self.metrics.value = _one_line_html(format_metrics(view.metrics)) if view.metrics else ""
        self.status.value = _status_html(view)


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
        self.title = widgets.HTML()
        self.charts = widgets.HTML(layout=widgets.Layout(display="none"))
        self.log = widgets.HTML(layout=widgets.Layout(display="none"))
        self.summary = widgets.HTML(layout=widgets.Layout(display="none"))
        self.box: widgets.VBox | None = None
        self._drawn = -1  # RunState.version last drawn
        self._metrics_drawn = -1
        self._chart_at = -CHART_EVERY  # monotonic time of the last chart redraw
        self._output_drawn = 0  # index of the next output line to take from the RunState
        self._output_at = -OUTPUT_EVERY  # monotonic time of the last output redraw
        self._rows_html: deque[str] = deque(maxlen=MAX_OUTPUT_LINES)  # shown lines, as markup
        self._tail: deque[OutputLine] = deque(maxlen=TEXT_TAIL_LINES)  # for the text version
        self._output_total = 0  # lines this view showed, or lost to a flood between redraws
        self._dump_lines = 0  # of those, stack dumps: not "earlier lines" of the text version
        self._note: _Note | None = None
        self._state: RunState | None = None
        self._final_text = ""

    def draw(self, state: RunState, *, final: bool = False) -> None:
        if self.box is None:
            self._build(state)
        self._state = state
        self._draw_title(state)  # the elapsed time moves even when nothing else does
        if state.version != self._drawn:
            self._drawn = state.version
            for rank, row in self.rows.items():
                row.render(state.ranks[rank])
            self._draw_summary(state)
        now = time.monotonic()
        if state.output_count != self._output_drawn and (
            final or now - self._output_at >= OUTPUT_EVERY
        ):
            self._output_at = now
            self._draw_output(state)
        if state.metrics_version != self._metrics_drawn and (
            final or now - self._chart_at >= CHART_EVERY
        ):
            self._metrics_drawn, self._chart_at = state.metrics_version, now
            self._draw_charts(state)

    def note(self, text: str) -> None:
        """A node-level message in the header, until ranks start again or the run ends."""
        self._note = _Note(text, time.time()) if text else None
        if self.box is not None and self._state is not None:
            self._draw_title(self._state)

    def close(self, state: RunState) -> None:
        self.draw(state, final=True)
        assert self.box is not None
        # Frontends without widget support (and saved notebooks) show this text instead.
        earlier = self._output_total - self._dump_lines - len(self._tail)
        self._final_text = final_text(state, self._tail, earlier)
        self._display.update(self._bundle(self._final_text))
        _finished.append(self)
        _retire_old_dashboards()

    def freeze(self) -> None:
        """Replace the live dashboard by static HTML of its final state and close its widgets."""
        if self.box is None:
            return
        parts = [self.title.value, *(row.static_html() for row in self.rows.values())]
        extras = (self.charts, self.log, self.summary)
        parts += [w.value for w in extras if w.layout.display != "none"]
        html = "".join(f"<div>{part}</div>" for part in parts)
        self._display.update({"text/html": html, "text/plain": self._final_text})
        for widget in [self.title, self.charts, self.log, self.summary, self.box]:
            _close(widget)
        for row in self.rows.values():
            for widget in row.widgets():
                _close(widget)
        self.box = None

    # -- building -------------------------------------------------------------------------------

    def _build(self, state: RunState) -> None:
        self.rows = {rank: RankRow(rank) for rank in sorted(state.ranks)}
        self.box = widgets.VBox(
            [
                self.title,
                *(row.box for row in self.rows.values()),
                self.charts,
                self.log,
                self.summary,
            ],
            layout=widgets.Layout(width="100%"),
        )
        self.box.add_class("nbtrain-dashboard")
        self._display.show(self._bundle(f"nbtrain: {len(self.rows)} rank(s) running"))

    def _bundle(self, text: str) -> dict[str, Any]:
        assert self.box is not None
        bundle = dict(self.box._repr_mimebundle_())
        bundle["text/plain"] = text
        return bundle

    # -- parts ----------------------------------------------------------------------------------

    def _draw_title(self, state: RunState) -> None:
        title = escape(state.title) if state.title else f"{len(self.rows)} ranks"
        note = self._current_note(state)
        note_html = f' · <span class="nbtrain-note">{escape(note)}</span>' if note else ""
        self.title.value = (
            f"<b>nbtrain</b> · {title} · {format_duration(state.elapsed)}{note_html}"
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
        names = _metric_names(state)[:MAX_CHARTS]
        if not names:
            return
        legend = " ".join(
            f'<span style="color:{rank_color(rank)}">■</span> rank {rank}'
            for rank in sorted(state.ranks)
        )
        charts = "".join(
            svg_chart(name, {r: v.history.get(name, []) for r, v in state.ranks.items()})
            for name in names
        )
        self.charts.value = (
            f'<div style="font-size:11px">{legend}</div>'
            f'<div style="display:flex;flex-wrap:wrap;gap:8px">{charts}</div>'
        )
        self.charts.layout.display = ""

    def _draw_output(self, state: RunState) -> None:
        new = state.lines_since(self._output_drawn)
        # Lines the RunState no longer kept (a flood between two redraws) count as not shown.
        self._output_total += max(0, (new[0].index if new else 0) - self._output_drawn)
        self._output_drawn = state.output_count
        shown = [line for line in new if self._shows(line)]
        if not shown:
            return  # nothing this view shows changed: no rebuild, no message
        self._output_total += len(shown)
        # The text version's tail is what the ranks printed last; a timeout's stack dumps are
        # summed up in the TimeoutError already (and shown whole in the output area).
        printed = [line for line in shown if not line.dump]
        self._dump_lines += len(shown) - len(printed)
        self._tail.extend(printed)
        self._rows_html.extend(_line_html(line) for line in shown[-MAX_OUTPUT_LINES:])
        hidden = self._output_total - len(self._rows_html)
        self.log.value = _output_html(self._rows_html, hidden)
        self.log.layout.display = ""

    def _shows(self, line: OutputLine) -> bool:
        if self.output is OutputMode.NONE:
            return False
        return self.output is OutputMode.ALL or line.rank == 0

    def _draw_summary(self, state: RunState) -> None:
        if not state.summary:
            return
        color = summary_color(state)
        self.summary.value = f'<b style="color:{color}">{escape(state.summary)}</b>'
        self.summary.layout.display = ""


def _close(widget: widgets.Widget) -> None:
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


def final_text(state: RunState, tail: Iterable[OutputLine] = (), earlier: int = 0) -> str:
    """The dashboard as plain text: one line per rank, the output's last lines, the summary.

    ``tail`` is the end of the output this view shows and ``earlier`` how many lines came
    before it.
    """
    lines = [format_rank(view) for _, view in sorted(state.ranks.items())]
    if earlier > 0:
        lines.append(f"… {earlier} earlier output lines not shown")
    for line in tail:
        text = line.text
        if len(text) > TEXT_TAIL_CHARS:
            text = text[:TEXT_TAIL_CHARS] + "…"
        lines.append(f"[rank {line.rank}] {text}")
    if state.summary:
        lines.append(state.summary)
    return "\n".join(lines)


def _bar_position(view: RankView) -> tuple[int, int]:
    """(value, max) of the bar; a rank that reported no total fills its bar when done."""
    if view.total:
        return min(view.step, view.total), view.total
    done = view.status is RankStatus.DONE
    return (1 if done else 0), 1


def _has_steps(view: RankView) -> bool:
    return view.total is not None or view.step > 0


_ONE_LINE = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;display:block"


def _one_line_html(text: str, style: str = "") -> str:
    """A cell that never wraps (rows keep their height); the full text shows on hover."""
    shown = escape(text)
    return f'<span title="{shown}" style="{_ONE_LINE}{style}">{shown}</span>'


def _status_html(view: RankView) -> str:
    color = STATUS_COLORS.get(view.status)
    return _one_line_html(format_status(view), f";color:{color};font-weight:bold" if color else "")


def _metric_names(state: RunState) -> list[str]:
    names: dict[str, None] = {}
    for _, view in sorted(state.ranks.items()):
        names.update(dict.fromkeys(view.history))
    return list(names)


def _line_html(line: OutputLine) -> str:
    text = line.text if len(line.text) <= MAX_LINE_CHARS else line.text[:MAX_LINE_CHARS] + "…"
    color = ";color:#c62828" if line.stream == "stderr" else ""
    return (
        f'<div style="white-space:pre-wrap{color}">'
        f'<span style="color:{rank_color(line.rank)}">[rank {line.rank}]</span> '
        f"{escape(text)}</div>"
    )


def _output_html(lines: Iterable[str], hidden: int) -> str:
    """The output area from the lines' markup (each made once, when the line arrived)."""
    # column-reverse keeps the scroll position at the newest line as lines arrive.
    rows = [f'<div style="color:#888">… {hidden} earlier lines not shown</div>'] if hidden else []
    rows.extend(lines)
    return (
        '<div class="nbtrain-output" style="max-height:220px;overflow-y:auto;display:flex;'
        "flex-direction:column-reverse;font-family:monospace;font-size:12px;line-height:1.35;"
        'border:1px solid #ddd;padding:2px 4px">'
        f"<div>{''.join(rows)}</div></div>"
    )
