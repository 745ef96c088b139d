"""A rank's printed lines and its displays, put back in the order the rank made them.

A rank process writes its stdout, its stderr and its events (``Display`` among them) to three
pipes, which the kernel reads in whatever order they become ready: a line printed after a figure
could be shown above it. So a rank that displays something first writes a mark, a line that only
nbtrain writes (``lines.mark_line``), straight to its stdout and stderr descriptors, then sends the
``Display`` carrying the mark's number (rank/notebook.py). Here, per process:

- a stream's lines before its mark are shown at once; from its mark on, the stream waits;
- a display is shown once every stream has reached its mark; the waiting streams then go on.

A mark that never comes (the rank pointed its descriptors elsewhere, or died in between) holds
nothing forever: what waited longer than PATIENCE seconds is let through (``expire``), and
``release`` lets everything through once the rank's pipes are drained.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nbtrain.shared.events import Display, Output
from nbtrain.shared.lines import parse_mark

STREAMS = ("stdout", "stderr")
PATIENCE = 2.0  # seconds a display or a stream waits for its other half


@dataclass
class _Stream:
    waiting: int | None = None  # the mark this stream reached, whose display is not shown yet
    since: float = 0.0
    held: list[Output] = field(default_factory=list)  # lines after the mark, in order


@dataclass
class _Process:
    streams: dict[str, _Stream] = field(default_factory=lambda: {s: _Stream() for s in STREAMS})
    displays: dict[int, tuple[Display, float]] = field(default_factory=dict)  # mark -> waiting
    shown: set[int] = field(default_factory=set)  # marks whose display went out


class OutputOrder:
    """Lines and displays of each rank process in, the same in the rank's own order out."""

    def __init__(self, emit: Callable[[Output | Display], None]) -> None:
        self._emit = emit
        self._processes: dict[int, _Process] = {}
        # The processes holding something back: expire() runs every pass of the watch loop and
        # looks at these alone, not at every rank (issue 44).
        self._holding: set[int] = set()

    def line(self, process: int, line: Output) -> None:
        """A whole line read from a process's stdout or stderr pipe."""
        state = self._process(process)
        if line.stream not in state.streams:
            self._emit(line)
            return
        self._take(state, line)
        self._advance(state)
        self._note(process, state)

    def display(self, process: int, event: Display) -> None:
        state = self._process(process)
        if not event.mark or event.mark in state.shown:
            self._emit(event)  # no mark (a rank in the kernel's process), or waited too long
            return
        state.displays[event.mark] = (event, time.monotonic())
        self._advance(state)
        self._note(process, state)

    def expire(self) -> None:
        """Let through what waited more than PATIENCE seconds for its other half."""
        if not self._holding:
            return
        limit = time.monotonic() - PATIENCE
        for process in list(self._holding):
            state = self._processes[process]
            late = [mark for mark, (_, since) in state.displays.items() if since < limit]
            late += [s.waiting for s in state.streams.values()
                     if s.waiting is not None and s.since < limit]
            for mark in sorted(late):
                self._show(state, mark)
            self._advance(state)
            self._note(process, state)

    def release(self, process: int | None = None) -> None:
        """Let everything held through (of ``process``, or of all): no more is coming."""
        keys = list(self._processes) if process is None else [process]
        for key in keys:
            state = self._processes.get(key)
            if state is None:
                continue
            while marks := [*state.displays, *(s.waiting for s in state.streams.values()
                                               if s.waiting is not None)]:
                self._show(state, min(marks))
            self._holding.discard(key)

    def _note(self, process: int, state: _Process) -> None:
        if state.displays or any(s.waiting is not None for s in state.streams.values()):
            self._holding.add(process)
        else:
            self._holding.discard(process)

    def _process(self, process: int) -> _Process:
        state = self._processes.get(process)
        if state is None:
            state = self._processes[process] = _Process()
        return state

    def _take(self, state: _Process, line: Output) -> None:
        stream = state.streams[line.stream]
        if stream.waiting is not None:
            stream.held.append(line)
            return
        text, mark = parse_mark(line.line)
        if mark is None:
            self._emit(line)
            return
        if text:  # a partial line the rank had printed before the display
            self._emit(dataclasses.replace(line, line=text))
        if mark not in state.shown:  # a late mark of a display already let through: dropped
            stream.waiting, stream.since = mark, time.monotonic()

    def _advance(self, state: _Process) -> None:
        """Show each display whose mark every stream has reached, oldest first."""
        while state.displays:
            mark = min(state.displays)
            if any(stream.waiting != mark for stream in state.streams.values()):
                return
            self._show(state, mark)

    def _show(self, state: _Process, mark: int) -> None:
        """The display numbered ``mark`` goes out (if it came); the streams that waited at its
        mark go on with their held lines (up to their next mark)."""
        entry = state.displays.pop(mark, None)
        state.shown.add(mark)
        if entry is not None:
            self._emit(entry[0])
        for stream in state.streams.values():
            if stream.waiting == mark:
                held, stream.held, stream.waiting = stream.held, [], None
                for line in held:
                    self._take(state, line)
