"""Ranks that start fast: what the first launch needs, made ready in the background as soon as
nbtrain is imported in an interactive kernel (benchmarks/startup.py measures it).

Without it, the first launch in a fresh kernel pays in its own cell for what every later one
finds done: importing torch._dynamo (any optimizer imports it; a fork launch imports it once in
the kernel so that ranks inherit it) and nbtrain's rank and kernel sides, and, for warm ranks
and forkserver launches, starting the forkserver: a fresh Python importing torch. One daemon
thread does it all once, while the person writes the next cell; the forkserver's imports run in
its own process (on another core), the kernel's in this thread.

Safety:

- a fork while this thread imports would give the child a module half imported, whose lock
  nobody in the child will ever release: a fork launch calls ``wait()`` before it forks
  (processes.context), so no rank is forked mid-import (forkserver and spawn ranks are fresh
  processes: they need not wait);
- a fork launch in the very next cell waits for no more than the imports it would have done
  itself: the kernel's come first, and the forkserver starts only after them;
- whatever fails here is dropped: the launch then does the same work itself, as it always did;
- nothing outlives the kernel: the forkserver ends when the kernel's end of its pipe closes
  (it exits with the kernel), and the thread is a daemon.
"""

from __future__ import annotations

import contextlib
import importlib
import threading

# What a first launch imports into the kernel beyond what the rank inherits (processes.py
# imports the rank's own modules): the launch paths, the warm-rank session and the views.
KERNEL_IMPORTS = [
    "multiprocessing.popen_fork",
    "multiprocessing.popen_forkserver",
    "nbtrain.kernel.launcher",
    "nbtrain.kernel.warm.session",
    "nbtrain.kernel.magics",
    "nbtrain.display.text",
    "nbtrain.display.widgets",
]
# (started once the cell that imported nbtrain ended: see nbtrain/__init__.py)

_thread: threading.Thread | None = None
_lock = threading.Lock()
_imported = threading.Event()  # the kernel's imports are done (what a fork waits for)


def start() -> None:
    """Begin the warm-up in the background (once per process; later calls do nothing)."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        _thread = threading.Thread(target=_warm, name="nbtrain-warmup", daemon=True)
        _thread.start()


def wait(*, everything: bool = False) -> None:
    """Return once the warm-up's imports into the kernel (if one was started) are over: before
    a fork. (The forkserver it starts afterwards needs no wait: it is another process.)
    ``everything``: also until the forkserver is ready (tests and benchmarks that count the
    kernel's file descriptors or time what follows)."""
    thread = _thread
    if thread is None or thread is threading.current_thread():
        return
    if everything:
        thread.join()
    else:
        _imported.wait()


def running() -> bool:
    """The warm-up is still importing into the kernel."""
    return _thread is not None and not _imported.is_set()


def _warm() -> None:
    from nbtrain.kernel import environment, forkserver

    # The kernel's own imports first: a fork launch (the default on CPU) in the very next
    # cell waits for them, and must not share the cores with the forkserver's imports then.
    try:
        for module in [*forkserver.PRELOAD, *KERNEL_IMPORTS]:
            try:
                importlib.import_module(module)
            except Exception:  # (ipywidgets missing, ...): the launch imports what it needs
                continue
    finally:
        _imported.set()
    if "forkserver" in environment.available_start_methods():
        with contextlib.suppress(Exception):
            forkserver.start(ready=True)  # (at once if a launch or start_ranks started it)
