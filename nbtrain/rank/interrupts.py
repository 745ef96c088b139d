"""A rank's side of a graceful stop: ``STOP_SIGNAL`` from the kernel sets a flag that the
training loop reads at its next optimizer step (accelerator/checkpoint/stopping.py).

A rank with nowhere to stop at (no prepared DataLoader under a stop policy: a raw loop, or still
setting up) is interrupted at once instead, as a plain interrupt would. Between calls (a warm
rank waiting for its next command) the signal is ignored. With ``num_processes=1`` the kernel is
the rank: SIGINT itself is handled so (``handling``), and a second press stops at once.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

from nbtrain.shared.stopping import STOP_SIGNAL


class _Flags:
    enabled = False  # a call under a stop policy is running
    armed = False  # the call has somewhere to stop at (a prepared DataLoader)
    requested = False  # the kernel asked for a stop


_flags = _Flags()


def install() -> None:
    """At rank start: the handler stays; ``begin``/``end`` say whether it acts."""
    if STOP_SIGNAL is not None:
        signal.signal(STOP_SIGNAL, _on_signal)


def begin() -> None:
    """A call under a stop policy starts (every call: a warm rank runs many)."""
    _flags.enabled, _flags.armed, _flags.requested = True, False, False


def end() -> None:
    _flags.enabled, _flags.armed, _flags.requested = False, False, False


def arm() -> None:
    """The training loop has a place to stop at."""
    _flags.armed = True


def requested() -> bool:
    return _flags.requested


@contextlib.contextmanager
def handling(signum: int) -> Iterator[None]:
    """For the duration of a call (in the kernel's main thread): ``signum`` asks for a stop."""
    begin()
    previous = signal.signal(signum, _on_signal)
    try:
        yield
    finally:
        signal.signal(signum, previous)
        end()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if not _flags.enabled:
        return
    if _flags.requested:
        raise KeyboardInterrupt("stopped at once (a second interrupt)")
    if _flags.armed:
        _flags.requested = True  # no I/O here: the handler may run inside a write to a pipe
        return
    raise KeyboardInterrupt("stopped at once: no prepared DataLoader to stop at")
