"""The widget view, driven by a RunState and observed through a recorded comm.

Every widget message the kernel would send to the browser is recorded; replaying them gives the
state the frontend holds, which is what the assertions read.
"""

from __future__ import annotations

import base64
import html
import re
import warnings
from typing import Any

import comm
import pytest
from comm.base_comm import BaseComm

from nbtrain.display import make_view
from nbtrain.display import widgets as widgets_module
from nbtrain.display.chart import MAX_CHARTS
from nbtrain.display.runstate import RankStatus, RunState, Verdict
from nbtrain.display.text import TextView
from nbtrain.display.widgets import (
    STATUS_COLORS,
    WidgetView,
)
from nbtrain.kernel.options.config import OutputMode, ProgressMode
from nbtrain.shared.events import Exited, Failed, Finished, Log, Progress, Started, Status

GREEN, RED, ORANGE = (STATUS_COLORS[s] for s in (RankStatus.DONE, RankStatus.FAILED,
                                                 RankStatus.STOPPED))


class Frontend:
    """What a browser would know: every widget model's state, rebuilt from comm messages."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str, dict]] = []
        self.models: dict[str, dict[str, Any]] = {}

    def record(self, msg_type: str, comm_id: str, data: dict) -> None:
        self.messages.append((msg_type, comm_id, data))
        if msg_type == "comm_open":
            self.models[comm_id] = dict(data["state"])
        elif msg_type == "comm_msg" and data.get("method") == "update":
            self.models[comm_id].update(data["state"])

    def state_of(self, widget: Any) -> dict[str, Any]:
        return self.models[widget.model_id]


def chart_svgs(markup: str) -> list[str]:
    """The SVG of every chart image in ``markup`` (each is a base64 data URI)."""
    return [base64.b64decode(data).decode()
            for data in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', markup)]


def text(markup: str) -> str:
    """What the reader sees of an HTML widget's value."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


class RecordingComm(BaseComm):
    frontend: Frontend

    def publish_msg(
        self,
        msg_type: str,
        data: Any = None,
        metadata: Any = None,
        buffers: Any = None,
        **keys: Any,
    ) -> None:
        self.frontend.record(msg_type, self.comm_id, data or {})


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class RecordingDisplay:
    def __init__(self) -> None:
        self.shown: list[dict] = []
        self.updates: list[dict] = []

    def show(self, bundle: dict) -> None:
        self.shown.append(bundle)

    def update(self, bundle: dict) -> None:
        self.updates.append(bundle)

    @property
    def final_html(self) -> str:
        """The static dashboard that replaced the live one when the launch ended."""
        return self.updates[-1]["text/html"]


@pytest.fixture
def frontend(monkeypatch: pytest.MonkeyPatch) -> Frontend:
    recorded = Frontend()

    def create_comm(**kwargs: Any) -> RecordingComm:
        made = RecordingComm.__new__(RecordingComm)
        made.frontend = recorded
        made.__init__(**kwargs)
        return made

    monkeypatch.setattr(comm, "create_comm", create_comm)
    # Rows redraw at every draw here (the throttle has its own test).
    monkeypatch.setattr(widgets_module, "ROWS_EVERY", 0.0)
    return recorded


_ROW = r'(?s)data-rank="(\d+)"(.*?)(?=<div class="nbtrain-row"|$)'
_COLUMN = r'(?s)class="nbtrain-{}"[^>]*>(.*?)</div>'


def rows_of(frontend: Frontend, view: WidgetView) -> dict[int, dict[str, Any]]:
    """Each rank's row as the frontend holds it (every row is in one HTML widget): its label,
    steps, metrics and status markup, and its bar's (value, max, style)."""
    assert view.rows is not None
    markup = frontend.state_of(view.rows)["value"]
    found = {}
    for rank, row in re.findall(_ROW, markup):
        bar = re.search(r'data-value="(\d+)" data-max="(\d+)" data-style="(\w*)"', row)
        assert bar is not None, row
        found[int(rank)] = {
            name: re.search(_COLUMN.format(name), row).group(1)  # type: ignore[union-attr]
            for name in ("label", "steps", "metrics", "status")
        } | {"bar": (int(bar.group(1)), int(bar.group(2)), bar.group(3))}
    return found


def dashboard(output: OutputMode = OutputMode.ALL) -> tuple[WidgetView, RecordingDisplay]:
    display = RecordingDisplay()
    return WidgetView(output=output, world_size=2, display=display), display


def state_with(ranks=(0, 1)) -> RunState:
    state = RunState(list(ranks), title="2 ranks, fork")
    for rank in ranks:
        state.apply(Started(rank, 100 + rank, "cpu", "host", rank, time=0.0))
    return state


def test_the_dashboard_shows_once_with_a_text_fallback(frontend) -> None:
    view, display = dashboard()
    state = state_with()
    view.draw(state)
    view.draw(state)
    assert len(display.shown) == 1
    bundle = display.shown[0]
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == view.box.model_id
    assert bundle["text/plain"] == "nbtrain: 2 rank(s) running"  # never 'VBox(...)'
    assert view.box.model_id in frontend.models


def test_each_rank_row_shows_device_bar_steps_rate_metrics_and_status(frontend) -> None:
    view, _ = dashboard()
    state = state_with()
    state.apply(Progress(1, 30, 100, "train", time=1.0))
    state.apply(Progress(1, 40, 100, "train", time=1.8))
    state.apply(Log(1, {"loss": 0.123449, "acc": 0.5}, step=40))
    view.draw(state)
    rows = rows_of(frontend, view)
    row = rows[1]
    assert "rank 1" in row["label"] and "cpu" in row["label"]
    assert row["bar"] == (40, 100, "")
    assert text(row["steps"]) == "train 40/100 ETA 0:05 12.5 it/s"
    # Compact in the row (3 significant digits, ' · ' between), whole in the tooltip
    assert text(row["metrics"]) == "loss 0.123 · acc 0.5"
    assert 'title="loss 0.1234 acc 0.5"' in row["metrics"]
    assert text(row["status"]) == "running"
    assert rows[0]["bar"][0] == 0


def test_done_rows_turn_green_at_their_total(frontend) -> None:
    view, _ = dashboard()
    state = state_with()
    for rank in (0, 1):
        state.apply(Progress(rank, 100, 100, "train"))
        state.apply(Finished(rank, None))
    view.draw(state)
    for row in rows_of(frontend, view).values():
        assert row["bar"] == (100, 100, "success")
        assert text(row["status"]) == "done"


def test_a_failed_rank_turns_red_with_its_reason_and_a_stopped_peer_orange(frontend) -> None:
    view, _ = dashboard()
    state = state_with()
    state.apply(Progress(1, 3, 10, None))
    state.apply(Failed(1, "ValueError", "boom on rank 1\nmore", "tb", None, 1, False))
    state.apply(Exited(1, 1, None, stopped_by_launcher=False))
    state.apply(Exited(0, -15, "SIGTERM", stopped_by_launcher=True))
    view.draw(state)
    rows = rows_of(frontend, view)
    failed, stopped = rows[1], rows[0]
    assert failed["bar"][2] == "danger"
    assert text(failed["status"]) == "failed: ValueError: boom on rank 1"
    assert stopped["bar"][2] == "warning"
    assert text(stopped["status"]) == "stopped"


def test_a_rank_without_a_total_fills_its_bar_when_done(frontend) -> None:
    view, _ = dashboard()
    state = state_with([0])
    state.apply(Finished(0, None))
    view.draw(state)
    row = rows_of(frontend, view)[0]
    assert row["bar"] == (1, 1, "success")
    assert row["steps"] == ""


def test_only_what_changed_is_sent(frontend) -> None:
    view, _ = dashboard()
    state = state_with()
    view.draw(state)
    # The title carries the elapsed time and may tick between draws; everything else is checked.
    title = view.title.model_id
    sent = len(frontend.messages)
    view.draw(state)
    assert [m for m in frontend.messages[sent:] if m[1] != title] == []
    for step in (5, 6):  # every row in one widget: one message, whichever rows changed
        state.apply(Progress(1, step, 10, None))
        state.apply(Progress(0, step, 10, None))
        view.draw(state)
        sent_now = [m for m in frontend.messages[sent:] if m[1] != title]
        assert [m[1] for m in sent_now] == [view.rows.model_id]
        sent = len(frontend.messages)


def test_the_rows_send_one_message_a_redraw_at_most_every_rows_interval_whatever_n(
    frontend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(widgets_module, "ROWS_EVERY", 3600.0)
    display = RecordingDisplay()
    view = WidgetView(output=OutputMode.ALL, world_size=16, display=display)
    state = state_with(range(16))
    view.draw(state)  # the first draw shows every row at once
    assert len(rows_of(frontend, view)) == 16
    sent = len(frontend.messages)
    for step in range(1, 4):
        for rank in range(16):
            state.apply(Progress(rank, step, 10, "train"))
        view.draw(state)
    # Within the interval nothing of the rows goes out (the title may tick: its elapsed time)
    assert view.rows.model_id not in {m[1] for m in frontend.messages[sent:]}
    assert rows_of(frontend, view)[15]["bar"] == (0, 1, "")
    monkeypatch.setattr(view._rows_due, "every", 0.0)
    view.draw(state)
    updates = [m for m in frontend.messages[sent:] if m[1] == view.rows.model_id]
    assert len(updates) == 1 and rows_of(frontend, view)[15]["bar"] == (3, 10, "")


def test_the_chart_draws_a_line_per_rank_and_redraws_only_on_new_metrics(
    frontend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(widgets_module, "CHART_EVERY", 0.0)
    view, _ = dashboard()
    state = state_with()
    view.draw(state)
    assert frontend.state_of(view.charts.layout)["display"] == "none"  # nothing logged yet
    for step in range(20):
        for rank in (0, 1):
            state.apply(Log(rank, {"loss": 1.0 / (step + 1 + rank)}, step=step))
    view.draw(state)
    markup = frontend.state_of(view.charts)["value"]
    assert "<svg" not in markup  # an image: sanitisers of untrusted notebooks drop inline SVG
    (svg,) = chart_svgs(markup)
    assert 'data-metric="loss"' in svg
    assert 'data-rank="0"' in svg and 'data-rank="1"' in svg
    assert svg.count("<polyline") == 2
    assert frontend.state_of(view.charts.layout)["display"] == ""
    sent = len(frontend.messages)
    state.apply(Progress(0, 1, 10, None))
    view.draw(state)
    assert view.charts.model_id not in {m[1] for m in frontend.messages[sent:]}


def test_the_chart_redraws_at_most_every_chart_interval_and_at_the_end(
    frontend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(widgets_module, "CHART_EVERY", 3600.0)
    view, display = dashboard()
    state = state_with()
    state.apply(Log(0, {"loss": 1.0}, step=0))
    state.apply(Log(0, {"loss": 0.9}, step=1))
    view.draw(state)  # the first chart draws at once
    state.apply(Log(0, {"loss": 0.5}, step=2))
    view.draw(state)
    view.draw(state)
    assert ">0.5</text>" not in "".join(chart_svgs(frontend.state_of(view.charts)["value"]))
    assert text(rows_of(frontend, view)[0]["metrics"]) == "loss 0.5"  # rows are not
    state.finish("Done")
    view.close(state)
    (svg,) = chart_svgs(display.final_html)
    assert svg.count("<polyline") == 1
    assert ">0.5</text>" in svg  # the final chart is whole


def test_close_shows_the_summary_and_leaves_a_text_version(frontend) -> None:
    view, display = dashboard()
    state = state_with()
    for rank in (0, 1):
        state.apply(Progress(rank, 8, 8, "train"))
        state.apply(Log(rank, {"loss": 0.25}, step=8))
        state.apply(Finished(rank, None))
    state.finish("Done in 1.2s, 6.7 steps/s")
    view.close(state)
    assert "Done in 1.2s, 6.7 steps/s" in text(display.final_html)
    assert display.updates[-1]["text/plain"] == (
        "[rank 0] train 8/8 loss 0.25 done\n[rank 1] train 8/8 loss 0.25 done\n"
        "Done in 1.2s, 6.7 steps/s"
    )


def test_a_page_opened_mid_launch_gets_the_lines_and_keeps_the_final_view(frontend) -> None:
    """A reloaded page gets none of the cell's later stream output: the dashboard copies the
    lines into a widget of its own and, at the end, keeps its box open with the final view."""
    view, display = dashboard()
    state = state_with()
    view.draw(state)
    assert view.box is not None
    copy = view.follow_reloaded()
    assert copy is not None and view.reloaded is not None
    assert view.box.children[-1] is view.reloaded.lines  # in the box the reloaded page draws
    copy("[rank 0] step 1\n[rank 1] step 1\n")
    view.draw(state, now=True)
    shown = text(frontend.state_of(view.reloaded.lines)["value"])
    assert shown == "[rank 0] step 1\n[rank 1] step 1"
    box, lines = view.box.model_id, view.reloaded.lines.model_id
    for rank in (0, 1):
        state.apply(Finished(rank, None))
    state.finish("Done in 1.0s")
    copy("[rank 1] last line\n")
    view.close(state)
    closed = {comm_id for kind, comm_id, _ in frontend.messages if kind == "comm_close"}
    assert box not in closed and lines in closed
    (final,) = view.reloaded.kept[0].children  # the final dashboard and the lines
    shown = text(frontend.state_of(final)["value"])
    assert "Done in 1.0s" in shown and shown.endswith("[rank 1] last line"), shown
    assert "Done in 1.0s" in text(display.final_html)  # the page that ran the cell, as before
    final_id = final.model_id
    view.reloaded.release()
    closed = {comm_id for kind, comm_id, _ in frontend.messages if kind == "comm_close"}
    assert {box, final_id} <= closed


def test_without_a_page_opened_mid_launch_every_widget_is_closed(frontend) -> None:
    view, _ = dashboard()
    state = state_with([0])
    view.draw(state)
    state.apply(Finished(0, None))
    state.finish("Done in 0.1s")
    view.close(state)
    opened = {comm_id for kind, comm_id, _ in frontend.messages if kind == "comm_open"}
    closed = {comm_id for kind, comm_id, _ in frontend.messages if kind == "comm_close"}
    assert opened == closed and view.follow_reloaded() is None


def test_a_run_too_short_to_draw_still_gets_its_dashboard(frontend) -> None:
    view, display = dashboard()
    state = state_with([0])
    state.apply(Finished(0, None))
    state.finish("Done in 0.1s")
    view.close(state)
    assert len(display.shown) == 1 and len(display.updates) == 1


def test_auto_picks_text_outside_a_kernel_and_widgets_warns_there() -> None:
    view = make_view(ProgressMode.AUTO, OutputMode.ALL, 2)
    assert isinstance(view, TextView) and view.show_progress
    with pytest.warns(UserWarning, match="progress='widgets' needs a Jupyter kernel"):
        view = make_view(ProgressMode.WIDGETS, OutputMode.ALL, 2)
    assert isinstance(view, TextView)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off = make_view(ProgressMode.OFF, OutputMode.ALL, 2)
    assert isinstance(off, TextView) and not off.show_progress


def test_the_chart_stays_small_however_long_the_run_and_however_many_ranks() -> None:
    from nbtrain.display.chart import svg_chart

    long_run = {rank: [(s, 1.0 / (s + 1)) for s in range(2000)] for rank in range(8)}
    svg = svg_chart("loss", long_run)
    assert svg.count("<polyline") == 8
    assert len(svg) < 40_000  # about 150 points per line, not 2000
    newest = svg_chart("loss", {0: [(s, float(s)) for s in range(1001)]})
    assert "step 1000</text>" in newest  # thinning keeps the newest point
    flat = svg_chart("acc", {0: [(1, 0.5), (2, 0.5)], 1: [(1, float("nan"))]})
    assert flat.count("<polyline") == 1  # a flat line draws; a rank with only NaN does not


def test_every_logged_point_is_in_the_final_chart_and_its_words(frontend) -> None:
    view, display = dashboard()
    state = state_with([0])
    losses = [(step * 50, 1.0 / (step + 1)) for step in range(8)]  # notebook 01 logs 8 times
    for step, loss in losses:
        state.apply(Log(0, {"loss": loss}, step=step))
    state.finish("Done")
    view.close(state)
    (svg,) = chart_svgs(display.final_html)
    points = re.search(r'<polyline data-rank="0" points="([^"]+)"', svg)
    assert points is not None and len(points.group(1).split()) == len(losses)
    assert 'alt="loss: rank 0 8 points, last 0.125 at step 350"' in display.final_html


def test_metrics_beyond_the_charted_ones_are_named(frontend) -> None:
    view, display = dashboard()
    state = state_with([0])
    for step in range(3):
        state.apply(Log(0, {name: float(step) for name in "abcde"}, step=step))
    state.finish("Done")
    view.close(state)
    assert len(chart_svgs(display.final_html)) == MAX_CHARTS
    assert "also logged, not charted: d, e" in display.final_html


@pytest.mark.parametrize("ending", ["done", "failed", "stopped"])
def test_an_ended_dashboard_is_replaced_by_static_html_and_releases_its_widgets(
    frontend, ending
) -> None:
    view, display = dashboard()
    state = ended(ending)
    state.apply(Progress(0, 5, 10, "train"))
    state.apply(Log(0, {"loss": 1.0}, step=1))
    state.apply(Log(0, {"loss": 0.5}, step=2))
    view.draw(state)
    opened = {comm_id for kind, comm_id, _ in frontend.messages if kind == "comm_open"}
    state.finish("the end")
    view.close(state)
    final = display.updates[-1]
    # No widget mimetype left: a reopened notebook cannot say "model not found".
    assert WIDGET_VIEW not in final and set(final) == {"text/html", "text/plain"}
    markup = final["text/html"]
    assert markup.count('class="nbtrain-row"') == 2 and "the end" in text(markup)
    assert 'title="loss"' in markup and "train 5/10" in text(markup)
    closed = {comm_id for kind, comm_id, _ in frontend.messages if kind == "comm_close"}
    assert opened <= closed, "an ended dashboard kept widget comms open"
    assert view.box is None
    view.close(state)  # a second close changes nothing
    view.draw(state)
    assert display.updates[-1] is final and len(display.shown) == 1


def summary_color(display) -> str:
    found = re.search(r'<b style="color:(#[0-9a-f]{6})">', display.final_html)
    markup = display.final_html
    assert found, markup
    return found.group(1)


def ended(ending: str) -> RunState:
    """Rank 0 done; rank 1 done, failed, or stopped by the launcher."""
    state = state_with()
    state.apply(Finished(0, None))
    if ending == "done":
        state.apply(Finished(1, None))
    elif ending == "failed":
        state.apply(Failed(1, "ValueError", "boom", "tb", None, 1, False))
        state.apply(Exited(1, 1, None, stopped_by_launcher=False))
    else:
        state.apply(Exited(1, -15, "SIGTERM", stopped_by_launcher=True))
    return state


@pytest.mark.parametrize(
    ("ending", "summary", "verdict", "color"),
    [
        ("done", "Done in 1.0s", None, GREEN),
        ("failed", "Failed after 1.0s: rank 1 raised ValueError: boom", None, RED),
        ("stopped", "Timed out after 5s", Verdict.TIMED_OUT, RED),
        ("stopped", "Interrupted after 1.0s: every rank was stopped", None, ORANGE),
        # Multi-node, on the node where nothing failed: its ranks were only stopped.
        ("stopped", "Failed after 1.0s: rank 3 (node 1) failed", Verdict.FAILED, RED),
        ("stopped", "Done in 1.0s", Verdict.SUCCEEDED, ORANGE),  # not every rank is done
    ],
)
def test_the_summary_is_green_only_when_the_run_succeeded(
    frontend, ending, summary, verdict, color
) -> None:
    view, display = dashboard()
    state = ended(ending)
    state.finish(summary, verdict)
    view.close(state)
    assert summary_color(display) == color


def test_a_ranks_note_shows_mid_run_only_until_it_moves_on(frontend) -> None:
    view, _ = dashboard()
    state = RunState([0, 1], title="2 ranks, fork")
    for rank in (0, 1):
        state.apply(Status(rank, "all 2 nodes joined; starting ranks"))
    view.draw(state)
    status = [text(rows_of(frontend, view)[r]["status"]) for r in (0, 1)]
    assert status == ["all 2 nodes joined; starting ranks"] * 2
    for rank in (0, 1):
        state.apply(Started(rank, 100 + rank, "cpu", "host", rank))
    state.apply(Progress(0, 1, 10, "train"))
    state.apply(Status(1, "rank 1 has waited 120 s in barrier"))
    view.draw(state)
    assert text(rows_of(frontend, view)[0]["status"]) == "running"
    assert text(rows_of(frontend, view)[1]["status"]).startswith("rank 1 has waited")
    state.apply(Progress(1, 2, 10, "train"))
    view.draw(state)
    assert text(rows_of(frontend, view)[1]["status"]) == "running"


def test_a_restarted_rank_is_shown_running_again_not_failed(frontend) -> None:
    view, _ = dashboard()
    state = state_with()
    state.apply(Progress(1, 7, 10, "train"))
    state.apply(Failed(1, "ValueError", "boom", "tb", None, 1, False))
    state.apply(Exited(1, 1, None, stopped_by_launcher=False))
    view.draw(state)
    assert rows_of(frontend, view)[1]["bar"][2] == "danger"
    state.restart()
    state.apply(Status(1, "restarting every rank (restart 1 of 2): rank 1 failed"))
    view.draw(state)
    assert text(rows_of(frontend, view)[1]["status"]).startswith("restarting every")
    assert rows_of(frontend, view)[1]["steps"] == ""  # not the last attempt's 7/10
    for rank in (0, 1):
        state.apply(Started(rank, 200 + rank, "cpu", "host", rank))
        state.apply(Progress(rank, 3, 10, "train"))
    view.draw(state)
    for rank in (0, 1):
        assert text(rows_of(frontend, view)[rank]["status"]) == "running"
        assert rows_of(frontend, view)[rank]["bar"][2] == ""


def test_a_node_note_shows_in_the_header_until_ranks_start(frontend) -> None:
    view, display = dashboard()
    state = RunState([0, 1], title="node 0 of 2")
    view.draw(state)
    view.note("waiting for nodes (1 of 2 joined)")
    assert "waiting for nodes (1 of 2 joined)" in text(frontend.state_of(view.title)["value"])
    view.note("all 2 nodes joined; starting ranks")
    title = text(frontend.state_of(view.title)["value"])
    assert "all 2 nodes joined" in title and "waiting" not in title
    state.apply(Started(0, 100, "cpu", "host", 0))  # started after the note: it is stale
    view.draw(state)
    assert "joined" not in text(frontend.state_of(view.title)["value"])
    view.note("finished; waiting for the other nodes (1 of 2 done)")
    view.draw(state)
    assert "1 of 2 done" in text(frontend.state_of(view.title)["value"])
    state.finish("Done in 1.0s")
    view.close(state)
    assert "1 of 2 done" not in text(display.final_html)


def test_a_start_up_phase_counts_its_seconds_without_new_events(frontend, monkeypatch) -> None:
    """The row of a rank in a phase ('importing torch') is redrawn as time passes, not only
    when an event arrives: the seconds it has taken keep counting."""
    from nbtrain.display import formatting

    clock = [1000.0]
    monkeypatch.setattr(formatting.time, "time", lambda: clock[0])  # (the time module's)
    view, _ = dashboard()
    state = RunState([0, 1], title="2 ranks, spawn")
    state.apply(Status(0, "importing torch", time=999.5))
    view.draw(state)
    assert text(rows_of(frontend, view)[0]["status"]) == "importing torch"
    clock[0] = 1002.0
    view.draw(state)  # no event since
    assert text(rows_of(frontend, view)[0]["status"]) == "importing torch (2s)"


def test_a_row_shows_several_metrics_short_their_names_whole_on_hover() -> None:
    from nbtrain.display.rows import compact_metrics

    values = {"train/loss": 0.45231, "train/accuracy": 0.88123, "learning_rate": 0.000912}
    assert compact_metrics(values) == "loss 0.452 · accuracy 0.881 · learning_… 0.000912"
