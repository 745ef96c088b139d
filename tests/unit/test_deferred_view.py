"""The deferred view of warm-rank commands: no dashboard for a quick cell, the usual one after."""

from __future__ import annotations

import time

from nbtrain.display.deferred import DeferredView
from nbtrain.display.runstate import RunState


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def draw(self, state: RunState, *, now: bool = False) -> None:
        self.calls.append("draw")

    def close(self, state: RunState) -> None:
        self.calls.append("close")

    def note(self, text: str) -> None:
        self.calls.append(f"note {text}")

    def erase_status(self) -> None:
        self.calls.append("erase")


def test_a_quick_run_never_builds_the_view():
    made: list[Recorder] = []
    view = DeferredView(lambda: made.append(Recorder()) or made[-1], after=60)
    state = RunState([0, 1])
    view.draw(state)
    view.note("starting")
    view.erase_status()
    view.close(state)
    assert made == [] and not view.opened


def test_a_longer_run_gets_the_view_with_the_pending_note():
    made: list[Recorder] = []
    view = DeferredView(lambda: made.append(Recorder()) or made[-1], after=0.05)
    state = RunState([0, 1])
    view.note("sharing 1 GiB")
    view.draw(state)
    assert made == []
    time.sleep(0.06)
    view.draw(state)
    view.erase_status()
    view.close(state)
    assert view.opened and made[0].calls == ["note sharing 1 GiB", "draw", "erase", "close"]
