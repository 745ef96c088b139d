"""The watch loop's Ctrl-C policy (kernel/group/interrupts.py), in this process: real SIGINTs."""

from __future__ import annotations

import os
import signal
import sys
from types import SimpleNamespace

import pytest

from nbtrain.kernel.group.interrupts import Interrupts


class _PressedInAFinalizer:
    """Garbage whose finalizer is running when Ctrl-C arrives: Python runs the SIGINT handler
    at the finalizer's next bytecode, and drops what it raises ("Exception ignored in")."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        len(())  # the next bytecode: the handler runs here, inside the finalizer


@pytest.mark.parametrize("elastic", [False, True])
def test_a_ctrl_c_dropped_by_a_finalizer_still_stops_a_one_shot_launch(
    monkeypatch, elastic: bool
) -> None:
    dropped: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_value))
    # a launch's flags; torch's elastic agent holds the policy across its groups: None
    supervisor = None if elastic else SimpleNamespace(interrupted=False, stop_asked=False)
    with Interrupts().handling(supervisor) as check:  # type: ignore[arg-type]
        _PressedInAFinalizer()  # collected at once, on this (the main) thread
        assert [type(exc) for exc in dropped] == [KeyboardInterrupt]  # Python dropped it
        with pytest.raises(KeyboardInterrupt):
            check()  # the loop's next turn: the press was counted, so it acts
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_second_press_of_a_graceful_stop_is_not_lost_either(monkeypatch) -> None:
    monkeypatch.setattr(sys, "unraisablehook", lambda info: None)
    supervisor = SimpleNamespace(interrupted=False, stop_asked=False)
    asked: list[str] = []
    supervisor.ask_to_stop = lambda: setattr(supervisor, "stop_asked", True)
    with Interrupts(graceful=True, say=asked.append).handling(supervisor) as check:  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGINT)  # the first press: a graceful stop, no raise
        check()
        assert supervisor.stop_asked and asked
        _PressedInAFinalizer()  # the second, dropped by a finalizer
        with pytest.raises(KeyboardInterrupt):
            check()
