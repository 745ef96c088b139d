"""One command on the warm ranks (a ``%%ranks`` cell, ``run``, ``pull``, ``push``, ``debug``):
its ``Run``, the group's watch loop, and how it ends.

Every command is one ``run.Run`` (its own view, cell output, root cause and timeout), fed by the
world's ``RankGroup``: ``begin`` names the command's ranks, ``wait`` sends the command under
the warm Ctrl-C policy (``Interrupts(keep=True)``) and returns once each rank reported it, with
how the watch ended (group/ending.py). How it ends:

- a failure on some ranks while the others finish (or fail too): raised, state kept;
- ranks still busy STUCK_GRACE after another failed or after an interrupt (group/cell.py), or a
  rank that died: a new world is started (``Worlds``), and the error says every rank's state
  is gone;
- Ctrl-C: KeyboardInterrupt in the command on every rank; kept if they all return in time;
- a timeout: the command interrupted on every rank, state kept (or a new world if stuck).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import secrets
from collections.abc import Callable, Iterator
from typing import Any

from nbtrain.display.runstate import Verdict
from nbtrain.kernel.group.ending import Ending, How
from nbtrain.kernel.host import cellnames
from nbtrain.kernel.options.config import LaunchConfig
from nbtrain.kernel.run import registry
from nbtrain.kernel.run.lifecycle import Run
from nbtrain.kernel.warm.world import World, Worlds
from nbtrain.shared import sharedmem, shmclean, stacks
from nbtrain.shared.commands import Command
from nbtrain.shared.errors import WorkerError
from nbtrain.shared.options import ProgressMode
from nbtrain.shared.stopping import StopPolicy

VIEW_AFTER = 0.5  # seconds a command runs before its live view appears (quick cells get none)


def execute(
    worlds: Worlds,
    world: World,
    command: Callable[[int], Command],
    ranks: list[int],
    *,
    title: str,
    return_all: bool,
    timeout: float | None = None,
    quiet: bool = False,
    stopping: StopPolicy | None = None,
    keep_failures: bool = True,
) -> Any:
    """Send ``command(rank)`` to each of ``ranks`` and watch until each reported it: their
    values as a launch returns them. ``quiet``: no view (pull, push); ``keep_failures``: the
    ranks that fail keep their frames for ``debug()``."""
    __tracebackhide__ = True
    registry.refuse_if_busy(worlds)  # a background ranks.run is using them
    run = Run(
        _config(worlds, return_all, timeout, quiet, stopping), ranks, title=title,
        view_after=VIEW_AFTER,
    )
    group = world.group
    group.begin(set(ranks), run.emit, run.outcome.has_failure)
    run.watching(group)
    run.start_clock()

    def send() -> None:
        for rank in ranks:
            world.send(rank, pickle.dumps(command(rank)))

    def lost(exc: BaseException) -> None:  # an error in the kernel's own loop: the ranks go
        worlds.world = None
        run.abandon(exc)

    with group.stopped_on_error(lost):
        ending = group.wait(
            run.deadline, run.tick, run.interrupts(keep=True), first=send, redraw=run.redraw
        )
    if keep_failures:  # (before a restart below, which forgets them again)
        worlds.failures.record(ranks, run.outcome)
    return _ended(worlds, world, run, ending)


def _config(
    worlds: Worlds,
    return_all: bool,
    timeout: float | None,
    quiet: bool,
    stopping: StopPolicy | None,
) -> LaunchConfig:
    """The session's configuration, as this command changes it."""
    config = dataclasses.replace(
        worlds.config,
        return_all=return_all,
        timeout=worlds.config.timeout if timeout is None else timeout,
        stopping=stopping or worlds.config.stopping,
    )
    if quiet:  # pull/push: answers, not runs worth a view of their own
        config = dataclasses.replace(config, progress=ProgressMode.OFF)
    return config


def _ended(worlds: Worlds, world: World, run: Run, ending: Ending) -> Any:
    """The command's ending, in the order of the module docstring."""
    __tracebackhide__ = True
    if ending.broken:
        _restart_after(worlds, run, ending)
    if ending.how is How.TIMED_OUT:
        _time_out(run, restarted=False)
    if ending.how is How.INTERRUPTED:
        # Not a failure, and nothing was stopped: the dashboard says what the error says.
        run.end(
            f"Interrupted after {run.state.elapsed:.1f}s: every rank is idle again, "
            "its state kept",
            Verdict.STOPPED,
        )
        raise KeyboardInterrupt(
            "every rank was interrupted and is idle again; their state is kept"
        ) from None
    stops = run.outcome.stops()
    if stops and not run.outcome.has_failure():
        run.stopped(stops, "Every rank is idle again with its state as of that step.")
    try:
        return run.finish(ending)
    except WorkerError as error:  # (its cause: the rank's traceback, shown in the cell)
        raise world.named(error) from error.__cause__


def _restart_after(worlds: Worlds, run: Run, ending: Ending) -> None:
    """The world is broken (a rank died, or some stayed stuck): start a new one, then raise what
    happened, saying which rank failed, where the others were, that state is gone."""
    __tracebackhide__ = True
    stuck = stacks.describe(dict(ending.stacks), cellnames.place)
    worlds.stop(grace=0.0)
    worlds.start()
    note = (
        f"nbtrain restarted the {len(worlds.ranks)} ranks: every rank's state (names, "
        "model, process group) is gone; run your set-up cells again."
    )
    if stuck:
        note = f"Ranks that stayed busy (stuck, typically in a collective):\n{stuck}\n{note}"
    if ending.how is How.TIMED_OUT:
        _time_out(run, restarted=True, note=note)
    if ending.how is How.INTERRUPTED:
        run.abandon(KeyboardInterrupt())
        raise KeyboardInterrupt(f"not every rank returned to idle in time. {note}") from None
    if run.outcome.has_failure():
        error = run.outcome.error()
        error.add_note(note)
        run.fail(error)
    run.end(f"ranks restarted. {note}", Verdict.FAILED)
    raise WorkerError(0, message=note)


def _time_out(run: Run, *, restarted: bool, note: str = "") -> None:
    __tracebackhide__ = True
    limit = run.config.timeout or 0.0
    run.end(f"Timed out after {limit:g}s", Verdict.TIMED_OUT)
    kept = "" if restarted else "every rank was interrupted and is idle again; state kept."
    raise TimeoutError(f"the command's timeout={limit:g}s expired; {kept}{note}") from None


@contextlib.contextmanager
def results_segments(local: bool) -> Iterator[str | None]:
    """A name prefix for the segments of one command's large values (pulled tensors travel
    through /dev/shm, not the pipe); whatever a rank left under it (killed mid-write, a value
    never loaded) is removed when the command ends. None where there is no /dev/shm, or the
    ranks are not on this machine (``local`` False)."""
    if not (local and sharedmem.available()):
        yield None
        return
    prefix = f"{sharedmem.PREFIX}{os.getpid()}_{secrets.token_hex(6)}_"
    try:
        yield prefix
    finally:
        shmclean.remove_names(prefix + "*")


__all__ = ["VIEW_AFTER", "execute", "results_segments"]
