"""RunState: a plain per-rank model of a launch, folded from events. No drawing code here."""

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
    STOPPED = "stopped"


OUTPUT_CAP = 5000  # lines kept for display; a chatty rank cannot grow the kernel without bound


@dataclass
class RankView:
    rank: int
    status: RankStatus = RankStatus.STARTING
    device: str = ""
    host: str = ""
    pid: int | None = None
    note: str = ""
    step: int = 0
    total: int | None = None
    desc: str | None = None
    rate: float | None = None  # steps per second, smoothed
    metrics: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    failure: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    _last_progress: tuple[float, int] | None = None

    @property
    def eta(self) -> float | None:
        if self.rate and self.total is not None and self.rate > 0:
            return max(0.0, (self.total - self.step) / self.rate)
        return None


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

    def apply(self, event: Event) -> None:
        view = self.ranks.get(event.rank)
        if view is None:
            return
        self.version += 1
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
        elif isinstance(event, Output):
            self.output.append(OutputLine(self.output_count, event.rank, event.stream, event.line))
            self.output_count += 1
        elif isinstance(event, Finished):
            view.status, view.ended_at = RankStatus.DONE, event.time
            if view.total is not None:
                view.step = view.total
        elif isinstance(event, Failed):
            view.status, view.ended_at = RankStatus.FAILED, event.time
            view.failure = f"{event.type_name}: {event.message}".strip().splitlines()[0][:200]
        elif isinstance(event, Exited):
            _apply_exit(view, event)

    def finish(self, summary: str) -> None:
        self.ended_at = time.time()
        self.summary = summary
        self.version += 1

    @property
    def elapsed(self) -> float:
        return (self.ended_at or time.time()) - self.started_at

    def lines_since(self, index: int) -> list[OutputLine]:
        return [line for line in self.output if line.index >= index]


def _apply_progress(view: RankView, event: Progress) -> None:
    if event.desc is not None and event.desc != view.desc:
        view._last_progress = None  # a new bar (e.g. a new epoch): restart the rate
    if view._last_progress is not None:
        last_time, last_step = view._last_progress
        dt, ds = event.time - last_time, event.step - last_step
        if dt > 0 and ds >= 0:
            instant = ds / dt
            view.rate = instant if view.rate is None else 0.7 * view.rate + 0.3 * instant
    view._last_progress = (event.time, event.step)
    view.step, view.total, view.desc = event.step, event.total, event.desc


def _apply_log(view: RankView, event: Log) -> None:
    view.metrics.update(event.values)
    step = event.step if event.step is not None else view.step
    for name, value in event.values.items():
        series = view.history.setdefault(name, [])
        series.append((step, value))
        if len(series) > 2000:  # keep the chart light: drop every other old point
            del series[: len(series) // 2 : 2]


def _apply_exit(view: RankView, event: Exited) -> None:
    view.ended_at = view.ended_at or event.time
    if view.status in (RankStatus.DONE, RankStatus.FAILED):
        if view.status is RankStatus.DONE and event.exitcode not in (0, None):
            view.status = RankStatus.FAILED
            view.failure = f"exited with code {event.exitcode}"
        return
    if event.stopped_by_launcher:
        view.status = RankStatus.STOPPED
    else:
        view.status = RankStatus.FAILED
        view.failure = (
            f"killed by {event.signal}" if event.signal else f"exited with code {event.exitcode}"
        )
