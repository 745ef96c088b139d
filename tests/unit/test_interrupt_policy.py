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
    # a launch's supervisor (never asked here); torch's elastic agent holds the policy across
    # its groups: None
    supervisor = None if elastic else SimpleNamespace()
    with Interrupts().handling(supervisor) as check:  # type: ignore[arg-type]
        _PressedInAFinalizer()  # collected at once, on this (the main) thread
        assert [type(exc) for exc in dropped] == [KeyboardInterrupt]  # Python dropped it
        with pytest.raises(KeyboardInterrupt):
            check()  # the loop's next turn: the press was counted, so it acts
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_second_press_of_a_graceful_stop_is_not_lost_either(monkeypatch) -> None:
    monkeypatch.setattr(sys, "unraisablehook", lambda info: None)
    stops: list[bool] = []  # each ask: True the first time (Supervisor.ask_to_stop)
    supervisor = SimpleNamespace(ask_to_stop=lambda: stops.append(not stops) or stops[-1])
    asked: list[str] = []
    with Interrupts(graceful=True, say=asked.append).handling(supervisor) as check:  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGINT)  # the first press: a graceful stop, no raise
        check()
        assert stops == [True] and len(asked) == 1
        _PressedInAFinalizer()  # the second, dropped by a finalizer
        with pytest.raises(KeyboardInterrupt):
            check()


def test_ctrl_c_left_ignored_by_someone_is_heard_by_a_launch() -> None:
    """A CI run's pytest process had SIGINT ignored (left so by an earlier tool): a launch's
    stop button then did nothing. The launch hears it, then leaves the process as it was."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        supervisor = SimpleNamespace()
        policy = Interrupts().handling(supervisor)  # type: ignore[arg-type]
        with pytest.raises(KeyboardInterrupt), policy:
            os.kill(os.getpid(), signal.SIGINT)
            len(())  # the handler runs at the next bytecode
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # as it was
    finally:
        signal.signal(signal.SIGINT, previous)


def test_someone_elses_handler_is_kept() -> None:
    heard: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))
    try:
        supervisor = SimpleNamespace()
        with Interrupts().handling(supervisor) as check:  # type: ignore[arg-type]
            os.kill(os.getpid(), signal.SIGINT)
            len(())
            check()  # nothing counted by the launch: theirs heard it
        assert heard == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
