"""The rank's pdb (rank/debugger.py) and the kernel's prompt (kernel/group/pdbprompt.py), wired
together in one process over a real pipe: what the live view is told, and q's semantics."""

from __future__ import annotations

import multiprocessing
import pdb
import sys
import threading

import pytest

from nbtrain.kernel.group.pdbprompt import Prompts
from nbtrain.rank import debugger
from nbtrain.shared.events import CallbackSink, Paused, Resumed, Status


@pytest.fixture
def rank_3():
    """This process as rank 3 whose pdb talks to a Prompts (answers scripted)."""
    saved = sys.breakpointhook, pdb.set_trace
    reader, writer = multiprocessing.Pipe(duplex=False)
    events: list[object] = []
    debugger.install(3, CallbackSink(events.append), reader)
    try:
        yield events, writer
    finally:
        sys.breakpointhook, pdb.set_trace = saved
        debugger._state = None
        reader.close()
        writer.close()


def _in_a_rank(work):
    """Run ``work`` in a thread (the rank); pdb traces that thread only."""
    thread = threading.Thread(target=work)
    thread.start()
    return thread


def _serve(prompts: Prompts, events: list, thread: threading.Thread) -> None:
    """The kernel's loop: hand over events, take a turn, until the rank is done."""
    seen = 0
    while thread.is_alive() or seen < len(events):
        for event in events[seen:]:
            prompts.take(event)
        seen = len(events)
        prompts.turn()
        thread.join(0.01)


def test_the_view_is_told_paused_in_pdb_with_the_line_and_then_running(rank_3):
    events, writer = rank_3
    result = {}

    def work():
        value = 41
        breakpoint()
        result["value"] = value + 1

    answers = iter(["p value", "c"])
    said: list[str] = []
    prompts = Prompts({3: writer}, ask=lambda prompt: next(answers), say=said.append)
    prompts.no_input = False
    thread = _in_a_rank(work)
    _serve(prompts, events, thread)
    assert result == {"value": 42}
    notes = [e.text for e in events if isinstance(e, Status)]
    line = work.__code__.co_firstlineno + 3  # the line after breakpoint()
    assert notes == [f"paused in pdb (line {line})", f"paused in pdb (line {line})", ""]
    pauses = [e for e in events if isinstance(e, Paused)]
    assert [p.where.endswith(f":{line}") for p in pauses] == [True, True]
    assert "41" in pauses[1].text
    assert [e.stepping for e in events if isinstance(e, Resumed)] == [False]


def test_q_lets_the_rank_go_and_skips_its_later_breakpoints_until_begin(rank_3):
    events, writer = rank_3
    hits = []

    def work():
        for i in range(3):
            breakpoint()
            hits.append(i)

    prompts = Prompts({3: writer}, ask=lambda prompt: "q", say=lambda text: None)
    prompts.no_input = False
    thread = _in_a_rank(work)
    _serve(prompts, events, thread)
    assert hits == [0, 1, 2]  # no BdbQuit: the rank went on
    assert sum(isinstance(e, Paused) for e in events) == 1
    debugger.begin()  # a warm rank's next cell: breakpoints count again
    thread = _in_a_rank(lambda: breakpoint())
    _serve(prompts, events, thread)
    assert sum(isinstance(e, Paused) for e in events) == 2


def test_pythonbreakpoint_0_is_respected(rank_3, monkeypatch):
    events, _ = rank_3
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")
    breakpoint()
    assert events == []


@pytest.mark.parametrize("rays", ["ray.util.rpdb._driver_set_trace", "ray.util.rpdb.set_trace"])
def test_the_breakpoint_ray_sets_in_every_process_still_opens_our_prompt(rank_3, monkeypatch, rays):
    """ray.init writes PYTHONBREAKPOINT into the kernel (and Ray's workers): ranks inherit it,
    but it is Ray's default, not the user's choice, and Ray's debugger cannot reach the cell."""
    events, writer = rank_3
    monkeypatch.setenv("PYTHONBREAKPOINT", rays)
    prompts = Prompts({3: writer}, ask=lambda prompt: "c", say=lambda text: None)
    prompts.no_input = False
    thread = _in_a_rank(lambda: breakpoint())
    _serve(prompts, events, thread)
    assert sum(isinstance(e, Paused) for e in events) == 1


def test_a_rank_without_a_channel_says_so_and_continues(capsys):
    saved = sys.breakpointhook, pdb.set_trace
    events: list[object] = []
    debugger.install(5, CallbackSink(events.append), None)  # an XLA ordinal
    try:
        breakpoint()
    finally:
        sys.breakpointhook, pdb.set_trace = saved
        debugger._state = None
    assert events == []
    assert "rank 5: breakpoint() at" in capsys.readouterr().err
