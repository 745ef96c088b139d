"""nbtrain.Run's bookkeeping without processes: devices claimed, metrics kept, lines bounded,
the registry's bound, stop's checks (the real runs: tests/kernel/test_background_kernel.py)."""

from __future__ import annotations

import gc
import threading
import traceback
import weakref
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from nbtrain.display.runstate import OutputLine
from nbtrain.kernel.run import handle, registry
from nbtrain.shared.errors import WorkerError
from nbtrain.shared.events import Log


def options(**config: object) -> SimpleNamespace:
    base = {"gpu_ids": None, "xla_device": "", "num_processes": 2, "stopping": None}
    return SimpleNamespace(
        config=SimpleNamespace(**(base | config)), requested=SimpleNamespace(cluster=None)
    )


def test_claims(monkeypatch):
    monkeypatch.setattr(registry, "gpu_count", lambda: 0)
    assert registry.claims(options()) == frozenset()  # CPU ranks hold nothing
    monkeypatch.setattr(registry, "gpu_count", lambda: 8)
    assert registry.claims(options()) == {"GPU 0", "GPU 1"}
    assert registry.claims(options(gpu_ids=(3,))) == {"GPU 3"}
    assert registry.claims(options(xla_device="TPU")) == {"the TPU cores"}
    ray = options()
    ray.requested.cluster = "ray"
    assert registry.claims(ray) == {"the Ray cluster's placement"}


def finished(name: str, value: object = None) -> handle.Run:
    run = handle.Run(name, lambda: value, background=True)
    run.pane = None  # (no display outside a kernel anyway)
    run.start()
    assert run._thread is not None
    run._thread.join(10)
    return run


def test_metrics_keep_every_point_with_its_step():
    run = handle.Run("m", lambda: None, background=False)
    run.record(Log(0, {"loss": 2.0}, step=5, earlier=((3, {"loss": 3.0}), (4, {"loss": 2.5}))))
    run.record(Log(1, {"loss": 1.0, "lr": 0.1}, step=5))
    assert [(m.rank, m.step, m.name, m.value) for m in run.metrics] == [
        (0, 3, "loss", 3.0), (0, 4, "loss", 2.5), (0, 5, "loss", 2.0),
        (1, 5, "loss", 1.0), (1, 5, "lr", 0.1),
    ]
    assert run.metrics.records()[0] == {"rank": 0, "step": 3, "name": "loss", "value": 3.0}
    pandas = pytest.importorskip("pandas")
    table = run.metrics.to_pandas()
    assert isinstance(table, pandas.DataFrame) and list(table.columns) == [
        "rank", "step", "name", "value"
    ]


def test_lines_are_bounded_oldest_first(monkeypatch):
    monkeypatch.setattr(handle, "KEPT_LINES", 100)
    run = handle.Run("l", lambda: None, background=False)
    for i in range(150):
        run._keep_line(OutputLine(i, i % 2, "stdout", f"line {i}"))
    run._keep_line(OutputLine(999, 0, "stdout", "asked for", aside=True))  # never kept
    kept = run.output()
    # full at 100: the oldest tenth goes, at lines 100, 110, 120, 130 and 140
    assert len(kept) == 100 and run.lines_dropped == 50
    assert kept[-1] == "[rank 1] line 149" and kept[0] == "[rank 0] line 50"
    assert run.output(1)[-1] == "[rank 1] line 149"


def test_value_error_and_status():
    assert finished("ok", 5).wait() == 5
    run = handle.Run("bad", lambda: 1 / 0, background=True)
    run.pane = None
    run.start()
    with pytest.raises(ZeroDivisionError):
        run.wait(timeout=10)
    assert run.status == "failed"
    waiting = threading.Event()
    slow = handle.Run("slow", waiting.wait, background=True)
    slow.pane = None
    slow.start()
    with pytest.raises(TimeoutError, match="still running"):
        slow.wait(timeout=0.1)
    waiting.set()
    assert slow.wait(timeout=10) is True and slow.status == "done"


def test_stop_with_a_checkpoint_needs_on_interrupt():
    policy = SimpleNamespace(on_interrupt=False)
    run = handle.Run("s", lambda: None, background=True, stopping=policy)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_interrupt='checkpoint'"):
        run.stop(checkpoint=True)
    run.stop()  # at once: always possible (with on_interrupt: the kernel tests)
    assert run._stop == "now"


def test_the_registry_keeps_the_newest_finished_runs(monkeypatch):
    monkeypatch.setattr(registry, "_runs", [])
    monkeypatch.setattr(registry, "KEPT_RUNS", 3)
    for i in range(5):
        run = handle.Run(f"r{i}", lambda: None, background=False)
        registry.begin(run, block=True)
    assert [run.name for run in registry.runs()] == ["r2", "r3", "r4"]
    registry.runs().clear()
    assert registry.runs() == []


class Big:
    """Stands for a failed call's big local (a model, a batch)."""


def failing(seen: list[weakref.ref[Big]]) -> Callable[[], object]:
    def train() -> object:
        big = Big()
        seen.append(weakref.ref(big))
        raise WorkerError(1, type_name="ValueError", message="bad batch", remote_traceback="tb")

    return train


def test_a_failed_run_keeps_its_error_not_the_frames_of_the_failed_call(monkeypatch):
    monkeypatch.setattr(registry, "_runs", [])
    seen: list[weakref.ref[Big]] = []
    background = handle.Run("bg", failing(seen), background=True)
    background.pane = None
    background.start()
    with pytest.raises(WorkerError) as raised:
        background.wait(timeout=10)
    # wait() raises it with its traceback: every line of it still prints
    assert "in train" in "".join(traceback.format_tb(raised.value.__traceback__))
    del raised
    blocking = handle.Run("blocking", failing(seen), background=False)
    with pytest.raises(WorkerError) as raised:
        registry.begin(blocking, block=True)
    # the cell's error keeps its frames (%debug): the failing call's local is alive
    assert seen[1]() is not None
    del raised
    gc.collect()
    assert [ref() for ref in seen] == [None, None]  # both runs let go of the call's locals
    for run in (background, blocking):
        assert run.status == "failed" and isinstance(run.error, WorkerError)
        assert (run.error.rank, run.error.message, run.error.remote_traceback) == (
            1, "bad batch", "tb")
        assert "raise WorkerError(1" in run.traceback and "in train" in run.traceback
    with pytest.raises(WorkerError, match="rank 1"):
        blocking.wait()

    def waits() -> None:  # a caller's frame, with a big local of its own
        mine = Big()
        seen.append(weakref.ref(mine))
        background.wait()

    with pytest.raises(WorkerError) as raised:
        waits()
    assert raised.value is not background.error  # (a copy: the run's keeps no caller frame)
    del raised
    gc.collect()
    assert seen[2]() is None
