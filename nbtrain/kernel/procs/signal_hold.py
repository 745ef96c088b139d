"""Hold SIGINT and SIGTERM while the launcher forks its ranks, and deliver them right after.

A signal's Python handler runs at the next bytecode the main thread executes, and while a rank
is being forked that bytecode can be in an at-fork callback (``logging`` registers one that
runs in the parent after every fork). An exception raised there cannot propagate: Python prints
"Exception ignored in: <function _releaseLock>" and drops it. So a Ctrl-C (KeyboardInterrupt)
or ``nbtrain launch``'s SIGTERM (Terminated) arriving while ranks were being created vanished,
and the launch ran on. A loaded machine makes the window wide: a forked child can start and
run before its parent returns from ``fork()``. Inside ``held()`` the handlers only note the
signal; on the way out the real handlers are back and each noted signal is raised again.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Signals with a Python handler are noted inside the block and re-raised after it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (only the main thread can set handlers, and only it runs them)
        return
    noted: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        if signum not in noted:
            noted.append(signum)

    previous = {
        signum: signal.signal(signum, note)
        for signum in HELD
        if callable(signal.getsignal(signum))  # SIG_DFL acts in the kernel: nothing is lost
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for again in noted:
            signal.raise_signal(again)  # now its real handler runs, in ordinary code
