"""Ranks that start fast: what the first launch needs, made ready while the kernel is idle, as
soon as nbtrain is imported in a Jupyter kernel (benchmarks/startup.py measures it).

Without it, the first launch in a fresh kernel pays in its own cell for what every later one
finds done: importing torch._dynamo (any optimizer imports it; a fork launch imports it once in
the kernel so that ranks inherit it) and nbtrain's rank and kernel sides, and, for warm ranks
and forkserver launches, starting the forkserver: a fresh Python importing torch. The warm-up
starts the forkserver only where launches use it by default (CUDA visible, or torch_xla): on a
CPU machine they fork, and warm ranks start it when they are asked for.

Each step runs in a thread of its own, but only while no cell runs: a cell's start
(IPython's pre_execute) pauses the warm-up after its current step, and the cell's end resumes
it. So no fork of the kernel (a launch's, or a DataLoader's in the user's code) can happen in
the middle of one of its imports, and no cell imports the same modules at the same time; yet
the kernel's own loop stays free: a cell sent while a long step runs (torch._dynamo: 1.4 s on
an idle machine, 14 s at load 13) starts at once and says in its output, after
``_QUIET_WAIT``, what it waits for, instead of sitting empty (issue 42). A launch that comes
before the last step imports what it still lacks itself, as it always did (processes.py says
how torch._dynamo is treated). The forkserver imports in its own process (on another core);
it ends when the kernel does (its end of the forkserver's pipe closes). Whatever fails here is
dropped: the launch then does the same work itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import threading
import time
from typing import Any

from nbtrain.kernel.host import environment
from nbtrain.kernel.procs import forkserver
from nbtrain.shared import tpu

# What a first launch imports into the kernel beyond what the rank inherits (forkserver.py
# lists the rank's own modules): the launch paths, the warm-rank session and the views.
KERNEL_IMPORTS = [
    "multiprocessing.popen_fork",
    "multiprocessing.popen_forkserver",
    "nbtrain.kernel.entry",
    "nbtrain.kernel.warm.session",
    "nbtrain.kernel.warm.magics",
    "nbtrain.display.text",
    "nbtrain.display.widgets",
]
_FORKSERVER = "(the forkserver)"  # the step that starts it
_QUIET_WAIT = 0.3  # seconds a cell waits for the current step before it says so
_SAY_EVERY = 0.5  # seconds between updates of that line

_steps: collections.deque[str] = collections.deque()  # a step leaves once it is done
_cond = threading.Condition()
_cell_runs = False  # a cell runs: no step begins
_current: str | None = None  # the step under way
_started = False


def steps() -> list[str]:
    """The warm-up's steps in order: torch first (the forkserver needs it), then the forkserver
    (it imports on another core meanwhile), then the kernel's own imports, torch._dynamo, the
    slowest, last."""
    rank_side = [name for name in forkserver.PRELOAD if name != "torch._dynamo"]
    start_server = [_FORKSERVER] if "forkserver" in environment.available_start_methods() else []
    return ["torch", *start_server, *rank_side, *KERNEL_IMPORTS, "torch._dynamo"]


def start() -> bool:
    """Begin the warm-up once the current cell has ended (once per process; later calls do
    nothing). False outside an IPython kernel's main thread (a script, terminal IPython):
    there a launch does the work itself."""
    global _started, _cell_runs
    if _started:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        asyncio.get_running_loop()  # ipykernel runs each cell inside its loop
    except RuntimeError:
        return False
    shell = _shell()
    if shell is None:
        return False
    _started, _cell_runs = True, True  # called from a cell: its end lets the first step go
    _steps.extend(steps())
    shell.events.register("pre_execute", _cell_begins)
    shell.events.register("pre_run_cell", _wait_for_the_step)
    shell.events.register("post_execute", _cell_ended)
    threading.Thread(target=_run, name="nbtrain-warm-up", daemon=True).start()
    return True


def running() -> bool:
    """Steps of the warm-up are still to come."""
    return bool(_steps)


def pending(module: str) -> bool:
    """The warm-up has yet to import ``module``."""
    return module in _steps


def finish() -> None:
    """Do the steps still to come now, in this cell (tests that count what follows)."""
    _wait_for_the_step()
    while _steps:
        with _cond:
            step = _steps[0] if _steps else None
        if step is not None:
            _do(step)
            _done(step)


def _run() -> None:
    """The warm-up's thread: one step at a time, only between cells."""
    global _current
    while True:
        with _cond:
            while _steps and _cell_runs:
                _cond.wait()
            if not _steps:
                return
            _current = _steps[0]
        try:
            _do(_current)
        finally:
            _done(_current)


def _done(step: str) -> None:
    global _current
    with _cond:
        if _steps and _steps[0] == step:
            _steps.popleft()
        _current = None
        _cond.notify_all()


def _cell_begins(*_: object) -> None:
    global _cell_runs
    with _cond:
        _cell_runs = True


def _cell_ended(*_: object) -> None:
    global _cell_runs
    with _cond:
        _cell_runs = False
        _cond.notify_all()


def _wait_for_the_step(*_: object) -> None:
    """Before a cell's code runs: the step under way ends first (one at most). After
    _QUIET_WAIT the cell says what it waits for, with the seconds, and the line goes once the
    step is done: a launch cell is never an empty box."""
    with _cond:
        if _current is None or _cond.wait_for(lambda: _current is None, _QUIET_WAIT):
            return
    began = time.monotonic() - _QUIET_WAIT
    handle = _show(None, began)
    try:
        with _cond:
            while not _cond.wait_for(lambda: _current is None, _SAY_EVERY):
                _show(handle, began)
    finally:
        _hide(handle)


def _show(handle: Any, began: float) -> Any:
    """The line that says what the cell waits for (a display, updated in place)."""
    step = _current or "the last step"
    what = "starting the forkserver" if step == _FORKSERVER else f"importing {step}"
    text = (
        f"[nbtrain] waiting for the warm-up to finish {what} in the kernel (once per kernel): "
        f"{time.monotonic() - began:.0f}s"
    )
    with contextlib.suppress(Exception):  # no frontend to show it to: the wait is the same
        from IPython.display import DisplayHandle, Pretty, display

        if handle is None:
            return display(Pretty(text), display_id=True)
        assert isinstance(handle, DisplayHandle)
        handle.update(Pretty(text))
    return handle


def _hide(handle: Any) -> None:
    """The line goes: the saved notebook keeps only what the cell itself showed."""
    if handle is None:
        return
    with contextlib.suppress(Exception):
        from IPython.display import clear_output

        clear_output()


def _forkserver_serves() -> bool:
    """Will a launch start from the forkserver here without asking for it? Where CUDA is
    visible (ranks cannot fork a kernel that may use CUDA) or torch_xla is installed (its host
    starts from it). On a CPU machine launches fork: the server would cost ~290 MB for nothing
    (issue 44); warm ranks and forkserver launches start it when they come. (Asked after the
    torch step: the CUDA count needs torch, and NVML answers without a CUDA context.)"""
    return environment.cuda_device_count() > 0 or tpu.torch_xla_installed()


def _shell() -> Any:
    with contextlib.suppress(Exception):
        from IPython import get_ipython

        return get_ipython()
    return None


def _do(step: str) -> None:
    with contextlib.suppress(Exception):  # (ipywidgets missing, ...): the launch does it
        if step == _FORKSERVER:
            if _forkserver_serves():
                forkserver.start()  # returns at once: the server imports in its own process
        else:
            importlib.import_module(step)
