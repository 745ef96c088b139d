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
from dataclasses import dataclass
from enum import Enum

from nbtrain.display.rankview import RankStatus, RankView, fold, reset_attempt
from nbtrain.display.rates import summary_rate
from nbtrain.shared.events import Event, Log, Output, ResumedFrom, Tracked


class Verdict(Enum):
    """How the whole run ended, as the launcher decided it (set by ``RunState.finish``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a rank failed, here or on another node
    TIMED_OUT = "timed out"
    STOPPED = "stopped"  # interrupted or stopped from outside: nothing failed


INTERRUPTED = "KeyboardInterrupt:"  # how a Failed rank's one-line reason starts after Ctrl-C
OUTPUT_CAP = 5000  # lines kept for display; a chatty rank cannot grow the kernel without bound


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
            self._add_output(event)
            return
        view.version += 1
        fold(view, event)  # its row (rankview.py); then what it changes of the run as a whole
        if isinstance(event, Log):
            self.metrics_version += 1
            for metric_listener in self._metric_listeners:
                metric_listener(event)
        elif isinstance(event, ResumedFrom):
            self.resumed = f"resumed from {event.source} (step {event.step})"
        elif isinstance(event, Tracked) and event.where not in self.tracked:
            self.tracked.append(event.where)

    def _add_output(self, event: Output) -> None:
        line = OutputLine(
            self.output_count, event.rank, event.stream, event.line, event.dump, event.aside
        )
        self.output.append(line)
        self.output_count += 1
        for listener in self._listeners:
            listener(line)

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
                reset_attempt(view)
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
