"""RunState: a plain per-rank model of a launch, folded from events. No drawing code here.

Views (display/) read it and redraw only what changed: ``RunState.version`` moves on every
change, ``RankView.version`` when that rank's row changed, ``RunState.metrics_version`` when a
metric was logged, and output lines carry a running index.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from .events import Event, Exited, Failed, Finished, Log, Output, Progress, Started, Status


class RankStatus(Enum):
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"  # ended by the launcher (a peer failed, timeout, interrupt)


OUTPUT_CAP = 5000  # lines kept for display; a chatty rank cannot grow the kernel without bound
HISTORY_CAP = 2000  # points kept per metric and rank; older points are thinned, not dropped
RATE_SMOOTHING = 0.3  # weight of the newest interval in the it/s estimate
RATE_WINDOW = 0.05  # seconds: closer updates (a loop's final step right after a periodic one)
#                     are folded into the next interval instead of giving a wild rate


@dataclass
class RankView:
    rank: int
    status: RankStatus = RankStatus.STARTING
    device: str = ""
    host: str = ""
    pid: int | None = None
    note: str = ""  # a free-text phase from a Status event
    step: int = 0  # of the innermost running loop
    total: int | None = None
    desc: str | None = None
    rate: float | None = None  # steps per second, smoothed
    iterations: int = 0  # steps counted across every loop: for the run's steps/s
    metrics: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    failure: str = ""  # one line: why this rank failed or was stopped
    collateral: bool = False  # it failed only because a peer vanished
    started_at: float | None = None
    ended_at: float | None = None
    version: int = 0  # bumped whenever anything a row shows changed
    _last_progress: tuple[float, int] | None = None

    @property
    def eta(self) -> float | None:
        if self.rate and self.total is not None and self.rate > 0:
            return max(0.0, (self.total - self.step) / self.rate)
        return None

    @property
    def finished(self) -> bool:
        return self.status in (RankStatus.DONE, RankStatus.FAILED, RankStatus.STOPPED)


@dataclass(frozen=True)
class OutputLine:
    index: int
    rank: int
    stream: str
    text: str


class RunState:
    def __init__(self, ranks: list[int], *, title: str = "") -> None:
        self.title = title
        self.ranks = {rank: RankView(rank) for rank in ranks}
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.output: deque[OutputLine] = deque(maxlen=OUTPUT_CAP)
        self.output_count = 0
        self.summary = ""
        self.version = 0  # bumped on every change, so views redraw only when needed
        self.metrics_version = 0  # bumped when a metric was logged (charts redraw on it)

    def apply(self, event: Event) -> None:
        view = self.ranks.get(event.rank)
        if view is None:
            return
        self.version += 1
        if isinstance(event, Output):
            self.output.append(OutputLine(self.output_count, event.rank, event.stream, event.line))
            self.output_count += 1
            return
        view.version += 1
        if isinstance(event, Started):
            view.status, view.device, view.host, view.pid = (
                RankStatus.RUNNING, event.device, event.host, event.pid
            )
            view.started_at = event.time
        elif isinstance(event, Status):
            view.note = event.text
        elif isinstance(event, Progress):
            _apply_progress(view, event)
        elif isinstance(event, Log):
            _apply_log(view, event)
            self.metrics_version += 1
        elif isinstance(event, Finished):
            view.status, view.ended_at = RankStatus.DONE, event.time
        elif isinstance(event, Failed):
            view.status, view.ended_at = RankStatus.FAILED, event.time
            view.failure = _one_line(f"{event.type_name}: {event.message}")
            view.collateral = event.collateral
        elif isinstance(event, Exited):
            _apply_exit(view, event)

    def finish(self, summary: str) -> None:
        self.ended_at = time.time()
        self.summary = summary
        self.version += 1

    @property
    def elapsed(self) -> float:
        return (self.ended_at or time.time()) - self.started_at

    @property
    def steps_per_second(self) -> float | None:
        """Mean over the ranks that reported progress of their steps per second of run time.

        Ranks of a data-parallel run step together, so this is the run's step rate (not the sum).
        """
        rates = [
            view.iterations / busy
            for view in self.ranks.values()
            if view.iterations and (busy := _busy_time(view, self)) > 0
        ]
        return sum(rates) / len(rates) if rates else None

    def done_summary(self) -> str:
        """The summary of a successful run: 'Done in 3.2s, 95.0 steps/s'."""
        rate = self.steps_per_second
        return f"Done in {self.elapsed:.1f}s" + (f", {rate:.1f} steps/s" if rate else "")

    def lines_since(self, index: int) -> list[OutputLine]:
        """Output lines with an index >= ``index`` that are still kept (oldest first)."""
        if not self.output or index > self.output[-1].index:
            return []
        start = max(0, index - self.output[0].index)
        return [self.output[i] for i in range(start, len(self.output))]


def _busy_time(view: RankView, state: RunState) -> float:
    start = view.started_at if view.started_at is not None else state.started_at
    end = next((t for t in (view.ended_at, state.ended_at) if t is not None), time.time())
    return end - start


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""


def _apply_progress(view: RankView, event: Progress) -> None:
    other_loop = event.desc != view.desc or event.total != view.total
    if other_loop or event.step < view.step:
        # A new loop (eval after train), or the same loop again (next epoch).
        view.iterations += event.step
        view._last_progress = (event.time, event.step)
        if other_loop:
            view.rate = None  # its speed is not the last loop's
    else:
        view.iterations += event.step - view.step
        _update_rate(view, event)
    view.step, view.total, view.desc = event.step, event.total, event.desc


def _update_rate(view: RankView, event: Progress) -> None:
    last = view._last_progress
    if last is None:
        view._last_progress = (event.time, event.step)
        return
    dt = event.time - last[0]
    if dt < RATE_WINDOW:
        return  # keep the older anchor: the next interval spans this one too
    instant = (event.step - last[1]) / dt
    view.rate = (
        instant if view.rate is None
        else (1 - RATE_SMOOTHING) * view.rate + RATE_SMOOTHING * instant
    )
    view._last_progress = (event.time, event.step)


def _apply_log(view: RankView, event: Log) -> None:
    view.metrics.update(event.values)
    step = event.step if event.step is not None else view.iterations
    for name, value in event.values.items():
        series = view.history.setdefault(name, [])
        series.append((step, value))
        if len(series) > HISTORY_CAP:
            # Keep the chart light: drop every other point of the older half (never the first).
            del series[1 : len(series) // 2 : 2]


def _apply_exit(view: RankView, event: Exited) -> None:
    if view.ended_at is None:
        view.ended_at = event.time
    if view.status is RankStatus.DONE:
        if event.exitcode not in (0, None):
            view.status = RankStatus.FAILED
            view.failure = f"exited with code {event.exitcode} after returning"
        return
    if view.status is RankStatus.FAILED:
        if view.collateral and (event.stopped_by_launcher or event.stop_requested):
            view.status = RankStatus.STOPPED  # it only reacted to another rank's failure
        return
    if event.stopped_by_launcher:
        view.status = RankStatus.STOPPED
    else:
        view.status = RankStatus.FAILED
        view.failure = (
            f"killed by {event.signal}" if event.signal else f"exited with code {event.exitcode}"
        )
