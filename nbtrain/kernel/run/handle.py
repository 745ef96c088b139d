"""``nbtrain.Run``: a launch as an object the kernel keeps, not a frame on the cell's stack.

Every launch of ``notebook_launcher`` makes one (``launch``). A blocking launch runs its watch
loop right here, in the calling cell's thread (Ctrl-C, pdb prompts and the "where?" button
need that thread), and returns ``wait()``'s value: one implementation for both. A background
launch (``block=False``) runs the same loop in a thread of the kernel and returns the handle at
once; its view and its ranks' output go to its own displays (display/background.py), never
into whichever cell executes meanwhile.

Why a thread, not the kernel's event loop: the watch loop blocks in ``select`` on the ranks'
pipes with a short timeout and calls user-visible code (the view, trackers through ranks) at
~10 Hz; as a coroutine on ipykernel's loop every turn would have to yield, and anything that
blocks (a slow pickle of a result, a rank's big display) would freeze every cell. A thread
leaves the main thread (and so the cells) free except for the GIL it shares briefly
(benchmarks/background_run.py measures it). What only the main thread can do, a background run
does differently: no SIGINT handler (the kernel's stop button interrupts the cell that runs,
never a background run: ``run.stop()`` or the view's summary says how), no comm pumping (an idle
kernel delivers the "where?" click itself).

The lifecycle object of each launch (lifecycle.Run) finds the handle it belongs to through
``current()`` and reports to it (``attach``, ``record``, ``turn``). registry.py makes, registers
and starts the handles (``nbtrain.runs()``) and keeps two runs off the same devices; frames.py
keeps a failed run's error without the frames of the failed call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nbtrain.display.background import Pane
from nbtrain.display.lines import SHOWN, static_lines
from nbtrain.display.runstate import OutputLine, RunState, Verdict
from nbtrain.kernel.run import frames, where
from nbtrain.kernel.run.desk import Desk
from nbtrain.kernel.run.metrics import KEPT_METRICS, Metric, Metrics
from nbtrain.shared import stacks
from nbtrain.shared.events import Event, Log

if TYPE_CHECKING:
    from nbtrain.kernel.group import RankGroup
    from nbtrain.kernel.run.cellout import CellOutput
    from nbtrain.shared.stopping import StopPolicy

KEPT_LINES = 20_000  # rank lines a run keeps in memory for output(); every line is in its log
STOP_WAIT = 10.0  # seconds the kernel's shutdown waits for each background run to stop
WHERE_WAIT = 10.0  # seconds run.where() waits for the ranks' stacks

_local = threading.local()


class Lifecycle(Protocol):
    """What a handle reads of its launch's lifecycle (lifecycle.Run, which imports this)."""

    state: RunState
    output: CellOutput
    group: RankGroup | None

    def say(self, text: str) -> None: ...


class Releasable(Protocol):
    """Widgets a finished run keeps open for reloaded pages (display/reloaded.py)."""

    def release(self) -> None: ...


def current() -> Run | None:
    """The handle of the launch running in this thread, if any."""
    return getattr(_local, "run", None)


class Run:
    """A launch, running or finished (see the module docstring): what ``notebook_launcher(...,
    block=False)`` and ``ranks.run(..., block=False)`` return, and what ``nbtrain.runs()``
    lists. nbtrain makes it; its parameters are the launch's own:

    :param name: what the view and ``runs()`` call it (the function's name).
    :param body: the launch itself: its value, or it raises.
    :param background: True: the watch loop runs in a thread of its own (``block=False``).
    :param stopping: its stop policy (``stop(checkpoint=True)`` needs ``on_interrupt``).
    :param claims: devices no other run may use meanwhile.
    :param holds: the warm ranks a command runs on (``stop()`` interrupts it; the ranks stay).
    """

    def __init__(
        self,
        name: str,
        body: Callable[[], Any],
        *,
        background: bool,
        stopping: StopPolicy | None = None,
        claims: frozenset[str] = frozenset(),
        holds: object = None,
    ) -> None:
        self.name = name
        self.background = background
        self.claims = claims
        self.holds = holds
        self._body_fn, self._stopping = body, stopping
        can_save = stopping is not None and stopping.on_interrupt
        self.pane = Pane(self._stop_clicked, can_save) if background else None
        self._lifecycle: Lifecycle | None = None
        self.state: RunState | None = None
        self._lines: list[OutputLine] = []
        self.lines_dropped = 0
        self.metrics = Metrics()
        self._value: Any = None
        self._folder: Path | None = None
        self._final_view: dict[str, Any] | None = None
        self._kept: Releasable | None = None  # widgets kept for a reloaded page
        self._error: BaseException | None = None
        self._traceback = ""
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop: str | None = None  # "now" or "checkpoint": asked by stop(), served by turn()
        self._where_asked = False
        # A background run's pdb prompts wait for run.wait() (desk.py); _handed: the
        # supervisor whose prompts were handed to it (each attempt of a restart has its own).
        self.desk = Desk(lambda: self._stop) if background else None
        self._handed: object = None
        self._where: dict[int, stacks.RankStack] | None = None
        self._where_ready = threading.Event()
        self.started_at = time.time()

    # -- running --------------------------------------------------------------------------------

    def run_here(self) -> Any:
        """A blocking launch: the watch loop in this thread; its value or its exception as is."""
        __tracebackhide__ = True
        with _as_current(self):
            try:
                return self._body_fn()
            except BaseException as error:
                # The cell gets the error as is (%debug needs its frames); the run keeps a copy
                # without them (nbtrain.runs() would keep the failed call's locals alive).
                self._error = frames.detached(error)
                self._traceback = frames.formatted(error)
                raise
            finally:
                self._ended()

    def start(self) -> None:
        """A background launch: the watch loop in a thread of the kernel."""
        self._thread = threading.Thread(
            target=self._body, name=f"nbtrain run {self.name}", daemon=True
        )
        self._thread.start()

    def _body(self) -> None:
        with _as_current(self):
            try:
                self._value = self._body_fn()
            except BaseException as error:  # given to wait(), as the blocking launch raises it
                self._traceback = frames.formatted(error)
                frames.let_go(error)  # its traceback still prints; the frames' locals are gone
                self._error = error
            finally:
                self._ended()

    def _ended(self) -> None:
        if self._lifecycle is not None:
            self._folder = self._lifecycle.output.folder
        self._lifecycle = None  # its outcome held the ranks' pickled results: not kept twice
        self._body_fn = _spent  # the launch held the user's call and its arguments: let go
        if self.pane is not None:
            self.pane.end()
        self._finished.set()

    # -- what the lifecycle reports ----------------------------------------------------------

    def attach(self, lifecycle: Lifecycle) -> None:
        """A launch's lifecycle began (a restart or a warm command: each in turn)."""
        self._lifecycle = lifecycle
        self.state = lifecycle.state
        lifecycle.state.add_output_listener(self._keep_line)

    def _keep_line(self, line: OutputLine) -> None:
        if line.aside:
            return
        if len(self._lines) >= KEPT_LINES:
            del self._lines[: KEPT_LINES // 10]  # the oldest tenth goes (in the log in full)
            self.lines_dropped += KEPT_LINES // 10
        self._lines.append(line)

    def record(self, event: Event) -> None:
        """Every event the run applied: metrics are kept here, uncapped by the view's thinning."""
        if not isinstance(event, Log):
            return
        if len(self.metrics) >= KEPT_METRICS:
            del self.metrics[: KEPT_METRICS // 10]  # the oldest tenth goes
        current = self.state.ranks[event.rank].step if self.state is not None else 0
        for step, values in (*event.earlier, (event.step, event.values)):
            at = current if step is None else step
            self.metrics.extend(Metric(event.rank, at, k, float(v)) for k, v in values.items())

    def turn(self, lifecycle: Lifecycle) -> None:
        """Each turn of the watch loop (its thread): serve stop() and where()."""
        supervisor = lifecycle.group.supervisor if lifecycle.group is not None else None
        if self.desk is not None and supervisor is not None and supervisor is not self._handed:
            self._handed = supervisor
            self.desk.note = lifecycle.output.note
            supervisor.prompts.handed(self.desk.ask, self.desk.say)
        if self._where_asked and supervisor is not None:
            self._where_asked = False
            supervisor.ask_where(self._got_where)
        asked, self._stop = self._stop, None
        if asked == "checkpoint" and supervisor is not None:
            if supervisor.ask_to_stop():  # (False: asked already)
                lifecycle.say("run.stop(checkpoint=True): stopping at the next optimizer step "
                              "to save a checkpoint…")
        elif asked is not None and self.holds is not None and supervisor is not None:
            supervisor.interrupt()  # warm ranks: the command is interrupted, the ranks stay
        elif asked is not None:
            raise KeyboardInterrupt("run.stop()")

    def _got_where(self, picture: dict[int, stacks.RankStack]) -> None:
        self._where = picture
        self._where_ready.set()

    # -- the handle's API --------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> Any:
        """The run's value once it ended, or what the blocking launch would raise
        (WorkerError, KeyboardInterrupt after a stop, TimeoutError for timeout=). ``timeout``:
        seconds to wait at most (TimeoutError then; the run goes on). Ctrl-C stops the
        waiting, not the run."""
        __tracebackhide__ = True
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._finished.wait(0.05):
                if self.desk is not None:
                    self.desk.serve()  # a paused rank's prompt, in this cell
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"run.wait(timeout={timeout:g}): {self.name} is still {self.status} "
                        "(it goes on; wait again, or run.stop())"
                    )
        except KeyboardInterrupt:
            raise KeyboardInterrupt(
                f"stopped waiting; {self.name} goes on in the background "
                "(run.stop() stops it)"
            ) from None
        if self.desk is not None:
            self.desk.serve()  # the ranks' last pdb output
        if self._error is not None:
            raise frames.again(self._error)
        if not self.background:
            raise RuntimeError(
                f"{self.name} was a blocking launch: its value was returned in its cell and "
                "is not kept (launch with block=False to keep it on the run)"
            )
        return self._value

    def done(self) -> bool:
        return self._finished.is_set()

    @property
    def status(self) -> str:
        """'running', 'done', 'failed', 'stopped' or 'timed out'."""
        if not self._finished.is_set():
            return "running"
        if self._error is None:
            return "done"
        if isinstance(self._error, KeyboardInterrupt):
            return "stopped"
        verdict = self.state.verdict if self.state is not None else None
        return "timed out" if verdict is Verdict.TIMED_OUT else "failed"

    @property
    def error(self) -> BaseException | None:
        """The exception the run ended with (None: it succeeded or is running), without the
        frames of the failed call (their locals could be big); ``traceback`` has its text."""
        return self._error

    @property
    def traceback(self) -> str:
        """The failed run's traceback as the cell showed it first, as text ('' otherwise)."""
        return self._traceback

    @property
    def result(self) -> Any:
        """The value (None until the run succeeded; see wait())."""
        return self._value

    def stop(self, checkpoint: bool = False) -> None:
        """Stop the run: at once (every rank stopped; wait() then raises KeyboardInterrupt), or
        with ``checkpoint=True`` at the next optimizer step after saving a checkpoint, as the
        stop button does under on_interrupt='checkpoint' (resume=True continues from it)."""
        if self.done():
            return
        if checkpoint:
            policy = self._stopping
            if policy is None or not policy.on_interrupt:
                raise ValueError(
                    "run.stop(checkpoint=True) needs a launch with on_interrupt='checkpoint' "
                    "(only then do the ranks listen for a graceful stop); run.stop() stops "
                    "at once"
                )
        self._stop = "checkpoint" if checkpoint else "now"

    def _stop_clicked(self, checkpoint: bool) -> None:
        """The pane's stop buttons (their click arrives in the idle kernel's main thread)."""
        self.stop(checkpoint=checkpoint)

    def where(self) -> where.Where:
        """Where each rank is now: its stack and the collective it waits in."""
        if self.done():
            raise RuntimeError(f"{self.name} has ended ({self.status}): no rank to ask")
        self._where_ready.clear()
        self._where_asked = True
        deadline = time.monotonic() + WHERE_WAIT
        while not self._where_ready.wait(0.05):
            if self.done():
                raise RuntimeError(f"{self.name} ended ({self.status}) before its ranks answered")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no rank of {self.name} answered within {WHERE_WAIT:g}s")
        assert self._where is not None
        return where.Where(self._where)

    def output(self, rank: int | None = None) -> list[str]:
        """Every rank line so far, in order (``rank``: that rank's only), as
        '[rank r] text'; beyond KEPT_LINES the oldest are dropped here (``log_folder`` has
        them all)."""
        return [
            f"[rank {line.rank}] {line.text}"
            for line in list(self._lines)
            if rank is None or line.rank == rank
        ]

    @property
    def log_folder(self) -> str | None:
        """The folder with every line of every rank (rank-<r>.log); None before any line."""
        lifecycle = self._lifecycle
        folder = lifecycle.output.folder if lifecycle is not None else self._folder
        return str(folder) if folder is not None else None

    def __repr__(self) -> str:
        return f"<nbtrain.Run {self.name}: {self.status}>"

    def keep_view(self, bundle: dict[str, Any]) -> None:
        """A blocking launch's final dashboard (display/background.py: Recorded)."""
        self._final_view = bundle

    def keep_widgets(self, kept: Releasable) -> None:
        """A blocking launch's dashboard kept open for a page reloaded mid-launch
        (display/reloaded.py); closed by ``release``."""
        self._kept = kept

    def _ipython_display_(self) -> None:
        """Displayed in a cell: the run's view (live while it runs, with everything so far);
        a blocking launch's final dashboard and its newest lines (after a browser reload, its
        own cell may show neither)."""
        if self.pane is not None:
            self.pane.show()
            return
        from IPython.display import display

        if self._final_view is not None:
            display(self._final_view, raw=True)
        else:
            print(f"{self!r}")
        display(static_lines(self.output()[-SHOWN:]), raw=True)

    def release(self) -> None:
        """``nbtrain.runs()`` let this finished run go: close the widgets its view kept for
        pages reloaded mid-run (displayed again, it shows its static final view)."""
        if self.pane is not None:
            self.pane.release()
        if self._kept is not None:
            self._kept.release()
            self._kept = None

    def stop_for_exit(self) -> None:
        """The kernel shuts down: stop the ranks now and wait (bounded) until they are gone."""
        self._stop = "now"
        if self._thread is not None:
            self._thread.join(STOP_WAIT)


class _as_current:
    def __init__(self, run: Run) -> None:
        self.run = run

    def __enter__(self) -> None:
        self.previous = current()
        _local.run = self.run

    def __exit__(self, *exc: object) -> None:
        _local.run = self.previous


__all__ = ["KEPT_LINES", "Run", "current"]


def _spent() -> Any:
    raise RuntimeError("this run has ended: launch again")
