"""One launch's lifecycle in the kernel: the single object every launch path feeds.

A ``Run`` owns a launch from validated options to the value returned in the cell:

- the ``RunState`` (per-rank model, display/runstate.py) and the ``Outcome`` (results, root cause);
- the view (widgets or text) and its throttled redraws;
- the ranks' output as the cell's own output, and the launch's log folder (cellout.py);
- the deadline of ``timeout=`` and what to say about where each rank was stuck;
- the Ctrl-C policy it gives its rank group (a graceful stop first, with on_interrupt=);
- the ending: deliver the values, or raise ``WorkerError`` / ``TimeoutError`` / the interrupt,
  with the view closed first in every case (a broken frontend never masks the outcome).

The processes themselves belong to a ``RankGroup`` (group/): start, the one watch loop, Ctrl-C,
stacks, teardown. The launch kinds (launch.py) give the run a group and feed it: ``local.py``
(ranks on this machine), ``xla.py`` (torch_xla's host process), ``elastic/agent.py`` (torch's
elastic agent: a group per attempt, stepped from torch's loop), ``cluster/`` (Ray) and
``inprocess.py`` (``num_processes=1`` in the kernel itself: no group, its own ``Ending``). The
warm ranks of a distributed session (warm/) run one ``Run`` per command on their group.

The interface, in the order a launch uses it::

    run = Run(config, ranks, title)     # shows the view at once
    run.emit(event)                     # every event, from a Supervisor or in process
    ending = run.supervise(group)       # start the group, watch until every rank exited
    value = run.finish(ending)          # deliver, or raise the root cause / TimeoutError /
                                        # the graceful stop (in process: finish(ending, ...))

plus ``tick()`` (a throttled redraw), ``say(text)`` (a node-level status), ``interrupts()``
(the Ctrl-C policy), ``new_attempt()`` (restarts), ``abandon(exc)`` and ``end(summary,
verdict)`` for paths that own their loop (the elastic agent).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, NoReturn, TextIO, cast

from nbtrain.display import View
from nbtrain.display.background import PaneStream
from nbtrain.display.commpump import CommPump
from nbtrain.display.deferred import DeferredView
from nbtrain.display.groups import is_wide
from nbtrain.display.lines import SHOWN
from nbtrain.display.runstate import RunState, Verdict
from nbtrain.kernel.group import Interrupts, RankGroup
from nbtrain.kernel.group.ending import Ending, How
from nbtrain.kernel.group.outcome import Outcome
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.run import endings, handle, tracebacks, where
from nbtrain.kernel.run.cellout import CellOutput
from nbtrain.kernel.run.views import open_view, pane_view
from nbtrain.shared import stacks
from nbtrain.shared.errors import ResultError, WorkerError
from nbtrain.shared.events import Display, Event, Status, Stopped

REFRESH = 0.1  # seconds between redraws of the view (about 10 per second)
# Seconds between writes of the ranks' new lines to the cell (ipykernel's own stdout batches
# every 0.2 s): each write is a message to the frontend, so with the view's own (rows four times
# a second, title and chart once: display/widgets.py) the frontend gets at most ~10 a second.
OUTPUT_EVERY = 0.25

__all__ = ["REFRESH", "Run", "open_view"]


class Run:
    """One launch (or one warm cell): state, view, deadline, outcome and ending."""

    def __init__(
        self,
        config: LaunchConfig,
        ranks: list[int],
        title: str,
        *,
        view_after: float = 0.0,
        in_process: bool = False,
    ) -> None:
        """``view_after``: show the view only once the run has lasted that long (warm ranks:
        a quick cell gets no dashboard). ``in_process``: the function runs in this process
        (inprocess.py): no rank is stopped at its end, which the messages say."""
        self.config = config
        self.ranks = ranks
        self.in_process = in_process
        self.state = RunState(ranks, title=title)
        self.outcome = Outcome(ranks)
        tracebacks.install()  # the cell's tracebacks show the user's frames, not nbtrain's
        # The handle (handle.py) this launch runs for; a background one has its own displays.
        self.handle = handle.current()
        pane = self.handle.pane if self.handle is not None else None
        self.view: View = (
            pane_view(config, pane)
            if pane is not None
            else DeferredView(lambda: open_view(config), view_after)
            if view_after > 0
            else open_view(config)
        )
        self.output = CellOutput(
            config.output,
            before_write=getattr(self.view, "erase_status", _nothing),
            hold=getattr(self.view, "pending", _never),
            wide=is_wide(len(ranks)),
            # (file-like enough: CellOutput only writes and flushes)
            stdout=cast(TextIO, PaneStream(pane, "stdout")) if pane is not None else None,
            stderr=cast(TextIO, PaneStream(pane, "stderr")) if pane is not None else None,
            rich=pane.add_display if pane is not None else None,
        )
        if self.handle is not None:
            self.handle.attach(self)
        self.state.add_output_listener(self.output.take)
        self.deadline: float | None = None
        self.ended = False
        # Where each rank is (where.py): the group asked, hang detection, the button's comms.
        self.group: RankGroup | None = None
        self.hang = where.HangWatch(config.hang_after)
        self._comms: CommPump | None = None
        self._last_draw = 0.0
        self._last_output = 0.0
        self._note = ""
        self.view.draw(self.state)  # shown at once; the text view sees every output line

    # -- feeding the run -------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        if isinstance(event, Display):
            self.output.show(event)  # rich output a rank displayed: into the cell, in order
            return
        self.outcome.apply(event)
        self.state.apply(event)
        if self.handle is not None:
            self.handle.record(event)

    def tick(self, *, now: bool = False) -> None:
        """Publish the ranks' new output lines (at most every OUTPUT_EVERY seconds) and redraw
        (every REFRESH), everything at once when ``now``; ask where each rank is when the
        button, SIGQUIT or hang detection says so."""
        self._look()
        if self.handle is not None:
            self.handle.turn(self)  # run.stop() and run.where() from other cells
        clock = time.monotonic()
        if clock - self._last_draw >= REFRESH:
            self._last_draw = clock
            if clock - self._last_output >= OUTPUT_EVERY:
                self._last_output = clock
                self.output.flush()
            self.view.draw(self.state, now=now)

    def redraw(self) -> None:
        """Publish and draw now, unthrottled (before a rank's pdb prompt blocks the loop)."""
        self._last_draw = self._last_output = -float("inf")
        self.tick(now=True)

    def say(self, text: str) -> None:
        """A node-level status ("waiting for nodes (1 of 2 joined)"): in the widget header or
        as one line of the text view; never breaks a launch."""
        if text == self._note:
            return
        self._note = text
        with contextlib.suppress(Exception):
            self.view.note(text)
        self.tick()

    def watching(self, group: RankGroup) -> None:
        """The group whose ranks this run watches (asked where its ranks are)."""
        self.group = group

    def _look(self) -> None:
        supervisor = self.group.supervisor if self.group is not None else None
        if supervisor is None or self.ended:
            return
        if self._button_pressed() or where.signal_asked():
            supervisor.ask_where(self._show_where)
        if self.hang.due(supervisor.idle_for()):
            supervisor.ask_where(self._show_hang)

    def _button_pressed(self) -> bool:
        """The dashboard's "where?" button was clicked: its message handled from this loop."""
        buttons = getattr(self.view, "where_buttons", None)
        if buttons is None:
            return False
        if self.handle is not None and self.handle.background:
            # The kernel is idle meanwhile and delivers the click itself: pumping the shell
            # socket from this thread would take the cells' own messages.
            return bool(self.view.take_where())  # type: ignore[attr-defined]
        ids = buttons()
        if ids and self._comms is None:
            self._comms = CommPump.for_kernel()
        if self._comms is not None:
            self._comms.pump(lambda comm_id: comm_id in ids)
            if self._comms.page_opened and self.output.copy_to is None:
                self._follow_reloaded()
        return bool(self.view.take_where())  # type: ignore[attr-defined]

    def _follow_reloaded(self) -> None:
        """A page was opened while the cell runs (a reload): the dashboard shows it the cell's
        newest lines and keeps its final view for it (display/reloaded.py)."""
        follow = getattr(self.view, "follow_reloaded", None)
        copy_to = follow() if follow is not None else None
        if copy_to is None:
            return
        self.output.flush(now=True)
        self.output.copy_to = copy_to
        if self.handle is not None:  # the newest lines so far; closed when runs() lets it go
            copy_to("".join(f"{line}\n" for line in self.handle.output()[-SHOWN:]))
            self.handle.keep_widgets(self.view.reloaded)  # type: ignore[attr-defined]

    def _show_where(self, picture: dict[int, stacks.RankStack]) -> None:
        self.output.note(where.report(picture, "where each rank is:"))
        self._mark_rows(picture)

    def _show_hang(self, picture: dict[int, stacks.RankStack]) -> None:
        self.output.note(where.hang_report(picture, self.hang.after or 0.0))
        self._mark_rows(picture)

    def _mark_rows(self, picture: dict[int, stacks.RankStack]) -> None:
        """The rank the others wait for, marked in its row (and the waiters in theirs)."""
        self.state.mark_waits(where.row_notes(picture))  # drawn at the loop's next tick

    def starting(self, phase: str) -> None:
        """Every rank is in this start-up ``phase`` ('starting Python'), said by the kernel
        before the ranks can say anything themselves; drawn at once, as the kernel may block
        while it lasts (rank/__init__.py says the next phase from inside the rank). What the
        kernel itself does first ('importing torch in the kernel', before a fork: the phases that
        start with 'importing') is no rank's: said in the header."""
        if phase.startswith("importing "):
            self.say(phase)
            self.redraw()
            return
        for rank in self.ranks:
            self.emit(Status(rank, phase))
        self.redraw()

    def start_clock(self) -> None:
        """``timeout=`` counts from the first start of ranks (not from rendezvous waits)."""
        if self.deadline is None and self.config.timeout is not None:
            self.deadline = time.monotonic() + self.config.timeout

    def new_attempt(self) -> None:
        """A restart: a fresh outcome, every rank shown as starting again."""
        self.outcome = Outcome(self.ranks)
        self.state.restart()

    # -- the watch loop ----------------------------------------------------------------------

    def supervise(
        self, group: RankGroup, *, emit: Callable[[Event], None] | None = None
    ) -> Ending:
        """Start the group's ranks and watch them until every one exited (``emit``: how events
        reach the run; the XLA host fans its exit out to ordinals): how the watch ended.
        Whatever interrupts it (Ctrl-C, an error here) stops every rank first, ends the view,
        closes the group and re-raises."""
        __tracebackhide__ = True
        self.start_clock()
        self.watching(group)
        try:
            with group.stopped_on_error(self.abandon):
                group.start(emit or self.emit, self.outcome.has_failure)
                ending = group.wait(self.deadline, self.tick, self.interrupts(), redraw=self.redraw)
        except KeyboardInterrupt:
            # Where the watch loop was is no news to the user: the cell line and this.
            kept = endings.kept(self.config.stopping)
            raise KeyboardInterrupt(f"every rank was stopped{kept}") from None
        group.close()
        return ending

    def interrupts(self, *, keep: bool = False) -> Interrupts:
        """This run's Ctrl-C policy (group/interrupts.py); ``keep``: warm ranks stay."""
        policy = self.config.stopping
        graceful = policy is not None and policy.on_interrupt
        return Interrupts(graceful=graceful, keep=keep, say=self.say)

    def stopped(
        self,
        stops: list[Stopped],
        then: str = "Continue from it by running the same launch with resume=True.",
    ) -> NoReturn:
        """Every rank saved the graceful stop's checkpoint and left: say where, and how to go on."""
        __tracebackhide__ = True
        step, path = max(stop.step for stop in stops), stops[0].path
        self.end(f"Stopped at step {step} (saved): checkpoint in {path}", Verdict.STOPPED)
        raise KeyboardInterrupt(
            f"stopped at step {step}; every rank's state is saved in {path}. {then}"
        )

    def _interrupted_early(self, ending: Ending | None) -> bool:
        """A stop was asked for, and the ranks ended as interrupted (no place to stop at yet)."""
        if ending is None or ending.how is not How.STOPPED:
            return False
        failures = [self.outcome.records[rank].failure for rank in self.outcome.failed_ranks()]
        return all(f is not None and f.type_name == "KeyboardInterrupt" for f in failures)

    # -- endings -----------------------------------------------------------------------------

    def finish(
        self,
        ending: Ending | None = None,
        *,
        values: dict[int, Any] | None = None,
        raised: BaseException | None = None,
    ) -> Any:
        """The ranks ended (``ending``: how their watch ended, group/ending.py): raise the
        root cause, or TimeoutError, or the graceful stop, or return the values. The same
        order for every launch kind; in process, ``values`` and ``raised`` are the function's
        own value and exception (nothing was pickled)."""
        __tracebackhide__ = True
        if self.outcome.has_failure() and self._interrupted_early(ending):
            self.end(f"Interrupted after {self.state.elapsed:.1f}s", Verdict.STOPPED)
            # Short: why (a raw DDP loop, a Trainer, code still setting up) is in the guide.
            raise KeyboardInterrupt(
                "stopped at once: no prepared DataLoader to stop at yet (stop-and-resume guide, "
                f"'What it covers'){endings.kept(self.config.stopping)}"
            )
        if self.outcome.has_failure():
            self.fail(self.outcome.error(node=self.config.node_rank), raised=raised)
        if ending is not None and ending.how is How.TIMED_OUT:
            self.time_out(dict(ending.stacks))
        stops = self.outcome.stops()
        if stops:
            self.stopped(stops)
        return self.deliver(values)

    def deliver(self, results: dict[int, Any] | None = None) -> Any:
        """The ranks succeeded: end the view and return their values (this node's first
        rank's, or every rank's with ``return_all``): ``results``, or the outcome's (then
        ResultError if one cannot be loaded)."""
        __tracebackhide__ = True
        if results is None:
            try:
                results = self.outcome.results()
            except ResultError as error:
                self.end(self.state.failed_summary(error), Verdict.FAILED)
                raise
        self.end(self.state.done_summary())
        if self.config.return_all:
            return [results.get(rank) for rank in sorted(self.state.ranks)]
        return results.get(self.config.node_rank * self.config.num_processes)

    def fail(
        self,
        error: WorkerError,
        cause: BaseException | None = None,
        *,
        raised: BaseException | None = None,
    ) -> NoReturn:
        """End with ``error``; its cause is the rank's own traceback (shown in the cell). In
        process, ``raised`` is the function's exception itself: the error carries its frames,
        so %debug lands on the failing line."""
        __tracebackhide__ = True
        if raised is not None:
            error.original = raised
        self.end(self.state.failed_summary(error), Verdict.FAILED)
        if raised is not None:
            raise error.with_traceback(raised.__traceback__) from None
        if cause is None:
            cause = tracebacks.rank_cause(error)
        raise error from cause

    def time_out(self, stuck: dict[int, stacks.RankStack]) -> NoReturn:
        """End as timed out, saying where the ranks were."""
        __tracebackhide__ = True
        self.end(f"Timed out after {self.config.timeout:g}s", Verdict.TIMED_OUT)
        raise TimeoutError(self.timeout_message(stuck)) from None

    def timeout_message(self, stuck: dict[int, stacks.RankStack]) -> str:
        return endings.timeout_message(
            self.config, self.state, stuck, self.output.folder, in_process=self.in_process
        )

    def abandon(self, exc: BaseException, verdict: Verdict | None = None) -> None:
        """Interrupted (or an error in the kernel): say so and end the view."""
        summary = endings.interrupted_summary(exc, self.state, self.in_process)
        self.end(summary.splitlines()[0], verdict)

    def end(self, summary: str, verdict: Verdict | None = None) -> None:
        self.ended = True
        if self._comms is not None:
            self._comms.close()  # the messages that wait for the cell's end go back in order
        self.output.close()  # every line is in the cell before the final view
        held = self.output.held_summary()
        self.state.finish(f"{summary}. {held}" if held else summary, verdict)
        with contextlib.suppress(Exception):  # a broken frontend must not mask the outcome
            self.view.close(self.state)


def _nothing() -> None:
    pass


def _never() -> bool:
    return False
