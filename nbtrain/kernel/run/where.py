"""Where each rank is, while it runs: who asks, and the picture they get.

One picture (shared/stacks.py: each rank's stack ending at the user's code, the collective it
is inside, the ranks the others wait for) answers every asker: the dashboard's "where?" button,
``ranks.where()`` between cells, SIGQUIT (Ctrl-\\) to ``nbtrain launch``, and hang detection
(``hang_after=``: no rank said anything for that long). The TimeoutError says the same.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nbtrain.kernel.host import cellnames
from nbtrain.kernel.options.names import hint, setting
from nbtrain.shared import stacks

HANG_AFTER = 300.0  # seconds without progress from any rank before the picture is shown once

_SIGNAL: int | None = getattr(signal, "SIGQUIT", None)
_asked: list[int] = []  # signals heard and not yet served


@dataclass(frozen=True)
class Where:
    """Where each rank is: ``ranks`` (a RankStack each: frames, collective, note) and the
    ranks the others wait for (``waits_for``, empty when no rank waits in a collective)."""

    ranks: Mapping[int, stacks.RankStack]

    @property
    def waits_for(self) -> list[int]:
        found = stacks.waited_for(self.ranks)
        return found[0] if found is not None else []

    @property
    def text(self) -> str:
        return stacks.describe(self.ranks, cellnames.place, live=True)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Where each rank is:\n{self.text}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def report(picture: Mapping[int, stacks.RankStack], why: str) -> str:
    """The picture as the cell (or the terminal) shows it, under ``why``."""
    return f"[nbtrain] {why}\n{stacks.describe(picture, cellnames.place, live=True)}"


def row_notes(picture: Mapping[int, stacks.RankStack]) -> dict[int, tuple[str, bool]]:
    """What each running rank's row says after a picture that found ranks the others wait
    for: rank -> (its phase, whether the others wait for it). Empty when no rank waits."""
    found = stacks.waited_for(picture)
    if found is None or not found[0]:
        return {}
    missing = found[0]
    notes: dict[int, tuple[str, bool]] = {}
    for rank, stack in picture.items():
        if rank in missing:
            frame = stacks.innermost_own(stack)
            at = f" ({cellnames.place(frame.file, frame.line)})" if frame is not None else ""
            notes[rank] = (f"the others wait for it{at}", True)
        elif stack.collective is not None:
            notes[rank] = (
                f"waiting in {stack.collective}() for {stacks.name_ranks(missing)}", False
            )
    return notes


def hang_report(picture: Mapping[int, stacks.RankStack], after: float) -> str:
    waiting = stacks.waited_for(picture)
    named = (
        ""
        if waiting is not None
        else "\nNo rank waits in a collective for another: compare the lines above."
    )
    given = setting("hang_after", int(after) if after.is_integer() else after)
    off = hint("hang_after=None", "--hang-after 0")
    return (
        report(picture, f"no rank has made progress for {after:g}s ({given}); where each rank is:")
        + named
        + f"\nThe run goes on: interrupt it to stop, or wait if it is only slow ({off} turns "
        "this off)."
    )


class HangWatch:
    """Hang detection for one run: due once, when no rank said anything for ``after``
    seconds (None: never)."""

    def __init__(self, after: float | None) -> None:
        self.after = after
        self.fired = False

    def due(self, idle: float) -> bool:
        if self.after is None or self.fired or idle < self.after:
            return False
        self.fired = True
        return True


class SignalAsks:
    """While active (``nbtrain launch``): SIGQUIT (Ctrl-\\ in a terminal, or ``kill -QUIT``)
    asks where each rank is, instead of Python's default (quit with a core dump). The ranks
    lead process groups of their own, so the terminal's Ctrl-\\ does not reach them."""

    def __enter__(self) -> SignalAsks:
        self.previous: Any = None
        if _SIGNAL is not None and threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(_SIGNAL, _heard)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None and _SIGNAL is not None:
            signal.signal(_SIGNAL, self.previous)
        _asked.clear()


def _heard(signum: int, frame: object) -> None:
    _asked.append(signum)  # served by the launch's loop at its next turn, never in here


def signal_asked() -> bool:
    """Was SIGQUIT heard since the last call?"""
    if not _asked:
        return False
    _asked.clear()
    return True
