"""Who am I, inside a rank: the launch context a rank's code (Accelerator, progress, log) reads.

Set by the worker for the lifetime of the user's function; None outside a launch. XLA may run
several replicas as threads of one process, so a thread-local value takes precedence.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from nbtrain.shared.events import EventSink
from nbtrain.shared.specs import RankInfo
from nbtrain.shared.stopping import StopPolicy


@dataclass(frozen=True)
class Runtime:
    info: RankInfo
    sink: EventSink
    mixed_precision: str | None = None
    in_kernel: bool = False
    stopping: StopPolicy | None = None  # checkpoint on interrupt, periodic saves, resume


class _ThreadRuntime(threading.local):
    # A class-level default makes the lookup a plain attribute read: current() is called on
    # every progress step, and getattr(..., default) on a bare local costs a caught exception.
    value: Runtime | None = None


_process_runtime: Runtime | None = None
_thread_runtime = _ThreadRuntime()


def current() -> Runtime | None:
    """The launch context of the calling rank, or None outside nbtrain launches."""
    return _thread_runtime.value or _process_runtime


@contextmanager
def activate(runtime: Runtime, *, thread_only: bool = False) -> Iterator[Runtime]:
    """Make ``runtime`` current for the duration of the block (process-wide or this thread)."""
    global _process_runtime
    if thread_only:
        previous = _thread_runtime.value
        _thread_runtime.value = runtime
        try:
            yield runtime
        finally:
            _thread_runtime.value = previous
        return
    previous_process = _process_runtime
    _process_runtime = runtime
    try:
        yield runtime
    finally:
        _process_runtime = previous_process


def end_tracker_run(error: BaseException | None = None) -> None:
    """The launch's function is over (or its warm session): finish the experiment tracker run
    it started, so what it logged is on disk before the rank reports its end; ``error``: what
    the function raised (the run is recorded as stopped or failed). The tracking module is
    looked up, not imported: a launch without trackers never loads it."""
    runs = sys.modules.get("nbtrain.accelerator.tracking.runs")
    if runs is not None:
        runs.end_launch(error)
