from __future__ import annotations

import pytest

from nbtrain.display.runstate import RunState
from nbtrain.shared.events import Event

START_METHODS = ["fork", "forkserver", "spawn"]


@pytest.fixture(params=START_METHODS)
def method(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """Every event the kernel applies to a launch's RunState, in order (what the view saw)."""
    events: list[Event] = []
    original = RunState.apply

    def apply(self: RunState, event: Event) -> None:
        events.append(event)
        original(self, event)

    monkeypatch.setattr(RunState, "apply", apply)
    return events
