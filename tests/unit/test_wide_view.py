"""The compact view of a wide run (display/groups.py, wide.py, widebody.py, bandchart.py), fed
with the events 64 or 1,024 ranks send; tests/kernel and tests/browser check it in a kernel."""

from __future__ import annotations

import time
from typing import Any

from nbtrain.display import groups
from nbtrain.display.runstate import RunState, Verdict
from nbtrain.display.text import TextView
from nbtrain.display.wide import text_lines, wide_html
from nbtrain.display.widgets import WidgetView
from nbtrain.shared.events import Exited, Failed, Finished, Log, Progress, Started
from nbtrain.shared.options import OutputMode
from nbtrain.shared.rankset import rank_ranges, ranks_label


class RecordingDisplay:
    def __init__(self) -> None:
        self.shown: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []

    def show(self, bundle: dict[str, Any]) -> None:
        self.shown.append(bundle)

    def update(self, bundle: dict[str, Any]) -> None:
        self.updates.append(bundle)


def running(n: int, *, step=lambda rank: 50, total: int = 100) -> RunState:
    state = RunState(list(range(n)), title=f"{n} ranks")
    start = time.time() - 10
    for rank in range(n):
        state.apply(Started(rank, 100 + rank, "cpu", "host", time=start))
        for at in (start + 1, start + 2):
            done = step(rank) * (1 if at == start + 2 else 0.5)
            state.apply(Progress(rank, int(done), total, "train", time=at, loop="train"))
        state.apply(Log(rank, {"loss": 1.0 / (1 + rank)}, step(rank),
                        earlier=((1, {"loss": 2.0}),)))
    return state


def test_rank_sets_read_as_ranges() -> None:
    assert rank_ranges([5, 0, 1, 2, 3, 7, 8, 9]) == "0-3, 5, 7-9"
    assert ranks_label([4]) == "rank 4" and ranks_label(range(64)) == "ranks 0-63"


def test_64_ranks_make_8_groups_with_least_median_most_and_the_slowest_named() -> None:
    state = running(64, step=lambda rank: 40 if rank == 13 else 50 + rank % 8)
    wide = groups.summarize(state)
    assert [g.name for g in wide.groups][:2] == ["ranks 0-7", "ranks 8-15"]
    second = wide.groups[1]
    assert (second.low, second.high) == (0.40, 0.57)
    assert second.slowest == 13
    assert wide.apart == []  # 10 steps behind at 5 it/s is not lagging yet


def test_a_failed_and_a_lagging_rank_get_rows_of_their_own() -> None:
    state = running(64, step=lambda rank: 5 if rank == 40 else 90)
    state.apply(Failed(63, "ValueError", "boom", "Traceback ...", None, 1, False))
    wide = groups.summarize(state)
    assert [(a.view.rank, a.reason) for a in wide.apart] == [(63, "failed"), (40, "lagging")]
    html = wide_html(state)
    assert 'data-rank="63" data-status="failed"' in html and "ValueError: boom" in html
    assert 'data-reason="lagging"' in html
    lines = text_lines(state)
    assert lines[0].startswith("[ranks 0-7] train 90/100")
    assert any(line.startswith("[rank 63]") and "failed: ValueError: boom" in line
               for line in lines)


def test_ranks_on_several_nodes_are_grouped_by_node() -> None:
    state = RunState(list(range(32)))
    for rank in range(32):
        state.apply(Started(rank, rank, "cpu", f"host-{rank // 16}"))
    assert [g.name for g in groups.summarize(state).groups] == [
        "node host-0 · ranks 0-15", "node host-1 · ranks 16-31"]


def test_the_live_dashboard_of_1024_ranks_is_one_widget_and_draws_fast() -> None:
    state = running(1024, step=lambda rank: rank % 100)
    display = RecordingDisplay()
    view = WidgetView(output=OutputMode.ALL, world_size=1024, display=display)
    view.draw(state)
    assert view.rows is None and view.wide is not None
    assert view.wide.rows.value.count("nbtrain-group") == 8
    began = time.perf_counter()
    for _ in range(5):
        view.wide._throttle._at = -float("inf")  # every draw a full redraw
        view.draw(state)
    assert (time.perf_counter() - began) / 5 < 0.05
    view.wide.selector.value = 700
    view.draw(state)
    assert 'data-rank="700"' in view.wide.rows.value
    state.finish("Done", Verdict.SUCCEEDED)
    view.close(state)
    final = display.updates[-1]
    assert final["text/html"].count("nbtrain-group") == 8
    assert "nbtrain-band-chart" in final["text/html"]  # the mean with its band, not 1,024 lines
    assert final["text/plain"].splitlines()[0].startswith("[ranks 0-127]")


def test_the_text_view_prints_groups_not_a_line_per_rank() -> None:
    import io

    out = io.StringIO()
    view = TextView(output=OutputMode.ALL, show_progress=True, live=False, stdout=out,
                    stderr=io.StringIO())
    state = running(64)
    view.draw(state)
    for rank in range(64):
        state.apply(Finished(rank, b""))
        state.apply(Exited(rank, 0, None, False))
    state.finish("Done", Verdict.SUCCEEDED)
    view.close(state)
    lines = out.getvalue().splitlines()
    assert lines and all(not line.startswith("[rank 5]") for line in lines)
    assert any(line.startswith("[ranks 0-7]") for line in lines)


def test_bands_hold_the_mean_least_and_most_in_a_bounded_number_of_bins() -> None:
    from nbtrain.display import bandchart

    state = RunState(list(range(64)))
    bands = bandchart.Bands(state)
    for rank in range(64):
        points = tuple((step, {"loss": float(rank)}) for step in range(1, 1000))
        state.apply(Log(rank, {"loss": float(rank)}, 1000, earlier=points))
    series = bands.series["loss"]
    assert 2 <= len(series.bins) <= bandchart.MAX_BINS
    rows = series.rows()
    assert rows[-1][0] == 1000  # drawn at the newest step
    assert all((mean, low, high) == (31.5, 0.0, 63.0) for _, mean, low, high in rows)
    svg = bandchart.band_svg("loss", series, 64)
    assert svg.count("<polyline") == 1 and 'class="nbtrain-band"' in svg
    assert bandchart.band_alt("loss", series, 64) == (
        "loss across 64 ranks: at step 1000 mean 31.5, least 0, most 63")


def test_a_group_reads_its_rate_in_optimizer_steps_where_its_ranks_take_them() -> None:
    """As each rank's row (rates.format_rate): the median of the running ranks' optimizer steps
    a second where they all take them (accumulation over 4: a quarter of the loop's it/s)."""
    def wide_with(accumulating: bool) -> groups.Group:
        state = RunState(list(range(32)), title="32 ranks")
        for rank in range(32):
            state.apply(Started(rank, 100 + rank, "cpu", "host", time=0.0))
            for step in (0, 20, 40):
                steps = step // 4 if accumulating else 0
                state.apply(Progress(rank, step, 100, "train", time=step / 20, loop="train",
                                     optimizer_steps=steps))
        return groups.summarize(state).groups[0]

    assert wide_with(accumulating=True).rate == "5.0 opt steps/s"
    assert wide_with(accumulating=False).rate == "20.0 it/s"
    state = running(32)
    assert "it/s" in wide_html(state) and "opt steps/s" not in wide_html(state)
