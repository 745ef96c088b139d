"""progress() and log() in one process: the events a rank would send, and the text fallback.

The sink here records what the rank side hands to its transport (the pipe in a real rank);
tests/multiprocess/test_reporting_ranks.py checks the same through real ranks.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from nbtrain.rank import reporter, runtime, textbar
from nbtrain.rank.reporting import log, open_bar, progress
from nbtrain.rank.runtime import RankInfo, Runtime
from nbtrain.shared.events import Event, Log, Progress


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def send(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


class PipeSink(RecordingSink):
    """Like a rank's pipe with room to spare: offered updates are taken."""

    def try_send(self, event: Event) -> bool:
        self.send(event)
        return True


class FullPipeSink(RecordingSink):
    """A sink whose pipe is full for anything that may wait: only sure sends get through."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def try_send(self, event: Event) -> bool:
        self.refused += 1
        return False


class SlowKernelSink(RecordingSink):
    """Takes an offered update only every third time, like a pipe the kernel drains slowly."""

    def __init__(self) -> None:
        super().__init__()
        self.offers = 0

    def try_send(self, event: Event) -> bool:
        self.offers += 1
        if self.offers % 3:
            return False
        self.send(event)
        return True


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    recording = RecordingSink()
    with runtime.activate(Runtime(RankInfo(3, 1, 4, 2), recording)):
        yield recording


def test_progress_yields_every_item_and_sends_the_first_and_final_step(sink) -> None:
    assert list(progress(range(5000), desc="train")) == list(range(5000))
    steps = sink.of(Progress)
    assert steps[0] == Progress(3, 0, 5000, "train", time=steps[0].time, loop="train")
    assert (steps[-1].step, steps[-1].total, steps[-1].desc) == (5000, 5000, "train")
    assert all(e.rank == 3 for e in steps)


def test_updates_are_coalesced_to_about_ten_per_second(sink) -> None:
    start = time.monotonic()
    for _ in progress(range(400)):
        time.sleep(0.002)
    elapsed = time.monotonic() - start
    steps = [e.step for e in sink.of(Progress)]
    assert len(steps) <= elapsed / reporter.INTERVAL + 2
    assert len(steps) >= 3  # the first, some in between, the last
    assert steps == sorted(steps) and steps[-1] == 400


def test_total_comes_from_len_or_from_the_end_of_the_loop(sink) -> None:
    list(progress(x for x in range(7)))
    first, last = sink.of(Progress)[0], sink.of(Progress)[-1]
    assert first.total is None
    assert (last.step, last.total) == (7, 7)  # a finished loop of unknown length fills its bar
    list(progress([1, 2, 3], total=10))
    assert (sink.of(Progress)[-1].step, sink.of(Progress)[-1].total) == (3, 10)


def test_a_loop_left_early_reports_where_it_stopped(sink) -> None:
    for i in progress(range(100)):
        if i == 41:
            break
    last = sink.of(Progress)[-1]
    assert (last.step, last.total) == (41, 100)


def test_a_failing_loop_reports_its_last_step_and_lets_the_error_through(sink) -> None:
    with pytest.raises(ZeroDivisionError):
        for i in progress(range(100)):
            if i == 9:
                1 / 0  # noqa: B018
    assert sink.of(Progress)[-1].step == 9


def test_nested_loops_show_the_outer_position_in_the_description(sink) -> None:
    for _epoch in progress(range(2), desc="epoch"):
        for _ in progress(range(3), desc="train"):
            time.sleep(0.06)  # some updates become due inside the inner loop
    descs = [e.desc for e in sink.of(Progress)]
    assert "epoch 1/2 · train" in descs and "epoch 2/2 · train" in descs
    # The outer loops' position as data, for the whole run's ETA: (passes done, total).
    inner = [e for e in sink.of(Progress) if e.loop == "train"]
    assert {e.outer for e in inner} == {((0, 2),), ((1, 2),)}
    last = sink.of(Progress)[-1]
    assert (last.step, last.total, last.desc) == (2, 2, "epoch")


def test_a_failure_inside_nested_loops_reports_the_step_it_failed_at(sink) -> None:
    def train() -> None:
        for epoch in progress(range(3), desc="epoch"):
            for batch in progress(range(20), desc="batch"):
                if (epoch, batch) == (1, 5):
                    raise ValueError("boom")

    with pytest.raises(ValueError):
        train()
    last = sink.of(Progress)[-1]
    assert (last.step, last.total, last.desc) == (5, 20, "epoch 2/3 · batch")
    assert last.outer == ((1, 3),)


def test_a_break_shows_where_the_inner_loop_stopped_until_the_outer_moves_on(sink) -> None:
    for _epoch in progress(range(2), desc="epoch"):
        for batch in progress(range(20), desc="batch"):
            if batch == 4:
                break
        time.sleep(0.12)
        reporter.flush()
        assert sink.of(Progress)[-1].desc.endswith("· batch")  # not 'epoch' 0/2
    last = sink.of(Progress)[-1]
    assert (last.step, last.total, last.desc) == (2, 2, "epoch")


def _points(logs: list[Log], name: str) -> list[tuple[int, float]]:
    """Every (step, value) of ``name`` the events carry, in order (as the kernel charts them)."""
    return [(step, values[name]) for event in logs
            for step, values in (*event.earlier, (event.step, event.values)) if name in values]


def test_logs_in_a_loop_are_coalesced_and_the_last_values_arrive(sink) -> None:
    for i in progress(range(2000)):
        log({"loss": float(i), "lr": 0.1})
    logs = sink.of(Log)
    assert len(logs) <= 2000 // reporter.POINTS_PER_LOG + 50  # batched, not one per step
    last = {}
    for event in logs:
        last.update(event.values)
    assert last == {"loss": 1999.0, "lr": 0.1}
    assert logs[-1].step == 2000  # the step running when it was logged (the 2000th)
    assert logs[0].values == {"loss": 0.0, "lr": 0.1}  # first values at once: charts start there


def test_every_logged_point_arrives_however_updates_are_coalesced(sink) -> None:
    # Notebook 01's pattern: a few logs inside a fast loop, several within one update interval.
    for i in progress(range(400)):
        if i % 50 == 0:
            log({"loss": 1.0 / (i + 1)})
    assert _points(sink.of(Log), "loss") == [(i + 1, 1.0 / (i + 1)) for i in range(0, 400, 50)]


def test_points_held_for_a_slow_kernel_arrive_in_order() -> None:
    slow = SlowKernelSink()
    with runtime.activate(Runtime(RankInfo(0, 0, 1, 1), slow)):
        for i in progress(range(300)):
            time.sleep(0.001)
            log({"loss": float(i)})
            if i % 3 == 0:
                log({"acc": float(i)})  # another metric at the same step: one point of both
    logs = slow.of(Log)
    assert _points(logs, "loss") == [(i + 1, float(i)) for i in range(300)]
    assert _points(logs, "acc") == [(i + 1, float(i)) for i in range(0, 300, 3)]


@pytest.fixture
def pipe() -> Iterator[PipeSink]:
    recording = PipeSink()
    with runtime.activate(Runtime(RankInfo(3, 1, 4, 2), recording)):
        yield recording


def test_logs_outside_a_loop_are_coalesced_and_the_final_values_arrive(pipe) -> None:
    log({"val_acc": 0.9}, step=12)
    assert pipe.events == [Log(3, {"val_acc": 0.9}, 12, time=pipe.events[0].time)]  # at once
    start = time.monotonic()
    for step in range(2000):  # raw DDP code: log() every step, no progress()
        log({"loss": float(step), "lr": 0.1}, step=step)
        if step == 1000:
            log({"grad_norm": 2.0})  # a new metric goes out at once, even mid-interval
            assert pipe.of(Log)[-1].values["grad_norm"] == 2.0
    elapsed = time.monotonic() - start
    batches = 2000 // reporter.POINTS_PER_LOG
    assert len(pipe.of(Log)) <= elapsed / reporter.INTERVAL + batches + 4  # not 2000
    reporter.flush()  # what the worker does before it reports the rank's end
    last: dict[str, float] = {}
    for event in pipe.of(Log):
        last.update(event.values)
    assert last == {"val_acc": 0.9, "loss": 1999.0, "lr": 0.1, "grad_norm": 2.0}
    assert pipe.of(Log)[-1].step == 1999
    count = len(pipe.events)
    reporter.flush()
    assert len(pipe.events) == count  # nothing held: nothing sent twice


def test_a_repeat_after_the_interval_goes_out_without_a_flush(pipe) -> None:
    log({"loss": 1.0})
    log({"loss": 0.9})  # within the interval: held
    assert [e.values for e in pipe.of(Log)] == [{"loss": 1.0}]
    time.sleep(reporter.INTERVAL * 1.5)
    log({"loss": 0.8})
    assert pipe.of(Log)[-1].values == {"loss": 0.8}


def test_logs_outside_a_loop_never_block_on_a_full_pipe() -> None:
    full = FullPipeSink()
    with runtime.activate(Runtime(RankInfo(0, 0, 1, 1), full)):
        for step in range(200):
            log({"loss": float(step)})
        assert full.events == [] and full.refused >= 1  # only offered, never a blocking send
        reporter.flush()
    assert full.of(Log)[-1].values == {"loss": 199.0}


def test_in_the_kernels_process_logs_go_out_at_once(sink) -> None:
    # num_processes=1: the sink is a call into the kernel (no pipe, nothing to coalesce for).
    log({"val_acc": 0.9}, step=12)
    log({"val_acc": 0.8}, step=13)
    assert [(e.values, e.step) for e in sink.of(Log)] == [({"val_acc": 0.9}, 12),
                                                          ({"val_acc": 0.8}, 13)]


def test_a_forked_child_sends_its_logs_at_once(pipe, monkeypatch) -> None:
    # A DataLoader worker logging: nothing flushes the child before it exits.
    # The parent's coalescing interval outlasts any delay of a loaded machine (fork, wait).
    monkeypatch.setattr(reporter, "INTERVAL", 600.0)
    log({"loss": 1.0})
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            log({"loss": 0.5})
            log({"loss": 0.25})
            sent = [e.values["loss"] for e in pipe.of(Log)]
            os.write(write_end, repr(sent).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        sent_in_child = reader.read()
    os.waitpid(pid, 0)
    assert sent_in_child == "[1.0, 0.5, 0.25]"
    log({"loss": 0.75})  # the rank itself still coalesces
    assert [e.values["loss"] for e in pipe.of(Log)] == [1.0]


def test_default_step_counts_loop_steps_or_log_calls(sink) -> None:
    log({"a": 1.0})
    log({"a": 2.0})
    # No progress() yet: the call count, 1-based as a loop's steps (and TensorBoard's)
    assert [e.step for e in sink.of(Log)] == [1, 2]
    for _epoch in progress(range(2)):
        for _ in progress(range(5)):
            pass
    log({"b": 3.0})
    assert sink.of(Log)[-1].step == 10  # only the inner (leaf) loop's steps count


def test_tensor_and_numpy_values_are_accepted(sink) -> None:
    log({"t": torch.tensor(0.25), "n": np.float32(0.5), "i": 3})
    assert sink.of(Log)[-1].values == {"t": 0.25, "n": 0.5, "i": 3.0}


def test_a_full_pipe_never_blocks_the_loop_but_the_end_still_arrives() -> None:
    full = FullPipeSink()
    with runtime.activate(Runtime(RankInfo(0, 0, 1, 1), full)):
        for i in progress(range(300)):
            time.sleep(0.001)
            log({"loss": float(i)})
    assert full.refused >= 2  # intermediate updates were offered and held back
    steps = full.of(Progress)
    assert [(e.step, e.total) for e in steps] == [(300, 300)]  # only the sure final send
    assert full.of(Log)[-1].values == {"loss": 299.0}


def test_a_slow_kernel_gets_fewer_updates_and_still_the_latest_state() -> None:
    slow = SlowKernelSink()
    with runtime.activate(Runtime(RankInfo(0, 0, 1, 1), slow)):
        for i in progress(range(500)):
            time.sleep(0.001)
            log({"loss": float(i)})
    steps = [e.step for e in slow.of(Progress)]
    assert steps == sorted(steps) and steps[-1] == 500 and len(steps) >= 2
    losses = [value for _, value in _points(slow.of(Log), "loss")]
    assert losses == [float(i) for i in range(500)]  # held-back values are not lost


def test_open_bar_is_driven_by_explicit_steps(sink) -> None:
    bar = open_bar(total=50, desc="train")
    for step in range(1, 51):
        bar.update_to(step)
    bar.close(complete=True)
    bar.close(complete=True)  # closing twice is harmless
    last = sink.of(Progress)[-1]
    assert (last.step, last.total, last.desc) == (50, 50, "train")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: log("loss"), "must be a dict"),
        (lambda: log({"loss": "high"}), "'loss' must be a number"),
        (lambda: log({"w": torch.ones(3)}), "one-element tensor"),
        (lambda: log({1: 2.0}), "names must be strings"),
        (lambda: log({"a": 1.0}, step=1.5), "step=1.5"),
        (lambda: progress(range(3), total=-1), "total=-1"),
        (lambda: progress(range(3), desc=5), "desc=5"),
    ],
)
def test_bad_arguments_say_what_to_pass(call, message) -> None:
    with pytest.raises(TypeError, match=message):
        call()


# -- outside a launch ----------------------------------------------------------------------------


def test_outside_a_launch_progress_draws_a_text_bar(capsys) -> None:
    assert runtime.current() is None
    assert list(progress(range(4), desc="train")) == [0, 1, 2, 3]
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("train: 4/4 [####################] 100%")
    assert "\r" not in err  # captured stderr is no terminal: plain lines only


def test_outside_a_launch_log_prints_or_joins_the_running_bar(capsys) -> None:
    log({"loss": 0.123456}, step=3)
    assert capsys.readouterr().out == "step 3: loss 0.1235\n"
    for i in progress(range(3), desc="fit"):
        log({"loss": float(i)})
    captured = capsys.readouterr()
    assert captured.out == ""  # shown in the bar instead of one line per step
    assert captured.err.strip().endswith("loss 2")


def test_text_bar_redraws_in_place_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = textbar.TextBar(3, "t", stream=stream)
    bar.update_to(3)
    bar.close(complete=True)
    text = stream.getvalue()
    assert text.startswith("\rt: 0/3") and text.endswith("\n") and text.count("\n") == 1


def test_a_loss_logged_in_step_n_is_charted_at_step_n_like_the_summary_counts(sink) -> None:
    for _epoch in progress(range(2)):
        for _batch in progress(range(127)):
            log({"loss": 1.0})  # inside the step that is running: steps 1..254
        log({"val": 0.5})  # after the epoch's batches: the steps done so far
    losses = _points(sink.of(Log), "loss")
    assert losses[0][0] == 1 and losses[-1][0] == 254
    assert [step for step, _ in _points(sink.of(Log), "val")] == [127, 254]
    assert sink.of(Progress)[-1].step == 2  # the outer loop's end; the inner one ended at 127


# -- wide runs (issue 44): fewer updates and points as the world grows --------------------------


def test_the_update_interval_grows_with_the_world_size_within_its_bounds() -> None:
    assert reporter.update_interval(2) == reporter.INTERVAL
    assert reporter.update_interval(10) == reporter.INTERVAL
    assert reporter.update_interval(64) == pytest.approx(64 / reporter.RUN_UPDATES)
    assert reporter.update_interval(100_000) == reporter.MAX_INTERVAL
    # the whole run's update rate stays flat past the narrow runs
    assert 64 / reporter.update_interval(64) == pytest.approx(256 / reporter.update_interval(256))


def test_thinning_keeps_every_point_of_a_narrow_run_and_the_ends_of_a_wide_one() -> None:
    points = [(step, {"loss": float(step)}) for step in range(1, 41)]
    assert reporter.thin_points(points, 16) == points
    kept = reporter.thin_points(points, 64)
    assert len(kept) == reporter.WIDE_POINTS
    assert kept[0] == (1, {"loss": 1.0}) and kept[-1] == (40, {"loss": 40.0})
    assert [step for step, _ in kept] == sorted(step for step, _ in kept)


def test_a_metric_logged_only_at_a_thinned_step_rides_with_the_next_kept_one() -> None:
    points = [(step, {"loss": float(step)}) for step in range(1, 41)]
    points[4][1]["eval_loss"] = 0.5  # step 5: left out by the thinning
    kept = reporter.thin_points(points, 64)
    assert 5 not in [step for step, _ in kept]
    assert [values["eval_loss"] for _, values in kept if "eval_loss" in values] == [0.5]


def test_a_rank_of_a_wide_run_sends_fewer_updates_but_its_first_and_last_step() -> None:
    recording = PipeSink()
    with runtime.activate(Runtime(RankInfo(3, 1, 64, 2), recording)):
        start = time.monotonic()
        for step in progress(range(300), desc="train"):
            log({"loss": 1.0 / (step + 1)})
            time.sleep(0.002)
        elapsed = time.monotonic() - start
    interval = reporter.update_interval(64)
    steps = [e.step for e in recording.of(Progress)]
    assert steps[0] == 0 and steps[-1] == 300
    assert len(steps) <= elapsed / interval + 3
    logged = [(log_.step, log_.values) for log_ in recording.of(Log)]
    points = [p for log_ in recording.of(Log) for p in (*log_.earlier, (log_.step, log_.values))]
    assert points[0] == (1, {"loss": 1.0})  # a chart starts at its first point
    assert points[-1] == (300, {"loss": 1.0 / 300})  # and ends at the last
    assert len(points) < 300 and logged
