"""What the dashboard says about a run that ended, nested loops' ETA, and single-point metrics.

Driven by RunState events, read from the static rendering that replaces the live dashboard.
"""

from __future__ import annotations

import html
import re
import time

from nbtrain.display.formatting import format_steps, run_eta
from nbtrain.display.rows import static_row
from nbtrain.display.runstate import RankStatus, RunState, Verdict
from nbtrain.display.widgets import WidgetView
from nbtrain.shared.events import Failed, Log, Progress, Started, Status
from nbtrain.shared.options import OutputMode


class Recorder:
    def __init__(self) -> None:
        self.updates: list[dict] = []

    def show(self, bundle: dict) -> None:
        pass

    def update(self, bundle: dict) -> None:
        self.updates.append(bundle)


def running(ranks=(0, 1)) -> RunState:
    state = RunState(list(ranks), title="t")
    for rank in ranks:
        state.apply(Started(rank, 100 + rank, "cpu", "host", rank, time=0.0))
        state.apply(Progress(rank, 30, 100, "train", time=1.0))
        state.apply(Progress(rank, 40, 100, "train", time=1.8))
    return state


def test_after_an_interrupt_running_ranks_say_stopped_at_their_step_without_an_eta() -> None:
    state = running()
    assert "ETA" in format_steps(state.ranks[0])
    state.finish("Interrupted after 2.0s: every rank was stopped")
    for view in state.ranks.values():
        assert view.status is RankStatus.STOPPED
        row = static_row(view)
        assert 'data-status="stopped"' in row and "#fb8c00" in row  # orange bar
        shown = html.unescape(re.sub(r"<[^>]+>", " ", row))
        assert "train 40/100" in shown and "ETA" not in shown and "running" not in shown


def test_a_successful_finish_leaves_statuses_alone() -> None:
    state = running([0])
    state.finish("Done", Verdict.SUCCEEDED)
    assert state.ranks[0].status is RankStatus.RUNNING  # not every rank reported: not green


def test_the_eta_covers_the_whole_run_when_every_outer_total_is_known() -> None:
    state = RunState([0])
    state.apply(Started(0, 1, "cpu", "h", 0, time=0.0))
    # Epoch 2 of 3 (one done), batch 10 of 20: 10 + 1 * 20 steps left, at 10 steps/s.
    for step, at in ((5, 1.0), (10, 1.5)):
        state.apply(
            Progress(0, step, 20, "epoch 2/3 · train", time=at, loop="train", outer=((1, 3),))
        )
    view = state.ranks[0]
    assert view.rate == 10.0
    assert run_eta(view) == 3.0
    assert "ETA 0:03" in format_steps(view)
    # An outer loop without a total: only the current loop's rest is known.
    state.apply(Progress(0, 11, 20, "epoch 2 · train", time=1.6, loop="train", outer=((1, None),)))
    eta = run_eta(state.ranks[0])
    assert eta is not None and eta < 1.5


def test_a_metric_logged_once_gives_no_empty_chart_but_its_value() -> None:
    recorder = Recorder()
    view = WidgetView(output=OutputMode.NONE, world_size=1, display=recorder)
    state = RunState([0])
    state.apply(Started(0, 1, "cpu", "h", 0))
    state.apply(Log(0, {"accuracy_on_the_validation_set": 0.91}, step=3))
    state.finish("Done")
    view.close(state)
    markup = recorder.updates[-1]["text/html"]
    assert "<svg" not in markup and "nbtrain-chart" not in markup
    assert "accuracy_on_the_validation_set 0.91" in html.unescape(markup)


def test_a_long_failure_is_ellipsized_with_the_full_text_as_tooltip() -> None:
    state = RunState([0])
    state.apply(Started(0, 1, "cpu", "h", 0))
    state.apply(Failed(0, "ValueError", "x" * 5000, "tb", None, 1, False))
    failure = state.ranks[0].failure
    assert len(failure) == 1000 and failure.endswith("…")
    row = static_row(state.ranks[0])
    assert f'title="failed: {failure}"' in html.unescape(row)
    assert "text-overflow:ellipsis" in row


def _columns(row: str) -> dict[str, str]:
    """A static row's columns: name -> its style (display and flex)."""
    return dict(re.findall(r'<div class="nbtrain-(steps|metrics|status)" style="([^"]*)"', row))


def test_the_status_spans_the_columns_its_row_leaves_empty_in_both_renderings() -> None:
    """A starting rank's phase takes the empty steps and metrics columns, a rank without
    metrics the metrics column, a failed rank the metrics column (its metrics go to the
    tooltip); a span's flex is the sum of the columns it covers, so rows stay aligned."""
    now = time.time()
    state = RunState([0, 1, 2, 3, 4])
    for rank in range(5):
        state.apply(Started(rank, 1, "cpu", "h", rank, time=now - 5))
    # A running rank with metrics that waits in a phase: 'saving checkpoint… (4s)' takes the
    # metrics column too (at 900 px the status column alone showed 'sa… (4s)').
    state.apply(Progress(4, 3, 10, "train"))
    state.apply(Log(4, {"loss": 0.52}, step=3))
    state.apply(Status(4, "saving checkpoint…", time=now - 4))
    state.apply(Status(0, "forming the process group (gloo): waiting for every rank",
                       time=now - 3))
    state.apply(Progress(1, 3, 10, "train"))
    for rank in (2, 3):
        state.apply(Progress(rank, 3, 10, "train"))
        state.apply(Log(rank, {"loss": 0.52}, step=3))
    state.apply(Failed(3, "ValueError", "boom " + "x" * 100, "tb", None, 1, False))
    expected = {  # rank -> (hidden columns, the status's flex)
        0: ({"steps", "metrics"}, "0 1 68%"),
        1: ({"metrics"}, "0 1 43%"),
        2: (set(), "0 1 18%"),
        3: ({"metrics"}, "0 1 43%"),
        4: ({"metrics"}, "0 1 43%"),
    }
    view = WidgetView(output=OutputMode.NONE, world_size=5, display=Recorder())
    view.draw(state)
    for rank, (hidden, flex) in expected.items():
        columns = _columns(static_row(state.ranks[rank]))
        assert {n for n, style in columns.items() if "display:none" in style} == hidden, rank
        assert columns["status"].endswith(f"flex:{flex}"), (rank, columns)
    # Live: the same markup, every row in the dashboard's one rows widget.
    assert view.rows is not None
    assert view.rows.value == "".join(static_row(state.ranks[rank]) for rank in range(5))
    # The phase's seconds are a tail kept whole after its (cut) text.
    starting = _status(view.rows.value, 0)
    assert re.search(r'class="nbtrain-tail"> \(3s\)</span>', starting), starting
    assert "max-width:calc(100% - 5ch)" in starting
    assert text(starting) == "forming the process group (gloo): waiting for every rank (3s)"
    failed = html.unescape(_status(view.rows.value, 3))
    assert 'title="failed: ValueError: boom ' + "x" * 100 + '\nlast logged: loss 0.52"' in failed
    # Once it has steps and metrics, the running rank's status is back in its own column.
    state.apply(Log(1, {"loss": 0.4}, step=3))
    view._rows_due.every = 0.0
    view.draw(state)
    assert _columns(_row(view.rows.value, 1))["status"].endswith(f"flex:{expected[2][1]}")


def _row(markup: str, rank: int) -> str:
    found = re.search(rf'(?s)data-rank="{rank}"(.*?)(?=<div class="nbtrain-row"|$)', markup)
    assert found is not None, markup
    return found.group(1)


def _status(markup: str, rank: int) -> str:
    found = re.search(r'(?s)class="nbtrain-status"[^>]*>(.*?)</div>', _row(markup, rank))
    assert found is not None
    return found.group(1)

def text(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def test_the_header_shows_its_whole_text_on_hover() -> None:
    recorder = Recorder()
    view = WidgetView(output=OutputMode.NONE, world_size=1, display=recorder)
    state = RunState([0], title="a <title>")
    state.apply(Started(0, 1, "cpu", "h", 0))
    view.draw(state)
    view.note("stopping at the next step (interrupt again to stop at once)")
    header = view.title.value
    assert 'title="nbtrain · a &lt;title&gt; · ' in header
    assert "(interrupt again to stop at once)\"" in header


def test_no_eta_while_a_rank_says_it_is_busy_elsewhere() -> None:
    state = RunState([0])
    state.apply(Started(0, 1, "cpu", "h", 0))
    for step, at in ((5, 1.0), (10, 1.5)):
        state.apply(Progress(0, step, 100, "train", time=at))
    assert "ETA" in format_steps(state.ranks[0])
    state.apply(Status(0, "saving checkpoint_3"))
    assert "ETA" not in format_steps(state.ranks[0])
    state.apply(Progress(0, 11, 100, "train", time=2.0))
    assert "ETA" in format_steps(state.ranks[0])
