"""The terminal's live line: epoch, step/total, it/s, ETA and a metric, fitted to the width."""

from __future__ import annotations

import io
import os

import pytest

from nbtrain.display.runstate import RunState
from nbtrain.display.statusline import status_line
from nbtrain.display.text import TextView
from nbtrain.kernel.options.config import OutputMode
from nbtrain.shared.events import Log, Progress, Started


def training_state() -> RunState:
    """Two ranks in epoch 3, 16 of 32 steps in, 12.5 it/s, a loss logged."""
    state = RunState([0, 1], title="2 ranks, fork")
    for rank in (0, 1):
        state.apply(Started(rank, 10 + rank, "cpu", "host", rank, time=0.0))
        state.apply(Progress(rank, 6, 32, "epoch 3", time=1.0))
        state.apply(Progress(rank, 16, 32, "epoch 3", time=1.8))
        state.apply(Log(rank, {"loss": 0.5813 + rank, "acc": 0.9}, step=16))
    return state


def test_a_wide_terminal_shows_everything_a_person_needs() -> None:
    views = list(training_state().ranks.values())
    assert status_line(views, 200) == (
        "r0 epoch 3 16/32 12.5 it/s ETA 0:01 loss 0.5813 | "
        "r1 epoch 3 16/32 12.5 it/s ETA 0:01 loss 1.581"
    )


@pytest.mark.parametrize(
    ("width", "expected"),
    [
        (80, "r0 epoch 3 16/32 12.5 it/s ETA 0:01 | r1 epoch 3 16/32 12.5 it/s ETA 0:01"),
        (60, "r0 epoch 3 16/32 ETA 0:01 | r1 epoch 3 16/32 ETA 0:01"),
        (40, "r0 16/32 ETA 0:01 | r1 16/32 ETA 0:01"),
        (30, "r0 16/32 | r1 16/32"),
        (12, "r0 16/32 | r"),  # nothing fits: the line is cut, never wrapped
    ],
)
def test_a_narrow_terminal_drops_detail_in_order_and_never_overflows(
    width: int, expected: str
) -> None:
    views = list(training_state().ranks.values())
    line = status_line(views, width)
    assert line == expected
    assert len(line) <= width


def test_the_live_line_fits_the_terminal_it_is_drawn_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "shutil.get_terminal_size", lambda fallback=(80, 24): os.terminal_size((61, 24))
    )
    out = io.StringIO()
    view = TextView(output=OutputMode.ALL, show_progress=True, live=True, stdout=out)
    view.draw(training_state())
    assert out.getvalue() == "\rr0 epoch 3 16/32 ETA 0:01 | r1 epoch 3 16/32 ETA 0:01"
