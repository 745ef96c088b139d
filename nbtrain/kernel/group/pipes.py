"""The pipes of a group's ranks (stdout, stderr, framed events), read without ever blocking.

Every pipe is read in whatever chunks are available, so a rank that dies mid-message or a huge
result can never stall the watch loop (supervisor.py), and at most READ_BUDGET bytes per pass:
a rank printing in a tight loop cannot keep the loop from its other duties (timeout, peers'
failures, redraws). Lines and events go to the Supervisor; the lines a pipe's end leaves
unfinished go straight to the output order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from nbtrain.kernel.procs.handles import RankProcess
from nbtrain.shared.events import Event, FrameDecoder, Output
from nbtrain.shared.lines import LineSplitter

READ_SIZE = 1 << 16  # bytes per read
READ_BUDGET = 4 * READ_SIZE  # bytes read from one pipe per pass of the loop (unbounded at the end)


@dataclass
class Stream:
    rank: int
    kind: str  # "stdout" | "stderr" | "events"
    fd: int
    splitter: LineSplitter = field(default_factory=LineSplitter)
    decoder: FrameDecoder = field(default_factory=FrameDecoder)
    open: bool = True


class Pipes:
    """``lines(rank, kind, lines)``: complete lines of stdout/stderr; ``event(rank, event)``:
    each decoded event (``rank``: the process's); ``flushed(output)``: a pipe's last partial
    line, and the protocol's complaints."""

    def __init__(
        self,
        ranks: list[RankProcess],
        *,
        lines: Callable[[int, str, list[str]], None],
        event: Callable[[int, Event], None],
        flushed: Callable[[Output], None],
    ) -> None:
        self._lines, self._event, self._flushed = lines, event, flushed
        self._streams: dict[int, Stream] = {}
        for rank_process in ranks:
            out, err, evt = rank_process.pipes.reader_fds()
            for kind, fd in (("stdout", out), ("stderr", err), ("events", evt)):
                self._streams[fd] = Stream(rank_process.rank, kind, fd)

    def open_fds(self) -> list[int]:
        return [s.fd for s in self._streams.values() if s.open]

    def read(self, fd: int) -> bool:
        """A pipe the poller found ready (not one of ours: nothing). True if it held more than
        a pass's budget: a backlog (a big result, a flood of lines) still waits in it."""
        if fd in self._streams:
            return self._pump(self._streams[fd], budget=READ_BUDGET)
        return False

    def read_rank(self, rank: int, *, outputs_only: bool = False) -> None:
        """What ``rank``'s pipes hold: all of it (it exited: everything it wrote is there), or
        ``outputs_only``, a budget's worth of its lines (a display's marks, written before)."""
        for stream in self._streams.values():
            if stream.rank != rank:
                continue
            if not outputs_only:
                self._pump(stream)
            elif stream.kind != "events":
                self._pump(stream, budget=READ_BUDGET)

    def drain(self) -> None:
        """Read what is left in every pipe and flush partial lines (after all ranks ended)."""
        for stream in self._streams.values():
            self._pump(stream)
            self._flush(stream)

    def _flush(self, stream: Stream) -> None:
        if stream.kind != "events":
            for line in stream.splitter.flush():
                self._flushed(Output(stream.rank, stream.kind, line))

    def _pump(self, stream: Stream, budget: int | None = None) -> bool:
        """Read what the pipe holds (at most ``budget`` bytes; all of it when None). True if
        the budget ran out before the pipe did."""
        taken = 0
        while stream.open and (budget is None or taken < budget):
            try:
                chunk = os.read(stream.fd, READ_SIZE)
            except BlockingIOError:
                return False
            except OSError:
                chunk = b""
            if not chunk:
                stream.open = False
                self._flush(stream)
                return False
            taken += len(chunk)
            if stream.kind != "events":
                self._lines(stream.rank, stream.kind, stream.splitter.feed(chunk))
                continue
            for event in stream.decoder.feed(chunk):
                self._event(stream.rank, event)
            for problem in stream.decoder.take_problems():  # the frames after it still count
                self._flushed(Output(stream.rank, "stderr", f"[nbtrain] protocol error: {problem}"))
        return stream.open  # (the budget ran out with the pipe still open)
