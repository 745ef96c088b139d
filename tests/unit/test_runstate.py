"""RunState folds event sequences into a per-rank model (explicit times, no processes)."""

from __future__ import annotations

import pytest

from nbtrain.display import rankview, runstate
from nbtrain.display.formatting import format_status, format_steps
from nbtrain.display.runstate import RankStatus, RunState, Verdict
from nbtrain.shared.events import Exited, Failed, Finished, Log, Output, Progress, Started, Status


def started(rank: int, t: float = 100.0) -> Started:
    return Started(rank, pid=1000 + rank, device="cpu", host="h", local_rank=rank, time=t)


def failed(rank: int, message: str = "boom", *, collateral: bool = False, t: float = 105.0):
    return Failed(rank, "ValueError", message, "Traceback...", None, 1, collateral, time=t)


def test_ranks_start_in_starting_and_run_after_started() -> None:
    state = RunState([0, 1], title="2 ranks")
    assert [v.status for v in state.ranks.values()] == [RankStatus.STARTING] * 2
    state.apply(started(1))
    assert state.ranks[1].status is RankStatus.RUNNING
    assert (state.ranks[1].device, state.ranks[1].pid) == ("cpu", 1001)
    assert state.ranks[0].status is RankStatus.STARTING


def test_progress_sets_step_total_rate_and_eta() -> None:
    state = RunState([0])
    state.apply(started(0))
    state.apply(Progress(0, 0, 100, "train", time=100.0))
    assert state.ranks[0].rate is None  # one point gives no rate
    state.apply(Progress(0, 10, 100, "train", time=101.0))
    view = state.ranks[0]
    assert (view.step, view.total, view.desc) == (10, 100, "train")
    assert view.rate == pytest.approx(10.0)
    assert view.eta == pytest.approx(9.0)
    state.apply(Progress(0, 30, 100, "train", time=102.0))  # 20 it/s, smoothed toward it
    assert 10.0 < view.rate < 20.0
    assert view.iterations == 30


def test_a_new_loop_restarts_the_rate_and_iterations_add_up_across_loops() -> None:
    state = RunState([0])
    for step, t in ((0, 0.0), (50, 1.0), (100, 2.0)):
        state.apply(Progress(0, step, 100, "train", time=t))
    assert state.ranks[0].rate == pytest.approx(50.0)
    state.apply(Progress(0, 3, 10, "eval", time=2.5))
    view = state.ranks[0]
    assert view.rate is None and view.desc == "eval"
    state.apply(Progress(0, 10, 10, "eval", time=3.0))
    assert view.rate == pytest.approx(14.0)
    # The next epoch of the same loop: the step goes back, the count of steps goes on.
    state.apply(Progress(0, 40, 100, "train", time=4.0))
    state.apply(Progress(0, 100, 100, "train", time=5.0))
    assert view.iterations == 100 + 10 + 100


def test_logs_keep_the_latest_values_and_a_history_per_metric() -> None:
    state = RunState([0, 1])
    state.apply(Log(0, {"loss": 1.0}, step=1))
    state.apply(Log(0, {"loss": 0.5, "acc": 0.7}, step=2))
    state.apply(Log(1, {"loss": 0.9}, step=2))
    assert state.ranks[0].metrics == {"loss": 0.5, "acc": 0.7}
    assert state.ranks[0].history["loss"] == [(1, 1.0), (2, 0.5)]
    assert state.ranks[1].history == {"loss": [(2, 0.9)]}
    assert state.metrics_version == 3


def test_a_log_without_step_is_placed_at_the_ranks_step_count() -> None:
    state = RunState([0])
    state.apply(Progress(0, 0, 10, None, time=0.0))
    state.apply(Progress(0, 7, 10, None, time=1.0))
    state.apply(Log(0, {"loss": 0.3}))
    assert state.ranks[0].history["loss"] == [(7, 0.3)]


def test_history_is_thinned_but_keeps_its_newest_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rankview, "HISTORY_CAP", 100)
    state = RunState([0])
    for step in range(1000):
        state.apply(Log(0, {"loss": float(step)}, step=step))
    series = state.ranks[0].history["loss"]
    assert len(series) <= 100
    assert series[-1] == (999, 999.0)
    assert series[0][0] == 0  # the start of the curve stays
    assert [s for s, _ in series] == sorted(s for s, _ in series)


def test_finished_is_done_and_keeps_the_real_step() -> None:
    state = RunState([0])
    state.apply(started(0))
    state.apply(Progress(0, 40, 100, "train"))
    state.apply(Finished(0, None, time=110.0))
    state.apply(Exited(0, 0, None, stopped_by_launcher=False, time=110.5))
    view = state.ranks[0]
    assert view.status is RankStatus.DONE
    assert (view.step, view.total) == (40, 100)  # a loop left early is not shown as complete
    assert view.ended_at == 110.0


def test_failed_keeps_a_one_line_summary_and_survives_its_exit() -> None:
    state = RunState([0, 1])
    state.apply(started(1))
    state.apply(failed(1, "boom on rank 1\nsecond line\n" + "x" * 500))
    state.apply(Exited(1, 1, None, stopped_by_launcher=False))
    view = state.ranks[1]
    assert view.status is RankStatus.FAILED
    assert view.failure == "ValueError: boom on rank 1"
    long = RunState([0])
    long.apply(failed(0, "y" * 5000))
    assert len(long.ranks[0].failure) == 1000


def test_a_rank_that_only_lost_its_peer_shows_as_stopped() -> None:
    state = RunState([0, 1])
    state.apply(failed(0, "Connection reset by peer", collateral=True))
    # It exited by itself (code 1) after the launcher had asked every rank to stop.
    state.apply(Exited(0, 1, None, stopped_by_launcher=False, stop_requested=True))
    assert state.ranks[0].status is RankStatus.STOPPED
    # ... but one that failed on its own stays failed even when the launcher stopped it.
    state.apply(failed(1, "boom"))
    state.apply(Exited(1, -15, "SIGTERM", stopped_by_launcher=True))
    assert state.ranks[1].status is RankStatus.FAILED


@pytest.mark.parametrize(
    ("exited", "status", "failure"),
    [
        (Exited(0, -9, "SIGKILL", False), RankStatus.FAILED, "killed by SIGKILL"),
        (Exited(0, 3, None, False), RankStatus.FAILED, "exited with code 3"),
        (Exited(0, -15, "SIGTERM", True), RankStatus.STOPPED, ""),
    ],
)
def test_an_exit_without_a_report_explains_itself(exited, status, failure) -> None:
    state = RunState([0])
    state.apply(started(0))
    state.apply(exited)
    assert state.ranks[0].status is status
    assert state.ranks[0].failure == failure


def test_done_then_a_bad_exit_code_is_a_failure() -> None:
    state = RunState([0])
    state.apply(Finished(0, None))
    state.apply(Exited(0, 1, None, stopped_by_launcher=False))
    assert state.ranks[0].status is RankStatus.FAILED


def test_status_text_is_kept_as_a_note() -> None:
    state = RunState([0])
    state.apply(Status(0, "waiting for nodes (1 of 2 joined)"))
    assert state.ranks[0].note == "waiting for nodes (1 of 2 joined)"


def test_output_lines_are_numbered_capped_and_read_incrementally(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runstate, "OUTPUT_CAP", 10)
    state = RunState([0, 1])
    for i in range(4):
        state.apply(Output(i % 2, "stdout", f"line {i}"))
    assert [(o.index, o.rank, o.text) for o in state.lines_since(2)] == [
        (2, 0, "line 2"),
        (3, 1, "line 3"),
    ]
    assert state.lines_since(4) == []
    for i in range(4, 25):
        state.apply(Output(0, "stderr", f"line {i}"))
    kept = state.lines_since(0)  # the oldest were dropped; their indices tell how many
    assert [o.index for o in kept] == list(range(15, 25))
    assert state.lines_since(20)[0].text == "line 20"
    assert state.output_count == 25


def test_versions_tell_views_what_changed() -> None:
    state = RunState([0, 1])
    before = state.version
    state.apply(Progress(0, 1, 10, None))
    assert state.version == before + 1
    assert (state.ranks[0].version, state.ranks[1].version) == (1, 0)
    state.apply(Output(1, "stdout", "hello"))
    assert state.ranks[1].version == 0  # output does not change a rank's row
    assert state.metrics_version == 0
    version = state.version
    state.apply(Progress(7, 1, 10, None))  # not a rank of this run
    assert state.version == version


def test_finish_sets_the_summary_and_freezes_elapsed() -> None:
    state = RunState([0])
    state.finish("Done in 1.0s")
    assert state.summary == "Done in 1.0s"
    assert state.elapsed == state.elapsed  # frozen at finish
    assert state.ended_at is not None and state.elapsed == state.ended_at - state.started_at


def test_the_summary_rate_is_the_mean_rate_of_the_ranks() -> None:
    state = RunState([0, 1])
    for rank, steps in ((0, 100), (1, 50)):
        state.apply(started(rank, t=0.0))
        state.apply(Progress(rank, 0, steps, None, time=0.0))
        state.apply(Progress(rank, steps, steps, None, time=9.0))
        state.apply(Finished(rank, None, time=10.0))
    state.started_at, state.ended_at = 0.0, 10.0
    assert state.done_summary() == f"Done in 10.0s, {(10.0 + 5.0) / 2:.1f} it/s"


def test_with_optimizer_steps_the_rates_count_optimizer_steps() -> None:
    # Gradient accumulation over 4 batches: 40 loop iterations are 10 optimizer steps.
    state = RunState([0])
    state.apply(started(0, t=0.0))
    for step in range(0, 41, 8):
        state.apply(Progress(0, step, 40, "train", time=step / 20, optimizer_steps=step // 4))
    view = state.ranks[0]
    assert view.rate == pytest.approx(20.0)
    assert view.opt_rate == pytest.approx(5.0)
    assert format_steps(view) == "train 40/40 5.0 opt steps/s"
    # An eval loop takes no optimizer steps: measured in its own items.
    state.apply(Progress(0, 0, 10, "eval", time=2.0, optimizer_steps=10))
    state.apply(Progress(0, 10, 10, "eval", time=3.0, optimizer_steps=10))
    assert view.opt_rate is None and format_steps(view) == "eval 10/10 10.0 it/s"
    state.apply(Finished(0, None, time=4.0))
    state.started_at, state.ended_at = 0.0, 4.0
    assert state.done_summary() == "Done in 4.0s, 10 optimizer steps, 2.5 opt steps/s"


def test_a_final_step_right_after_an_update_does_not_inflate_the_rate() -> None:
    state = RunState([0])
    for step, t in ((0, 0.0), (10, 0.1), (20, 0.2), (29, 0.3), (30, 0.3002)):
        state.apply(Progress(0, step, 30, "train", time=t))
    assert state.ranks[0].rate == pytest.approx(100.0, rel=0.1)


def test_the_done_summary_gives_wall_time_and_the_run_step_rate() -> None:
    state = RunState([0, 1])
    for rank in (0, 1):
        state.apply(started(rank, t=0.0))
        state.apply(Progress(rank, 0, 40, None, time=0.0))
        state.apply(Progress(rank, 40, 40, None, time=3.9))
        state.apply(Finished(rank, None, time=4.0))
    state.started_at, state.ended_at = 0.0, 4.5
    assert state.done_summary() == "Done in 4.5s, 10.0 it/s"
    epochs = RunState([0])
    epochs.apply(started(0, t=0.0))
    epochs.apply(Progress(0, 0, 3, "epoch", time=0.0))
    epochs.apply(Progress(0, 3, 3, "epoch", time=1.0))
    epochs.started_at, epochs.ended_at = 0.0, 1.5
    # An epoch loop's items are epochs: said, not called optimizer steps
    assert epochs.done_summary() == "Done in 1.5s, 2.0 it/s (epoch)"
    quiet = RunState([0])
    quiet.started_at, quiet.ended_at = 0.0, 2.0
    assert quiet.done_summary() == "Done in 2.0s"  # no progress reported: no rate


def test_a_note_shows_while_it_holds_and_clears_when_the_rank_moves_on() -> None:
    state = RunState([0, 1])
    for rank in (0, 1):
        state.apply(Status(rank, "all 2 nodes joined; starting ranks"))
    assert format_status(state.ranks[0]) == "all 2 nodes joined; starting ranks"
    state.apply(started(0))
    assert format_status(state.ranks[0]) == "running"  # the rank started: the note is stale
    assert format_status(state.ranks[1]) == "all 2 nodes joined; starting ranks"
    state.apply(Progress(0, 5, 100, "train", time=101.0))
    state.apply(Status(0, "rank 0 has waited 120 s in barrier (peers: rank 1)"))
    assert format_status(state.ranks[0]).startswith("rank 0 has waited 120 s in barrier")
    state.apply(Progress(0, 6, 100, "train", time=102.0))  # the wait ended
    assert format_status(state.ranks[0]) == "running"
    state.apply(started(1))
    state.apply(Status(1, "rank 1 has waited 120 s in barrier"))
    state.apply(Log(1, {"loss": 0.5}))  # a rank that logs without progress() moved on too
    assert format_status(state.ranks[1]) == "running"


def test_a_restart_starts_every_rank_afresh_but_keeps_its_metric_history() -> None:
    state = RunState([0, 1])
    for rank in (0, 1):
        state.apply(started(rank, t=0.0))
        state.apply(Progress(rank, 0, 100, "train", time=0.0))
        state.apply(Progress(rank, 40, 100, "train", time=1.0))
        state.apply(Log(rank, {"loss": 0.5}, step=40))
    state.apply(failed(1, "boom", t=2.0))
    state.apply(Exited(1, 1, None, stopped_by_launcher=False, time=2.0))
    state.apply(Exited(0, -15, "SIGTERM", stopped_by_launcher=True, time=2.1))
    state.restart()
    state.apply(Status(0, "restarting every rank (restart 1 of 2): rank 1 failed"))
    for rank in (0, 1):
        view = state.ranks[rank]
        assert view.status is RankStatus.STARTING and view.failure == ""
        assert (view.step, view.total, view.rate, view.ended_at) == (0, None, None, None)
        assert view.history["loss"] == [(40, 0.5)]  # the chart spans attempts
    assert format_status(state.ranks[0]).startswith("restarting every rank")
    for rank in (0, 1):
        state.apply(started(rank, t=3.0))
        state.apply(Progress(rank, 10, 100, "train", time=4.0))
    assert [format_status(v) for v in state.ranks.values()] == ["running", "running"]
    assert state.ranks[1].step == 10 and state.ranks[1].iterations == 10


def test_started_after_a_rank_ended_is_a_new_attempt_even_without_restart() -> None:
    state = RunState([0])
    state.apply(started(0, t=0.0))
    state.apply(Progress(0, 0, 100, "train", time=0.0))
    state.apply(Progress(0, 30, 100, "train", time=1.0))
    state.apply(failed(0, "boom", t=2.0))
    state.apply(Exited(0, 1, None, stopped_by_launcher=False, time=2.0))
    state.apply(started(0, t=5.0))
    view = state.ranks[0]
    assert view.status is RankStatus.RUNNING and format_status(view) == "running"
    assert (view.failure, view.ended_at, view.step, view.rate) == ("", None, 0, None)
    assert view.started_at == 5.0


@pytest.mark.parametrize(
    ("ending", "told", "verdict", "succeeded"),
    [
        ("done", None, Verdict.SUCCEEDED, True),
        ("failed", None, Verdict.FAILED, False),
        ("stopped", None, Verdict.STOPPED, False),  # an interrupt: nothing failed
        ("stopped", Verdict.TIMED_OUT, Verdict.TIMED_OUT, False),
        ("stopped", Verdict.FAILED, Verdict.FAILED, False),  # a rank on another node failed
        ("stopped", Verdict.SUCCEEDED, Verdict.SUCCEEDED, False),  # not every rank is done
    ],
)
def test_finish_records_the_verdict_told_or_what_the_ranks_show(
    ending, told, verdict, succeeded
) -> None:
    state = RunState([0, 1])
    state.apply(Finished(0, None))
    if ending == "done":
        state.apply(Finished(1, None))
    elif ending == "failed":
        state.apply(failed(1))
    else:
        state.apply(Exited(1, -15, "SIGTERM", stopped_by_launcher=True))
    state.finish("summary", told)
    assert state.verdict is verdict
    assert state.succeeded is succeeded


def test_the_rate_runs_on_across_epochs_of_the_same_loop() -> None:
    # Epochs of 10 steps in 0.125 s (80 it/s): most coalesced updates (every 0.1 s) land in
    # the next epoch, whose description differs ("epoch 2/8 · train"); the rank names its loop.
    state = RunState([0])
    for update in range(6):
        t = 0.1 * update
        epoch, step = divmod(round(t * 80), 10)
        state.apply(Progress(0, step, 10, f"epoch {epoch + 1}/8 · train", time=t, loop="train"))
    assert state.ranks[0].desc == "epoch 5/8 · train"
    assert state.ranks[0].rate == pytest.approx(80.0, rel=0.1)
    state.apply(Progress(0, 1, 4, "epoch 6/8 · eval", time=0.6, loop="eval"))
    assert state.ranks[0].rate is None  # another loop: its speed is not known yet


def test_an_output_listener_gets_every_line_even_beyond_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runstate, "OUTPUT_CAP", 10)
    state = RunState([0])
    heard: list[str] = []
    state.add_output_listener(lambda line: heard.append(line.text))
    for i in range(25):
        state.apply(Output(0, "stdout", f"line {i}"))
    assert heard == [f"line {i}" for i in range(25)]
    assert len(state.lines_since(0)) == 10  # the deque (for the widget) stays capped


def test_an_interrupted_run_shows_its_keyboardinterrupts_as_interrupted_not_failed() -> None:
    # Warm ranks: Ctrl-C raises KeyboardInterrupt in the cell's code on every rank; the ranks
    # stay idle with their state, so nothing failed.
    state = RunState([0, 1, 2])
    for rank in (0, 1, 2):
        state.apply(Started(rank, 1, "cpu", "h", rank))
    state.apply(Failed(0, "KeyboardInterrupt", "", "tb", None, 1, False))
    state.apply(Failed(1, "KeyboardInterrupt", "", "tb", None, 1, False))
    state.apply(Failed(2, "ValueError", "bad", "tb", None, 1, False))
    state.finish("Interrupted after 1.0s: every rank is idle again, its state kept",
                 Verdict.STOPPED)
    assert [(v.status, v.stopped_as) for v in state.ranks.values()] == [
        (RankStatus.STOPPED, "interrupted"), (RankStatus.STOPPED, "interrupted"),
        (RankStatus.FAILED, ""),  # a real failure stays one
    ]
    assert format_status(state.ranks[0]) == "interrupted"


def test_a_rank_killed_without_a_word_shows_its_step_as_a_lower_bound() -> None:
    from nbtrain.display.formatting import format_steps

    state = RunState([0, 1])
    for rank in (0, 1):
        state.apply(Started(rank, 1, "cpu", "h", rank))
        state.apply(Progress(rank, 18, 100, "train"))
    state.apply(Exited(0, -9, "SIGKILL", stopped_by_launcher=False))
    assert format_steps(state.ranks[0]) == "train ≥18/100"  # it may have reached step 20
    assert format_status(state.ranks[0]) == "failed: killed by SIGKILL"
    state.apply(Failed(1, "ValueError", "bad", "tb", None, 1, False))
    assert format_steps(state.ranks[1]) == "train 18/100"  # it said where it was


def test_the_rank_the_others_wait_for_is_marked_until_it_moves_on():
    from nbtrain.display.rows import HOLDING_UP_COLOR, row_cells

    state = RunState([0, 1])
    for rank in (0, 1):
        state.apply(started(rank, 1.0))
    state.mark_waits({1: ("the others wait for it (Cell In[5], line 7)", True),
                      0: ("waiting in wait_for_everyone() for rank 1", False)})
    held = row_cells(state.ranks[1])
    assert held.status == "the others wait for it (Cell In[5], line 7)"
    assert (held.status_color, held.bar_style) == (HOLDING_UP_COLOR, "warning")
    assert row_cells(state.ranks[0]).bar_style == ""
    state.apply(Progress(1, 1, 10))
    moved = row_cells(state.ranks[1])
    assert (moved.status, moved.bar_style, moved.status_color) == ("running", "", None)


def test_one_press_of_stop_says_one_word_on_every_row() -> None:
    # Rank 1 raised KeyboardInterrupt; rank 0 was stopped by the launcher before it could:
    # both rows say "interrupted", not "stopped" beside "interrupted".
    state = RunState([0, 1])
    for rank in (0, 1):
        state.apply(started(rank))
    state.apply(Failed(1, "KeyboardInterrupt", "", "tb", None, 1, False))
    state.apply(Exited(0, -15, "SIGTERM", stopped_by_launcher=True))
    state.finish("Interrupted after 1.0s", Verdict.STOPPED)
    assert [format_status(view) for view in state.ranks.values()] == ["interrupted"] * 2
