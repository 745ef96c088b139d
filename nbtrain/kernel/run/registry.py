"""This kernel's runs (``nbtrain.runs()``): make a launch's handle, register it, run or start
it, and keep two runs off the same devices.

Every launch goes through ``launch`` (``notebook_launcher``) or ``begin`` (a warm command). The
registry keeps every running run and the newest KEPT_RUNS finished ones; a background run that
would share GPUs, TPU cores or the Ray placement with a running one is refused before it starts
(CPU ranks hold nothing: they may run side by side). The kernel's shutdown or restart stops every
background run (atexit), so nothing is left behind.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtrain.kernel.host import environment
from nbtrain.kernel.run.handle import Run, current

if TYPE_CHECKING:
    from nbtrain.kernel.options.interface import Launch, LaunchOptions, UserCall

KEPT_RUNS = 20  # finished runs nbtrain.runs() keeps (the oldest go first; running ones stay)

_runs: list[Run] = []
_runs_lock = threading.Lock()
# The GPUs the machine has, read when a background launch checks for overlap (a test mocks it).
gpu_count: Callable[[], int] = environment.cuda_device_count

__all__ = [
    "KEPT_RUNS",
    "Runs",
    "begin",
    "check_background",
    "claims",
    "launch",
    "refuse_if_busy",
    "runs",
]


class Runs(list[Run]):
    """This kernel's runs, oldest first; ``clear()`` forgets the finished ones."""

    def clear(self) -> None:
        with _runs_lock:
            gone = [run for run in _runs if run.done()]
            _runs[:] = [run for run in _runs if not run.done()]
        for run in gone:
            run.release()
        super().clear()
        self.extend(_runs)


def runs() -> Runs:
    """This kernel's runs, running and finished, newest last."""
    _prune()
    with _runs_lock:
        return Runs(_runs)


def launch(kind: Launch, call: UserCall, *, block: bool) -> Any:
    """Run a launch (its kind, built with its options): its value (blocking) or its handle
    (``block=False``, started)."""
    __tracebackhide__ = True
    run = Run(
        getattr(call.function, "__name__", "run"),
        lambda: kind.run(call),
        background=not block,
        stopping=kind.options.config.stopping,
        claims=claims(kind.options) if not block else frozenset(),
    )
    return begin(run, block=block)


def begin(run: Run, *, block: bool) -> Any:
    """Register ``run`` and run it here (its value) or start it (the handle)."""
    __tracebackhide__ = True
    if not block:
        _check_overlap(run)
    with _runs_lock:
        _runs.append(run)
    _prune()
    if block:
        return run.run_here()
    _stop_at_exit()
    if run.pane is not None:
        run.pane.show()  # the launching cell shows the view (its updates come from the thread)
    run.start()
    return run


def check_background(kind: Launch, block: object) -> None:
    """``block`` is a bool, and False only where the launch's kind can run in the background."""
    if not isinstance(block, bool):
        raise TypeError(f"block={block!r} must be True or False.")
    if block:
        return
    refused = kind.no_background
    if refused:
        raise ValueError(
            f"block=False is not supported for a launch {refused} yet; launch it with "
            "block=True (the default)."
        )


# -- safety ------------------------------------------------------------------------------------


def claims(options: LaunchOptions) -> frozenset[str]:
    """What a run holds that another may not use at the same time: GPUs, TPU cores, a Ray
    placement. CPU ranks hold nothing (they may run side by side)."""
    config = options.config
    if options.requested.cluster is not None:
        return frozenset({"the Ray cluster's placement"})
    if config.xla_device == "TPU":
        return frozenset({"the TPU cores"})
    if config.gpu_ids is not None:
        return frozenset(f"GPU {i}" for i in config.gpu_ids)
    count = gpu_count()
    return frozenset(f"GPU {i}" for i in range(min(count, config.num_processes)))


def _prune() -> None:
    """Keep the newest KEPT_RUNS finished runs (and every running one)."""
    with _runs_lock:
        finished = [old for old in _runs if old.done()]
        gone = finished[: max(0, len(finished) - KEPT_RUNS)]
        for old in gone:
            _runs.remove(old)  # the oldest finished runs go first
    for old in gone:
        old.release()


def refuse_if_busy(ranks: object) -> None:
    """A command for warm ``ranks`` while a background run holds them: a clear error."""
    for other in runs():
        if other.holds is ranks and not other.done() and other is not current():
            raise RuntimeError(
                f"the warm ranks are running {other!r} (nbtrain.runs()[{runs().index(other)}]) "
                "in the background: wait for it (run.wait()) or stop it (run.stop()) first"
            )


def _check_overlap(new: Run) -> None:
    for other in runs():
        shared = sorted(new.claims & other.claims)
        if shared and not other.done():
            raise RuntimeError(
                f"{other!r} (nbtrain.runs()[{runs().index(other)}]) is running on "
                f"{', '.join(shared)}, which this launch of {new.name} would use too: wait for "
                "it (run.wait()), stop it (run.stop()), or give this launch other devices "
                "(gpu_ids=)"
            )


_registered = False


def _stop_at_exit() -> None:
    """The kernel's shutdown or restart stops every background run (nothing left behind)."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(_stop_all)


def _stop_all() -> None:
    for run in runs():
        if run.background and not run.done():
            run.stop_for_exit()
