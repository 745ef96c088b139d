"""Ranks that start fast: what the first launch needs, made ready while the kernel is idle, as
soon as nbtrain is imported in a Jupyter kernel (benchmarks/startup.py measures it).

Without it, the first launch in a fresh kernel pays in its own cell for what every later one
finds done: importing torch._dynamo (any optimizer imports it; a fork launch imports it once in
the kernel so that ranks inherit it) and nbtrain's rank and kernel sides, and, for warm ranks
and forkserver launches, starting the forkserver: a fresh Python importing torch.

Each step runs in the kernel's main thread, from its event loop, one step per turn of the loop:
never in a thread. So no fork of the kernel (a launch's, or a DataLoader's in the user's code)
can happen in the middle of one of its imports, and no cell imports the same modules at the
same time: a cell sent meanwhile runs between two steps, and waits for one step at most. A
launch that comes before the last step imports what it still lacks itself, as it always did,
but for torch._dynamo, which it leaves to its ranks and to the warm-up
(processes.fork_imports). The forkserver imports in its own process (on another core); it
ends when the kernel does (its end of the forkserver's pipe closes). Whatever fails here is
dropped: the launch then does the same work itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import threading

from nbtrain.kernel.host import environment
from nbtrain.kernel.procs import forkserver

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
_AFTER_THE_CELL = 0.05  # seconds: the first step waits for the cell that started it to end

_steps: collections.deque[str] = collections.deque()
_loop: asyncio.AbstractEventLoop | None = None
_started = False


def steps() -> list[str]:
    """The warm-up's steps in order: torch first (the forkserver needs it), then the forkserver
    (it imports on another core meanwhile), then the kernel's own imports, torch._dynamo, the
    slowest, last."""
    rank_side = [name for name in forkserver.PRELOAD if name != "torch._dynamo"]
    start_server = [_FORKSERVER] if "forkserver" in environment.available_start_methods() else []
    return ["torch", *start_server, *rank_side, *KERNEL_IMPORTS, "torch._dynamo"]


def start() -> bool:
    """Begin the warm-up on this thread's running event loop once the current cell has ended
    (once per process; later calls do nothing). False where there is no such loop (a script,
    terminal IPython): there a launch does the work itself."""
    global _loop, _started
    if _started:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        loop = asyncio.get_running_loop()  # ipykernel runs each cell inside its loop
    except RuntimeError:
        return False
    _loop, _started = loop, True
    _steps.extend(steps())
    loop.call_later(_AFTER_THE_CELL, _next)
    return True


def running() -> bool:
    """Steps of the warm-up are still to come."""
    return bool(_steps)


def pending(module: str) -> bool:
    """The warm-up has yet to import ``module``."""
    return module in _steps


def finish() -> None:
    """Do the steps still to come now, in this cell (tests that count what follows)."""
    while _steps:
        _do(_steps.popleft())


def _next() -> None:
    if not _steps:
        return
    try:
        _do(_steps.popleft())
    except KeyboardInterrupt:  # pressed while the kernel was idle: nothing of the user's to stop
        _steps.clear()
        return
    if _steps and _loop is not None:
        # One step per turn of the loop: a cell that arrived meanwhile runs before the next.
        _loop.call_soon(_next)


def _do(step: str) -> None:
    with contextlib.suppress(Exception):  # (ipywidgets missing, ...): the launch does it
        if step == _FORKSERVER:
            forkserver.start()  # returns at once: the server imports in its own process
        else:
            importlib.import_module(step)
