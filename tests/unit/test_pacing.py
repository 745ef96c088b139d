"""The watch loop's pacing (Supervisor._pace): a burst is read as it comes, a sustained flow in
batches MIN_PASS apart, a backlog in a pipe at once. Pure logic on a clock of our own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nbtrain.kernel.group import supervisor
from nbtrain.kernel.group.supervisor import BUSY, MIN_PASS, Supervisor


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    now = SimpleNamespace(t=100.0)
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: now.t)
    return now


def loop() -> SimpleNamespace:
    return SimpleNamespace(_busy_since=0.0, _read_at=-BUSY, _busy_until=0.0)


def passes(state: SimpleNamespace, clock: SimpleNamespace, every: float, count: int,
           backlog: bool = False) -> list[bool]:
    """Passes that each read something, ``every`` seconds apart: was each followed by a wait?"""
    waited = []
    for _ in range(count):
        Supervisor._pace(state, True, backlog)  # type: ignore[arg-type]
        waited.append(state._busy_until > clock.t)
        clock.t += every
    return waited


def test_a_burst_shorter_than_busy_is_read_as_it_comes(clock) -> None:
    state = loop()
    assert passes(state, clock, 0.002, int(BUSY / 0.002) - 1) == [False] * (int(BUSY / 0.002) - 1)


def test_a_sustained_flow_is_read_in_batches_then_a_pause_starts_afresh(clock) -> None:
    state = loop()
    waited = passes(state, clock, 0.01, 10)
    assert waited[:5] == [False] * 5 and all(waited[5:])  # from BUSY on, MIN_PASS apart
    assert state._busy_until == pytest.approx(clock.t - 0.01 + MIN_PASS)
    clock.t += 2 * BUSY  # the loop was idle (or between two warm cells)
    assert passes(state, clock, 0.01, 3) == [False] * 3


def test_a_pipe_with_more_than_a_pass_reads_is_never_paced(clock) -> None:
    state = loop()
    assert not any(passes(state, clock, 0.01, 20, backlog=True))
