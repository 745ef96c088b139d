"""RunState: a plain per-rank model of a launch, folded from events. No drawing code here.

The kernel's launch loop (kernel/run/lifecycle.py) feeds it the ranks' events; the views
beside it in this package draw it. It lives with the views so that they import nothing of the
kernel side.

Views (display/) read it and redraw only what changed: ``RunState.version`` moves on every
change, ``RankView.version`` when that rank's row changed, ``RunState.metrics_version`` when a
metric was logged, and output lines carry a running index. A view that must see every output
line (the text view: a log must not lose lines) registers an output listener instead of reading
the capped deque.

A rank's attempt: a restart of every rank (``max_restarts``) runs the same ranks again. The
launcher says so with ``RunState.restart()``; a Started event from a rank that had ended does the
same. Either way the rank's per-attempt fields (status, note, step, rate, failure, end time) start
afresh, while its metric history and latest metrics carry over (the chart spans attempts).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from nbtrain.display.rates import summary_rate, update_rate
from nbtrain.shared.events import (
    Event,
    Exited,
    Failed,
    Finished,
    GpuUsage,
    Log,
    Output,
    Progress,
    ResumedFrom,
    Started,
    Status,
    Stopped,
    Strategy,
    Tracked,
)


class RankStatus(Enum):
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"  # ended by the launcher (a peer failed, timeout, interrupt)


class Verdict(Enum):
    """How the whole run ended, as the launcher decided it (set by ``RunState.finish``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a rank failed, here or on another node
    TIMED_OUT = "timed out"
    STOPPED = "stopped"  # interrupted or stopped from outside: nothing failed


INTERRUPTED = "KeyboardInterrupt:"  # how a Failed rank's one-line reason starts after Ctrl-C
OUTPUT_CAP = 5000  # lines kept for display; a chatty rank cannot grow the kernel without bound
HISTORY_CAP = 2000  # points kept per metric and rank; older points are thinned, not dropped


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


@dataclass(frozen=True)
class OutputLine:
    index: int
    rank: int
    stream: str
    text: str
    dump: bool = False  # a stack dump the launcher asked for (see events.Output)
    aside: bool = False  # a dump where() asked for: logged, not shown (its picture is)


OutputListener = Callable[["OutputLine"], None]


class RunState:
    def __init__(self, ranks: list[int], *, title: str = "") -> None:
        self.title = title
        self.ranks = {rank: RankView(rank) for rank in ranks}
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.output: deque[OutputLine] = deque(maxlen=OUTPUT_CAP)
        self.output_count = 0
        self.summary = ""
        self.tracked: list[str] = []  # where the trackers record the run (events.Tracked)
        self.resumed = ""  # 'resumed from checkpoint_0 (step 52)' (events.ResumedFrom)
        self.verdict: Verdict | None = None  # set by finish()
        self.version = 0  # bumped on every change, so views redraw only when needed
        self.metrics_version = 0  # bumped when a metric was logged (charts redraw on it)
        self._listeners: list[OutputListener] = []
        self._metric_listeners: list[Callable[[Log], None]] = []

    def add_output_listener(self, listener: OutputListener) -> None:
        """Call ``listener`` with every output line from now on, as it arrives (uncapped)."""
        self._listeners.append(listener)

    def add_metric_listener(self, listener: Callable[[Log], None]) -> None:
        """Call ``listener`` with every Log applied from now on (a wide view's bands)."""
        self._metric_listeners.append(listener)

    def apply(self, event: Event) -> None:
        view = self.ranks.get(event.rank)
        if view is None:
            return
        self.version += 1
        if isinstance(event, Output):
            line = OutputLine(
                self.output_count, event.rank, event.stream, event.line, event.dump,
                event.aside,
            )
            self.output.append(line)
            self.output_count += 1
            for listener in self._listeners:
                listener(line)
            return
        view.version += 1
        if isinstance(event, Started):
            if view.finished:
                _reset_attempt(view)  # a new attempt of this rank, even if nobody said restart()
            view.status, view.device, view.host, view.pid = (
                RankStatus.RUNNING, event.device, event.host, event.pid
            )
            view.started_at, view.note, view.strategy = event.time, "", ""
        elif isinstance(event, Status):
            view.holding_up = False
            if event.text != view.note:
                view.note_at = event.time if event.text else None
            view.note = event.text
        elif isinstance(event, Strategy):
            view.strategy = event.name
        elif isinstance(event, GpuUsage):
            view.gpu = f"{event.name} · {event.reserved / 2**30:.1f} GiB"
        elif isinstance(event, ResumedFrom):
            self.resumed = f"resumed from {event.source} (step {event.step})"
        elif isinstance(event, Tracked):
            if event.where not in self.tracked:
                self.tracked.append(event.where)
        elif isinstance(event, Progress):
            # A note tells what a rank waits for; a step (or a metric) means it moved on.
            view.note, view.holding_up = "", False
            _apply_progress(view, event)
        elif isinstance(event, Log):
            view.note, view.holding_up = "", False
            _apply_log(view, event)
            self.metrics_version += 1
            for metric_listener in self._metric_listeners:
                metric_listener(event)
        elif isinstance(event, Finished):
            view.status, view.ended_at = RankStatus.DONE, event.time
        elif isinstance(event, Stopped):
            view.status, view.ended_at = RankStatus.STOPPED, event.time
            view.note, view.stopped_as = "", "stopped (saved)"
        elif isinstance(event, Failed):
            view.status, view.ended_at = RankStatus.FAILED, event.time
            view.failure = _one_line(f"{event.type_name}: {event.message}")
            view.collateral = event.collateral
        elif isinstance(event, Exited):
            _apply_exit(view, event)

    def mark_waits(self, notes: Mapping[int, tuple[str, bool]]) -> None:
        """What a where-picture found, on the rows of the running ranks it names: ``notes``
        maps a rank to (its phase, whether the others wait for it). Cleared as a Status
        event's phase is, when the rank moves on."""
        now = time.time()
        for rank, (text, holding_up) in notes.items():
            view = self.ranks.get(rank)
            if view is None or view.finished:
                continue
            view.note, view.note_at, view.holding_up = text, now, holding_up
            view.version += 1
            self.version += 1

    def restart(self, ranks: Iterable[int] | None = None) -> None:
        """A new attempt of ``ranks`` (default: every rank) begins: they are starting again."""
        for rank in self.ranks if ranks is None else ranks:
            view = self.ranks.get(rank)
            if view is not None:
                _reset_attempt(view)
        self.version += 1

    def finish(self, summary: str, verdict: Verdict | None = None) -> None:
        """The run ended. ``verdict`` defaults to what the ranks show: succeeded when every rank
        is done, failed when one failed, stopped otherwise. Pass it when the ranks cannot tell:
        a timeout (TIMED_OUT), or a failure on another node or of a rank that was then stopped
        (FAILED)."""
        self.ended_at = time.time()
        recorded = "; recorded in " + ", ".join(self.tracked) if self.tracked else ""
        resumed = f"; {self.resumed}" if self.resumed else ""
        self.summary = summary + resumed + recorded
        self.verdict = verdict if verdict is not None else self._verdict_of_ranks()
        if self.verdict is not Verdict.SUCCEEDED:
            # A rank still starting or running when a run ended badly was stopped with it
            # (interrupt, timeout, a peer's failure), whether or not its exit was seen.
            for view in self.ranks.values():
                if not view.finished:
                    view.status, view.ended_at = RankStatus.STOPPED, self.ended_at
                    view.version += 1
        if self.verdict is Verdict.STOPPED:
            # The KeyboardInterrupt of an interrupted run (warm ranks raise it in the cell's
            # code) is how the rank was stopped, not a failure of its own.
            for view in self.ranks.values():
                if view.status is RankStatus.FAILED and view.failure.startswith(INTERRUPTED):
                    view.status, view.stopped_as = RankStatus.STOPPED, "interrupted"
                    view.failure = ""
                    view.version += 1
            _one_word_for_one_press(self.ranks.values())
        self.version += 1

    @property
    def succeeded(self) -> bool:
        """The run finished and every rank is done: the only case a view shows as a success."""
        return self.verdict is Verdict.SUCCEEDED and all(
            view.status is RankStatus.DONE for view in self.ranks.values()
        )

    def _verdict_of_ranks(self) -> Verdict:
        statuses = {view.status for view in self.ranks.values()}
        if statuses == {RankStatus.DONE}:
            return Verdict.SUCCEEDED
        if RankStatus.FAILED in statuses:
            return Verdict.FAILED
        return Verdict.STOPPED

    @property
    def elapsed(self) -> float:
        return (self.ended_at or time.time()) - self.started_at

    def failed_summary(self, error: BaseException) -> str:
        """The summary of a failed run, one line: 'Failed after 3.2s: rank 1 raised ...'."""
        return f"Failed after {self.elapsed:.1f}s: {error}".splitlines()[0]

    def done_summary(self) -> str:
        """The summary of a successful run: 'Done in 3.2s, 84 optimizer steps, 26.3 opt
        steps/s', or 'Done in 3.2s, 95.0 it/s (train)' without optimizer steps (rates.py)."""
        rate = summary_rate(list(self.ranks.values()), self.started_at, self.ended_at)
        return f"Done in {self.elapsed:.1f}s" + (f", {rate}" if rate else "")

    def lines_since(self, index: int) -> list[OutputLine]:
        """Output lines with an index >= ``index`` that are still kept (oldest first)."""
        if not self.output or index > self.output[-1].index:
            return []
        start = max(0, index - self.output[0].index)
        return [self.output[i] for i in range(start, len(self.output))]


def _one_word_for_one_press(views: Iterable[RankView]) -> None:
    """One interrupt stopped them all: a rank that raised KeyboardInterrupt says "interrupted";
    one the launcher stopped first says the same, not "stopped" beside it."""
    views = list(views)
    if not any(view.stopped_as == "interrupted" for view in views):
        return
    for view in views:
        if view.status is RankStatus.STOPPED and not view.stopped_as:
            view.stopped_as = "interrupted"
            view.version += 1


def _reset_attempt(view: RankView) -> None:
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


def _apply_log(view: RankView, event: Log) -> None:
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
