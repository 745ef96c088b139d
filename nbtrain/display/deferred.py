"""A view that appears only once a run has lasted ``after`` seconds (warm-rank commands).

A ``%%ranks`` cell that ends at once (most of them: define a name, look at a value) needs no
dashboard: building one costs more than the cell (ipywidgets send a comm message per widget)
and leaves a finished view under every cell. A cell that runs longer gets the usual live view
from then on, and keeps its final state like any launch's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from nbtrain.display import View
from nbtrain.display.runstate import RunState


class DeferredView:
    def __init__(self, make: Callable[[], View], after: float) -> None:
        self._make = make
        self._due = time.monotonic() + after
        self._view: View | None = None
        self._note = ""

    @property
    def opened(self) -> bool:
        return self._view is not None

    def pending(self) -> bool:
        """The view is not shown yet (it may appear at the next draw): output written now
        would land above it. A cell that ends first gets its output at the end."""
        return self._view is None

    def draw(self, state: RunState, *, now: bool = False) -> None:
        if self._view is None:
            if time.monotonic() < self._due:
                return
            self._view = self._make()
            if self._note:
                self._view.note(self._note)
        self._view.draw(state, now=now)

    def close(self, state: RunState) -> None:
        if self._view is not None:
            self._view.close(state)

    def note(self, text: str) -> None:
        self._note = text
        if self._view is not None:
            self._view.note(text)

    def where_buttons(self) -> set[str]:
        """The shown dashboard's "where?" button (widgets.py), if any."""
        buttons = getattr(self._view, "where_buttons", None)
        return buttons() if buttons is not None else set()

    def take_where(self) -> bool:
        take = getattr(self._view, "take_where", None)
        return bool(take()) if take is not None else False

    def erase_status(self) -> None:
        """The text view's live status line is erased before output is written (cellout.py)."""
        erase = getattr(self._view, "erase_status", None)
        if erase is not None:
            erase()
