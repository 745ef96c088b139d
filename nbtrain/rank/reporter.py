"""The coalescing behind progress() and log() (reporting.py): one ``Reporter`` per rank thread
merges its progress and metrics into at most one update per INTERVAL.

Each step of a progress loop costs a counter increment and a clock read; events go out at most
every INTERVAL seconds (the latest state, coalesced), plus always the final step of a loop.
Coalescing merges the updates, never the data: every metric value logged at a step is kept
(HELD_CAP at most, thinned as the kernel's history is) and sent with the next update, up to
POINTS_PER_LOG steps in one Log. Updates that may be coalesced go through the sink's
``try_send`` when it has one (a write that would block is declined and retried at the next
update), so a slow kernel never stalls training; the final step of a loop and the metrics
logged up to then are sent for sure with ``send``.

``log()`` outside any loop (raw DDP code logging every step) is coalesced too: a metric not sent
in the current interval goes out at once, a repeat within it is held and goes out with the next
update; ``flush()``, which the worker calls before it reports the rank's end, sends what is still
held, so a rank's final metrics always arrive before its Finished or Failed.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from nbtrain.rank import runtime
from nbtrain.rank.gpu_usage import GpuSampler
from nbtrain.rank.runtime import Runtime
from nbtrain.shared.events import Event, EventSink, Log, Progress

INTERVAL = 0.1  # seconds between updates a rank sends while a loop runs (about 10 per second)
# Wide runs: the kernel applies every rank's updates and one core cannot take 10 a second from
# hundreds of ranks, so the interval grows with the world size to keep the whole run near
# RUN_UPDATES updates a second (64 ranks: one every 0.64 s each), up to MAX_INTERVAL.
RUN_UPDATES = 100.0
MAX_INTERVAL = 10.0
# Beyond WIDE ranks the view draws groups of ranks (a mean with a min-max band, not a line per
# rank), and an update carries at most WIDE_POINTS of the steps logged since the last one
# (evenly spread, the newest always): the kernel's cost and memory stay flat in N. Trackers
# record every value in the rank itself; this thinning is the live view's only.
WIDE = 16
WIDE_POINTS = 8
# Logged steps held for the next update (the kernel keeps as many per metric, rankview.HISTORY_CAP):
# past that, older ones are thinned as the kernel's history is (every other one of the older
# half, never the first) rather than memory grow while the kernel is behind.
HELD_CAP = 2000
POINTS_PER_LOG = 50  # logged steps per Log event: a few metrics' worth fits one pipe packet
LOOP_SEPARATOR = " · "  # joins nested loops' descriptions: 'epoch 2/3 · train'


class Bar:
    """One open progress loop of a rank. ``progress()`` drives it; integrations may too."""

    __slots__ = ("desc", "in_body", "leaf", "n", "reporter", "start", "total")

    def __init__(self, reporter: Reporter, total: int | None, desc: str | None) -> None:
        self.reporter = reporter
        self.total = total
        self.desc = desc
        self.n = self.start = 0  # start: steps of the pass done before it began (a resume)
        self.leaf = True  # no loop was ever opened inside this one: its steps are real steps
        # progress() runs the loop's body while n still counts the steps before it; a bar
        # driven by update_to() is told a step once it is done.
        self.in_body = False

    def update_to(self, step: int) -> None:
        """Set the completed step count (for callers that know it, e.g. a Trainer)."""
        reporter = self.reporter
        if self.leaf and step > self.n:
            reporter.global_step += step - self.n
        self.n = step
        if time.monotonic() >= reporter.next_due:
            reporter.flush()

    def close(self, *, complete: bool = False) -> None:
        """End the loop; ``complete`` means it ran to its end (a bar without total fills up)."""
        if complete and self.total is None:
            self.total = self.n
        self.reporter.close(self, complete=complete)


class Reporter:
    """Coalesces one rank's progress and metrics into at most one update per INTERVAL."""

    def __init__(self, current: Runtime) -> None:
        self.runtime = current
        self.rank = current.info.rank
        self.sink = current.sink
        self.bars: list[Bar] = []  # open loops, innermost last
        self.pending: list[tuple[int, dict[str, float]]] = []  # (step, values) not yet sent
        self.next_due = 0.0  # monotonic time of the next coalesced update
        self.world_size = current.info.world_size
        self.interval = update_interval(self.world_size)
        self.global_step = 0
        self.used_progress = False
        self.log_calls = 0
        self.optimizer_steps: dict[int, int] = {}  # per optimizer (id): steps it took
        # A sink without try_send (num_processes=1: a call into the kernel) takes every log at
        # once, as does a forked child such as a DataLoader worker: nobody flushes them later.
        self.direct = getattr(self.sink, "try_send", None) is None
        self._seen: set[str] = set()  # metric names logged so far
        self._window: set[str] = set()  # names sent outside a loop in the current interval
        self._sent: tuple[object, ...] | None = None  # the last progress state that went out
        # An inner loop left before its end (an exception, a break): where it was, shown until
        # the loop around it moves on. A rank that fails inside nested loops then reports the
        # step it failed at, not the outer loop's count from long before.
        self._left: tuple[Bar, int, Progress] | None = None
        self._gpu = GpuSampler(self.rank)

    def open(self, total: int | None, desc: str | None, start: int = 0) -> Bar:
        if self.bars:
            self.bars[-1].leaf = False
        bar = Bar(self, total, desc)
        bar.n = bar.start = start
        self.bars.append(bar)
        self._left = None
        self.used_progress = True
        if time.monotonic() >= self.next_due:
            self.flush()
        return bar

    def close(self, bar: Bar, *, complete: bool = True) -> None:
        if bar not in self.bars:
            return
        if not complete and len(self.bars) > 1 and self.bars[-1] is bar:
            event = self._progress_event()
            if event is not None:
                parent = self.bars[-2]
                self._left = (parent, parent.n, event)
        if len(self.bars) == 1:
            # The outermost loop ended: its last step and every pending metric go out for sure.
            self.flush(final=True)
        self.bars.remove(bar)
        # An inner loop that ended is coalesced: the next update shows the loop around it.

    def log(self, values: dict[str, float], step: int | None) -> None:
        if step is None:
            # Without progress(): the N-th log() is at step N, 1-based as a progress() step's
            # and as TensorBoard's optimizer step after the first step() (issue 42).
            step = self.global_step if self.used_progress else self.log_calls + 1
            if self.bars and self.bars[-1].leaf and self.bars[-1].in_body:
                step += 1  # the step running now: its loss is the N-th step's, as summaries say
        self.log_calls += 1
        if not self.bars:
            self._log_outside_a_loop(values, step)
            return
        self._hold(step, values)
        # A metric's first value goes out at once: a chart then starts at its first point.
        first = not self._seen.issuperset(values)
        if first:
            self._seen.update(values)
        if first or time.monotonic() >= self.next_due:
            self.flush()

    def _log_outside_a_loop(self, values: dict[str, float], step: int) -> None:
        if self.direct:
            self._send_gpu_usage(final=True)
            self.sink.send(Log(self.rank, values, step))
            return
        self._hold(step, values)
        if time.monotonic() >= self.next_due:
            self._window.clear()  # a new interval: every name may go out once more
        elif self._window.issuperset(values):
            return  # repeats within the interval: held for the next update or flush()
        for _, held in self.pending:
            self._window.update(held)
        self.flush()

    def _hold(self, step: int, values: dict[str, float]) -> None:
        """Keep the values for the next update: a point per step, in the order logged."""
        pending = self.pending
        if pending and pending[-1][0] == step:
            pending[-1][1].update(values)  # more metrics (or a newer value) of the same step
            return
        pending.append((step, dict(values)))
        if len(pending) > HELD_CAP:
            del pending[1 : len(pending) // 2 : 2]

    def flush(self, *, final: bool = False) -> None:
        """Send what changed since the last update; ``final`` sends even to a slow kernel."""
        self.next_due = time.monotonic() + self.interval
        event = self._progress_event()
        if event is not None:
            state = (event.step, event.total, event.desc, event.optimizer_steps)
            if state != self._sent:
                if not self._offer(event, final):
                    return  # the kernel is behind: keep everything pending, try next time
                self._sent = state
        self._send_gpu_usage(final)
        groups, self.pending = thin_points(self.pending, self.world_size), []
        for start in range(0, len(groups), POINTS_PER_LOG):
            *earlier, (step, values) = groups[start : start + POINTS_PER_LOG]
            if not self._offer(Log(self.rank, values, step, earlier=tuple(earlier)), final):
                self.pending = groups[start:] + self.pending  # the rest goes with the next update
                return

    def _send_gpu_usage(self, final: bool) -> None:
        usage = self._gpu.sample()
        if usage is not None and self._offer(usage, final):
            self._gpu.sent(usage)  # (one the kernel was too busy for goes out next time)

    def _progress_event(self) -> Progress | None:
        if not self.bars:
            return None
        bar = self.bars[-1]
        if self._left is not None:
            parent, position, event = self._left
            if parent is bar and parent.n == position:
                return event
            self._left = None
        outer = tuple((above.n, above.total) for above in self.bars[:-1])
        desc = _compose_desc(self.bars)
        return Progress(
            self.rank, bar.n, bar.total, desc, loop=bar.desc, outer=outer, start=bar.start,
            optimizer_steps=max(self.optimizer_steps.values(), default=0),
        )

    def _offer(self, event: Event, final: bool) -> bool:
        if final:
            self.sink.send(event)
            return True
        return offer(self.sink, event)


def update_interval(world_size: int) -> float:
    """Seconds between a rank's updates in a run of ``world_size`` ranks (see RUN_UPDATES)."""
    return min(MAX_INTERVAL, max(INTERVAL, world_size / RUN_UPDATES))


def thin_points(
    points: list[tuple[int, dict[str, float]]], world_size: int
) -> list[tuple[int, dict[str, float]]]:
    """The logged steps an update carries: all of them up to WIDE ranks; beyond, WIDE_POINTS
    evenly spread over them, the first and the newest always (a chart's ends stay exact)."""
    if world_size <= WIDE or len(points) <= WIDE_POINTS:
        return points
    last = len(points) - 1
    picked = sorted({round(i * last / (WIDE_POINTS - 1)) for i in range(WIDE_POINTS)})
    # A metric logged only at some steps (eval loss) must not vanish with its step: the values
    # of the steps left out ride with the next kept one (a newer value of a name wins).
    kept: list[tuple[int, dict[str, float]]] = []
    carried: dict[str, float] = {}
    for index, (step, values) in enumerate(points):
        if index not in picked:
            carried.update(values)
            continue
        kept.append((step, {**carried, **values}))
        carried = {}
    return kept


def flush() -> None:
    """Send what this thread's reporter still holds (metrics, the open loop's step) for sure.

    The worker calls it when the user's function ended, before Finished or Failed.
    """
    reporter = _local.reporter
    if reporter is not None and reporter.runtime is runtime.current():
        # OSError: the kernel's end of the pipe is gone; this rank is being stopped anyway.
        with contextlib.suppress(OSError):
            reporter.flush(final=True)


def offer(sink: EventSink, event: Event) -> bool:
    """Send ``event`` unless the sink says that would block now (then False: try later)."""
    try_send = getattr(sink, "try_send", None)
    if try_send is None:
        sink.send(event)
        return True
    return bool(try_send(event))


class _ThreadReporter(threading.local):
    # A class-level default makes a miss a plain lookup, not a caught AttributeError (~1 us).
    reporter: Reporter | None = None


_local = _ThreadReporter()


def _forked() -> None:
    # In a forked child (a DataLoader worker) the inherited reporter sends logs at once: the
    # worker's flush() before Finished runs in the rank, never in its children.
    reporter = _local.reporter
    if reporter is not None:
        reporter.direct = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def reporter_for(current: Runtime) -> Reporter:
    """The reporter of the calling thread's launch context (XLA replicas may be threads)."""
    reporter = _local.reporter
    if reporter is None or reporter.runtime is not current:
        reporter = Reporter(current)
        _local.reporter = reporter
    return reporter


def _compose_desc(bars: list[Bar]) -> str | None:
    """Outer loops show as a prefix, e.g. 'epoch 2/3 · train' for a batch loop in an epoch loop."""
    inner = bars[-1].desc
    if len(bars) == 1:
        return inner
    outer = [
        f"{bar.desc or 'loop'} {bar.n + 1}" + (f"/{bar.total}" if bar.total is not None else "")
        for bar in bars[:-1]
    ]
    return LOOP_SEPARATOR.join([*outer, inner or "loop"])
