"""One rank's row of a launch (``RankView``) and how each event of that rank changes it
(``fold``). RunState (runstate.py) holds a RankView per rank and feeds them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from nbtrain.display.rates import update_rate
from nbtrain.shared.events import (
    Event,
    Exited,
    Failed,
    Finished,
    GpuUsage,
    Log,
    Progress,
    Started,
    Status,
    Stopped,
    Strategy,
)

HISTORY_CAP = 2000  # points kept per metric and rank; older points are thinned, not dropped


class RankStatus(Enum):
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"  # ended by the launcher (a peer failed, timeout, interrupt)


@dataclass
class RankView:
    rank: int
    status: RankStatus = RankStatus.STARTING
    device: str = ""
    strategy: str = ""  # e.g. 'fsdp2' (a Strategy event); '' for plain data parallelism
    gpu: str = ""  # 'NVIDIA H100 80GB HBM3 · 3.1 GiB' (a GpuUsage event); '' off GPUs
    host: str = ""
    pid: int | None = None
    note: str = ""  # a free-text phase from a Status event; cleared when the rank moves on
    note_at: float | None = None  # when that phase began (the view shows how long it lasts)
    # The others wait for this rank in a collective (a where-picture said so): its row is
    # marked until it moves on (a step, a metric, a new phase).
    holding_up: bool = False
    step: int = 0  # of the innermost running loop
    total: int | None = None
    desc: str | None = None
    # What identifies the running loop: its own description and length, not the outer loops'
    # position ('epoch 2/8 · train' and 'epoch 3/8 · train' are one loop).
    loop: tuple[str | None, int | None] = (None, None)
    outer: tuple[tuple[int, int | None], ...] = ()  # the enclosing loops' (done, total)
    rate: float | None = None  # the loop's items per second, smoothed (rates.py)
    # Optimizer steps per second, smoothed, in a loop that took optimizer steps; else None.
    opt_rate: float | None = None
    iterations: int = 0  # steps counted across every loop of this attempt: for it/s
    optimizer_steps: int = 0  # taken this attempt, as the rank's Accelerator reports them
    metrics: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    failure: str = ""  # one line: why this rank failed or was stopped
    stopped_as: str = ""  # a graceful stop: 'stopped (saved)' (the summary names the step)
    collateral: bool = False  # it failed only because a peer vanished
    # It died without a word (killed, exited): it may have run past the last step it reported.
    step_unsure: bool = False
    started_at: float | None = None  # of this attempt
    ended_at: float | None = None
    version: int = 0  # bumped whenever anything a row shows changed
    # (time, iterations, optimizer steps): where the rates' current interval began
    rate_anchor: tuple[float, int, int] | None = None

    @property
    def eta(self) -> float | None:
        if self.rate and self.total is not None and self.rate > 0:
            return max(0.0, (self.total - self.step) / self.rate)
        return None

    @property
    def finished(self) -> bool:
        return self.status in (RankStatus.DONE, RankStatus.FAILED, RankStatus.STOPPED)


def fold(view: RankView, event: Event) -> None:
    """Apply ``event`` to its rank's row (events of the run as a whole: RunState.apply)."""
    change = _ROW_CHANGES.get(type(event))
    if change is not None:
        change(view, event)


def _started(view: RankView, event: Started) -> None:
    if view.finished:
        reset_attempt(view)  # a new attempt of this rank, even if nobody said restart()
    view.status, view.device, view.host, view.pid = (
        RankStatus.RUNNING, event.device, event.host, event.pid
    )
    view.started_at, view.note, view.strategy = event.time, "", ""


def _status(view: RankView, event: Status) -> None:
    view.holding_up = False
    if event.text != view.note:
        view.note_at = event.time if event.text else None
    view.note = event.text


def _strategy(view: RankView, event: Strategy) -> None:
    view.strategy = event.name


def _gpu_usage(view: RankView, event: GpuUsage) -> None:
    view.gpu = f"{event.name} · {event.reserved / 2**30:.1f} GiB"


def _finished(view: RankView, event: Finished) -> None:
    view.status, view.ended_at = RankStatus.DONE, event.time


def _stopped(view: RankView, event: Stopped) -> None:
    view.status, view.ended_at = RankStatus.STOPPED, event.time
    view.note, view.stopped_as = "", "stopped (saved)"


def _failed(view: RankView, event: Failed) -> None:
    view.status, view.ended_at = RankStatus.FAILED, event.time
    view.failure = _one_line(f"{event.type_name}: {event.message}")
    view.collateral = event.collateral


def reset_attempt(view: RankView) -> None:
    """Forget what belonged to the rank's last attempt; keep its metrics and their history."""
    view.status, view.note, view.failure, view.collateral = RankStatus.STARTING, "", "", False
    view.stopped_as, view.step_unsure, view.holding_up = "", False, False
    view.step, view.total, view.desc, view.loop, view.outer = 0, None, None, (None, None), ()
    view.rate, view.opt_rate, view.rate_anchor = None, None, None
    view.iterations = view.optimizer_steps = 0
    view.started_at = view.ended_at = None
    view.version += 1


# A failure's first line is kept whole up to this length: the text view prints it and the row's
# tooltip shows it (the row cuts it to its width); only an absurd line is cut here.
FAILURE_CHARS = 1000


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    if not lines:
        return ""
    line = lines[0]
    return line if len(line) <= FAILURE_CHARS else line[: FAILURE_CHARS - 1] + "…"


def _apply_progress(view: RankView, event: Progress) -> None:
    key = (event.desc if event.loop is None else event.loop, event.total)
    view.optimizer_steps = event.optimizer_steps
    if key != view.loop:
        # Another loop (eval after train): its speed is not the last loop's. A resumed pass's
        # steps before its start were the first run's.
        view.iterations += max(0, event.step - event.start)
        view.rate = view.opt_rate = None
        view.rate_anchor = (event.time, view.iterations, view.optimizer_steps)
    else:
        # The same loop: the next step, or its next pass (next epoch: the step went back, or
        # the outer loops' part of the description moved on). The rate runs on across passes,
        # counted in iterations, so epochs shorter than an update interval still get one.
        if event.desc != view.desc or event.step < view.step:
            # The last pass's final steps were coalesced away: a pass normally runs to its end.
            unseen = max(0, view.total - view.step) if view.total is not None else 0
            view.iterations += unseen + event.step
        else:
            view.iterations += event.step - view.step
        update_rate(view, event.time)
    view.step, view.total, view.desc, view.loop = event.step, event.total, event.desc, key
    view.outer = event.outer
    # A note tells what a rank waits for; a step (or a metric) means it moved on.
    view.note, view.holding_up = "", False


def _apply_log(view: RankView, event: Log) -> None:
    view.note, view.holding_up = "", False  # it moved on (see _apply_progress)
    step = event.step if event.step is not None else view.iterations
    for at, values in (*event.earlier, (step, event.values)):
        view.metrics.update(values)
        for name, value in values.items():
            series = view.history.setdefault(name, [])
            series.append((at, value))
            if len(series) > HISTORY_CAP:
                # Keep the chart light: drop every other point of the older half (never the
                # first).
                del series[1 : len(series) // 2 : 2]


def _apply_exit(view: RankView, event: Exited) -> None:
    if view.ended_at is None:
        view.ended_at = event.time
    if view.status is RankStatus.STOPPED and event.exitcode == 0:
        return  # a graceful stop (a Stopped event): it saved and left by itself
    if view.status is RankStatus.DONE:
        if event.exitcode not in (0, None) and not event.stopped_by_launcher:
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
        view.status, view.step_unsure = RankStatus.FAILED, True
        view.failure = (
            f"killed by {event.signal}" if event.signal else f"exited with code {event.exitcode}"
        )


# Each kind of event of one rank and the change it makes to the rank's row.
_ROW_CHANGES: dict[type, Callable[[RankView, Any], None]] = {
    Started: _started,
    Status: _status,
    Strategy: _strategy,
    GpuUsage: _gpu_usage,
    Progress: _apply_progress,
    Log: _apply_log,
    Finished: _finished,
    Stopped: _stopped,
    Failed: _failed,
    Exited: _apply_exit,
}
