"""The one Ctrl-C policy of a watched rank group, and the deferral that guards its teardown.

While the group's watch loop runs:

- ``graceful`` (on_interrupt="checkpoint"): the first Ctrl-C asks every rank to save at its next
  optimizer step and leave (shared/stopping.py), said in the view; the second acts at once.
- acting at once: a one-shot launch raises KeyboardInterrupt in the loop (the group then stops
  every rank); warm ranks (``keep``) get KeyboardInterrupt in their command instead and stay,
  since the kernel's loop must never stop mid-read: the pipes carry on into the next command.

The handler counts presses; the loop acts on them at its next turn (``check``), never inside a
handler (no drawing, no signalling mid-read). A one-shot launch's handler also raises at once,
as Python's own does (out of a blocking wait, a pdb prompt's input), and ``check`` raises it again
if it got lost: Python runs a signal's handler in whatever bytecode the main thread runs next,
which may be a finalizer (``__del__``, a weakref callback) that the garbage collector calls
there, and a KeyboardInterrupt raised in one is printed as "Exception ignored" and dropped.
Off the main thread (no signals there) nothing is installed, nor for a one-shot launch under
someone else's SIGINT handler (a Python callable): that one stays. Ctrl-C ignored (SIG_IGN, or
the OS default) is not a choice a launch keeps: a library or an earlier tool may have left it
so (a CI run's pytest process had), and then the stop button would do nothing; the launch
hears it, as ``nbtrain launch`` does (command_exit.py).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from nbtrain.kernel.group.supervisor import Supervisor

STOPPING = "stopping at the next optimizer step to save a checkpoint…"  # a graceful stop's note


def _quiet(text: str) -> None:
    pass


@dataclass(frozen=True)
class Interrupts:
    """What Ctrl-C does while a group is watched (see the module docstring)."""

    graceful: bool = False
    keep: bool = False  # warm ranks: interrupt their command, keep the processes
    say: Callable[[str], None] = _quiet  # where the graceful stop's note goes (the view)

    @contextlib.contextmanager
    def handling(self, supervisor: Supervisor | None) -> Iterator[Callable[[], None]]:
        """Install the policy; yields the check the watch loop calls on every turn.
        ``supervisor`` None: a one-shot launch whose groups come and go under one handler
        (torch's elastic agent: a group per attempt)."""
        if supervisor is None and (self.keep or self.graceful):
            raise ValueError("a graceful stop or warm ranks need the group's supervisor")
        presses: list[int] = []
        acting = 2 if self.graceful else 1  # the press that acts at once

        def check() -> None:
            if not presses:
                return
            if not self.keep and len(presses) >= acting:  # its KeyboardInterrupt was dropped
                raise KeyboardInterrupt
            assert supervisor is not None  # (a graceful stop, or warm ranks: checked above)
            # (each asks once: False if it was asked already, or the ranks were interrupted)
            if self.graceful and supervisor.ask_to_stop():
                self.say(f"{STOPPING} {self._again()}")
            if self.keep and len(presses) >= acting:
                supervisor.interrupt()

        def on_sigint(signum: int, frame: Any) -> None:
            presses.append(signum)
            if not self.keep and len(presses) >= acting:
                raise KeyboardInterrupt

        if threading.current_thread() is not threading.main_thread() or not (
            self.keep or self.graceful
            or _not_someone_elses(signal.getsignal(signal.SIGINT))
        ):
            yield check  # a one-shot launch under someone else's SIGINT handler: theirs
            return
        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield check
        finally:
            signal.signal(signal.SIGINT, previous)

    def _again(self) -> str:
        if self.keep:
            return "(interrupt again to interrupt the ranks at once; their state is kept)"
        return "(interrupt again to stop at once)"


def _not_someone_elses(handler: Any) -> bool:
    """Python's own KeyboardInterrupt, or no Python handler at all (ignored, the OS default)."""
    return handler is signal.default_int_handler or handler in (signal.SIG_IGN, signal.SIG_DFL)


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """A second Ctrl-C while we stop the ranks must not leave them running: it is held and
    raised once they are stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt
