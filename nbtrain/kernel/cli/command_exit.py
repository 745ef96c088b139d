"""How the ``nbtrain`` command hears its signals and ends, so that Ctrl-C acts at once.

Two things made a Ctrl-C on ``nbtrain launch`` look ignored for half a minute:

- A process started with SIGINT ignored (a background job of a non-interactive shell, some CI
  harnesses) keeps it ignored: Python installs its KeyboardInterrupt handler only where SIGINT
  has its default action, so ``kill -INT`` did nothing at all. ``hear_stop_signals`` installs the
  handlers for the command's duration, whatever the command inherited (as torchrun does).
- Once the command is done (every rank stopped and reaped, the message printed), interpreter
  finalization tears down torch's modules and collects their objects: about a CPU-second, which
  a loaded machine stretches to tens of seconds between "every rank was stopped" and the exit.
  ``exit_now`` runs the atexit handlers, flushes, and ends the process without that teardown.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

Handlers = dict[int, Any]


def hear_stop_signals(on_sigterm: Callable[[int, Any], None]) -> Handlers:
    """From now on SIGINT raises KeyboardInterrupt and SIGTERM calls ``on_sigterm``, even
    where the process started with them ignored. Returns the previous handlers, for
    ``restore``."""
    return {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
        signal.SIGTERM: signal.signal(signal.SIGTERM, on_sigterm),
    }


def restore(previous: Handlers) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` as ``sys.exit`` would, minus interpreter finalization:
    atexit handlers still run (multiprocessing's, logging's, a coverage tool's), output is
    flushed; module teardown and the final garbage collection are skipped. Only for the command
    itself (``cli.run``): nothing of the caller's may be left to finalize."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe must not change the code
                stream.flush()
        os._exit(code)
