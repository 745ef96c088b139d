"""The text view's lines, driven by a RunState built from events."""

from __future__ import annotations

import io
import time

from nbtrain.display.formatting import format_rank
from nbtrain.display.runstate import RunState
from nbtrain.display.text import TextView
from nbtrain.kernel.options.config import OutputMode
from nbtrain.kernel.run.cellout import CellOutput
from nbtrain.shared.events import Exited, Failed, Finished, Log, Output, Progress, Started, Status


def make_view(**options) -> tuple[TextView, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    defaults = {"output": OutputMode.ALL, "show_progress": True, "live": False}
    view = TextView(**{**defaults, **options}, stdout=out, stderr=err)
    return view, out, err


def running_state(ranks=(0, 1)) -> RunState:
    state = RunState(list(ranks), title="2 ranks, fork")
    for rank in ranks:
        state.apply(Started(rank, 10 + rank, "cpu", "host", rank, time=0.0))
    return state


def test_a_rank_line_is_compact() -> None:
    state = running_state()
    state.apply(Progress(1, 30, 100, "train", time=1.0))
    state.apply(Progress(1, 40, 100, "train", time=1.8))
    state.apply(Log(1, {"loss": 0.5213}, step=40))
    assert format_rank(state.ranks[1]) == "[rank 1] train 40/100 ETA 0:05 12.5 it/s loss 0.5213"


def test_progress_lines_are_periodic_per_rank_and_only_on_change() -> None:
    view, out, _ = make_view(every=3600.0)
    state = running_state()
    state.apply(Progress(0, 1, 10, "train", time=1.0))
    view.draw(state)
    state.apply(Progress(0, 2, 10, "train", time=2.0))
    view.draw(state)  # changed, but its interval has not passed
    view.draw(state)
    assert out.getvalue().splitlines() == ["[rank 0] train 1/10"]
    view_every_draw, out2, _ = make_view(every=0.0)
    view_every_draw.draw(state)
    view_every_draw.draw(state)  # nothing changed: nothing printed
    state.apply(Progress(1, 5, 10, "train", time=2.0))
    view_every_draw.draw(state)
    assert out2.getvalue().splitlines() == [
        "[rank 0] train 2/10 ETA 0:08 1.0 it/s",
        "[rank 1] train 5/10",
    ]


def test_close_prints_each_ranks_final_line_and_the_summary() -> None:
    view, out, _ = make_view(every=3600.0)
    state = running_state()
    for rank in (0, 1):
        state.apply(Progress(rank, 10, 10, "train", time=1.0))
        state.apply(Log(rank, {"loss": 0.25}, step=10))
        state.apply(Finished(rank, None, time=2.0))
    state.finish("Done in 2.0s, 5.0 steps/s")
    view.close(state)
    assert out.getvalue().splitlines() == [
        "[rank 0] train 10/10 loss 0.25 done",
        "[rank 1] train 10/10 loss 0.25 done",
        "Done in 2.0s, 5.0 steps/s",
    ]


def test_a_failed_rank_line_names_the_failure() -> None:
    view, out, _ = make_view()
    state = running_state()
    state.apply(Progress(1, 3, 10, None, time=1.0))
    state.apply(Failed(1, "ValueError", "boom on rank 1", "tb", None, 1, False))
    state.apply(Exited(0, -15, "SIGTERM", stopped_by_launcher=True))
    state.finish("Failed after 1.0s: rank 1 raised ValueError: boom on rank 1")
    view.close(state)
    lines = out.getvalue().splitlines()
    assert "[rank 1] 3/10 failed: ValueError: boom on rank 1" in lines
    assert "[rank 0] stopped" in lines
    assert lines[-1].startswith("Failed after 1.0s")


def test_progress_off_prints_no_progress_and_no_summary() -> None:
    view, out, err = make_view(show_progress=False)
    state = running_state()
    state.apply(Progress(0, 5, 10, None))
    state.apply(Output(0, "stdout", "epoch 1"))  # the run prints output lines (cellout.py)
    state.finish("Done in 1.0s")
    view.draw(state)
    view.close(state)
    assert out.getvalue() == err.getvalue() == ""


def test_no_carriage_returns_when_not_a_terminal() -> None:
    view, out, err = make_view(every=0.0)
    state = running_state()
    for step in range(20):
        state.apply(Progress(step % 2, step, 20, "train", time=step))
        state.apply(Output(step % 2, "stdout", f"line {step}"))
        view.draw(state)
    state.finish("Done")
    view.close(state)
    assert "\r" not in out.getvalue() + err.getvalue()


def test_on_a_terminal_one_status_line_redraws_and_is_erased_before_output() -> None:
    view, out, _ = make_view(live=True)
    state = running_state()
    state.apply(Progress(0, 3, 10, None, time=1.0))
    view.draw(state)
    assert out.getvalue() == "\rr0 3/10 | r1 running"
    cells = CellOutput(OutputMode.ALL, before_write=view.erase_status, stdout=out, stderr=out)
    state.add_output_listener(cells.take)
    state.apply(Output(1, "stdout", "hello"))
    cells.flush()
    view.draw(state)
    text = out.getvalue()
    erased = text.index("hello")
    assert text[:erased].endswith("\r[rank 1] ")  # the status line was blanked first
    state.apply(Finished(0, None))
    state.apply(Finished(1, None))
    state.finish("Done in 1.0s")
    view.close(state)
    assert out.getvalue().endswith("Done in 1.0s\n")


def test_a_node_note_erases_the_status_line_and_prints_once() -> None:
    shared = io.StringIO()
    view = TextView(output=OutputMode.ALL, show_progress=True, live=True, stdout=shared,
                    stderr=shared)
    state = running_state()
    state.apply(Progress(0, 3, 10, None, time=1.0))
    view.draw(state)
    assert shared.getvalue() == "\rr0 3/10 | r1 running"
    view.note("restarting every rank (restart 1 of 2): rank 1 failed")
    view.note("restarting every rank (restart 1 of 2): rank 1 failed")  # said again: once
    blank = "\r" + " " * len("r0 3/10 | r1 running") + "\r"
    assert shared.getvalue() == (
        "\rr0 3/10 | r1 running" + blank
        + "[nbtrain] restarting every rank (restart 1 of 2): rank 1 failed\n"
    )
    view.draw(state)  # the status line comes back under the note
    assert shared.getvalue().endswith("failed\n\rr0 3/10 | r1 running")
    quiet, out, err = make_view(show_progress=False)
    quiet.note("waiting for nodes (1 of 2 joined)")
    assert out.getvalue() == err.getvalue() == ""  # progress="off": no notes either


def test_the_status_line_shows_a_ranks_note_until_it_moves_on() -> None:
    view, out, _ = make_view(live=True)
    state = running_state()
    state.apply(Progress(0, 3, 10, None, time=1.0))
    state.apply(Status(0, "rank 0 has waited 120 s in barrier"))
    view.draw(state)
    waiting = "r0 rank 0 has waited 120 s in barrier | r1 running"
    assert out.getvalue().endswith("\r" + waiting)
    state.apply(Progress(0, 4, 10, None, time=2.0))
    view.draw(state)
    moved_on = "r0 4/10 1.0 it/s ETA 0:06 | r1 running"  # (it/s from two progress events)
    assert out.getvalue().endswith("\r" + moved_on.ljust(len(waiting)))


def test_a_start_up_phase_says_what_a_rank_is_busy_with_and_for_how_long() -> None:
    """Issue 34: a rank still starting shows its phase ('importing torch'), and once it lasted
    a second, for how long, in the row's status, the status line and the text log."""
    from nbtrain.display.formatting import format_status, phase

    now = time.time()
    state = RunState([0, 1], title="2 ranks, spawn")
    state.apply(Status(0, "starting Python", time=now - 5))
    state.apply(Status(0, "importing torch", time=now - 3))
    state.apply(Status(1, "starting Python", time=now - 0.2))
    starting, quick = state.ranks[0], state.ranks[1]
    assert phase(starting, now) == "importing torch (3s)"  # timed from its own start
    assert phase(quick, now) == "starting Python"  # a quick phase: no count yet
    assert format_status(starting).startswith("importing torch (3")
    live, out, _ = make_view(live=True)
    live.draw(state)
    assert out.getvalue().startswith("\rr0 importing torch (3s) | r1 starting Python")
    log, out, _ = make_view()
    log.draw(state)
    log.draw(state)  # once per phase, and only a phase that lasted
    assert out.getvalue() == "[rank 0] importing torch (3s)\n"
    state.apply(Started(0, 10, "cpu", "host", 0))
    assert state.ranks[0].note == "" and phase(state.ranks[0]) == ""  # it moved on


def test_a_long_phase_keeps_its_seconds_and_a_failure_is_printed_whole(monkeypatch) -> None:
    """Issue 33: on a narrow terminal the status line cuts a long phase's text, never its
    seconds; the lines printed when ranks end carry a failure whole (the widget's cell may cut
    it; this text is where it can be read in full)."""
    import os

    monkeypatch.setattr(
        "shutil.get_terminal_size", lambda fallback=(80, 24): os.terminal_size((81, 24))
    )
    now = time.time()
    state = RunState([0, 1], title="2 ranks, spawn")
    forming = "forming the process group (gloo): waiting for every rank"
    state.apply(Status(0, forming, time=now - 3))
    state.apply(Status(1, "importing torch", time=now - 12))
    live, out, _ = make_view(live=True)
    live.draw(state)
    line = out.getvalue().removeprefix("\r")
    assert len(line) <= 80, line
    assert line.startswith("r0 forming the process group") and "… (3s) | " in line, line
    assert line.endswith("r1 importing torch (12s)"), line
    message = "the validation loader returned a batch of the wrong shape; " + "x" * 130
    state.apply(Failed(1, "ValueError", message, "tb", None, 1, False))
    log, out, _ = make_view()
    log.close(state)
    assert f"[rank 1] failed: ValueError: {message}" in out.getvalue().splitlines()
