"""The kernel's watch loop over running ranks: read pipes, notice exits, stop on failure.

Single-threaded and non-blocking: every pipe is read in whatever chunks are available, so a rank
that dies mid-message, a chatty rank or a huge result can never stall the loop, and a kernel
interrupt is handled at once.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from . import stacks
from .errors import signal_name
from .events import Event, Exited, Failed, Finished, FrameDecoder, Output, Started
from .processes import RankProcess, kill_overdue, reap, request_stop

TICK = 0.05  # seconds: the loop wakes at least this often to refresh the view and check limits
MAX_LINE = 1 << 16  # a "line" longer than this is emitted in pieces rather than held forever


class LineSplitter:
    """Bytes in, whole lines out. A carriage return keeps only what a terminal would show."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes) -> list[str]:
        text = self._partial + self._decoder.decode(data)
        *lines, self._partial = text.split("\n")
        if len(self._partial) > MAX_LINE:
            lines.append(self._partial)
            self._partial = ""
        return [line.rsplit("\r", 1)[-1] if "\r" in line else line for line in lines]

    def flush(self) -> list[str]:
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [rest.rsplit("\r", 1)[-1]] if rest else []


@dataclass
class _Stream:
    rank: int
    kind: str  # "stdout" | "stderr" | "events"
    fd: int
    splitter: LineSplitter = field(default_factory=LineSplitter)
    decoder: FrameDecoder = field(default_factory=FrameDecoder)
    open: bool = True


class Supervisor:
    def __init__(
        self,
        ranks: list[RankProcess],
        emit: Callable[[Event], None],
        *,
        failed: Callable[[], bool],
        grace: float,
    ) -> None:
        self.ranks = ranks
        self._emit = emit
        self._failed = failed
        self._grace = grace
        self._streams: dict[int, _Stream] = {}
        for rank_process in ranks:
            out, err, evt = rank_process.pipes.reader_fds()
            for kind, fd in (("stdout", out), ("stderr", err), ("events", evt)):
                self._streams[fd] = _Stream(rank_process.rank, kind, fd)
        self.timed_out = False
        self.stopping = False
        self._started: set[int] = set()
        self._dumps: dict[int, list[str]] | None = None  # stderr after asking for stacks
        self._dump_until = 0.0
        self._reported: set[int] = (
            set()
        )  # ranks that sent Finished/Failed: already on their way out

    def run(self, deadline: float | None, tick: Callable[[], None]) -> None:
        """Return when every rank has exited and been reaped."""
        while any(not rp.reaped for rp in self.ranks):
            self._step(deadline)
            tick()

    def _step(self, deadline: float | None) -> None:
        by_sentinel = {rp.sentinel: rp for rp in self.ranks if not rp.reaped}
        watched = [s.fd for s in self._streams.values() if s.open] + list(by_sentinel)
        for ready in wait(watched, timeout=self._wait_time(deadline)):
            assert isinstance(ready, int)
            if ready in self._streams:
                self._pump(self._streams[ready])
        # A failure that arrived as an event stops the others before exits are collected, so a
        # rank that reported it and already exited still counts as asked to stop (the view shows
        # a peer-loss rank as stopped, not failed).
        if not self.stopping and self._failed():
            self.stop_all()
        for sentinel, rank_process in by_sentinel.items():
            if rank_process.process.exitcode is not None or _is_ready(sentinel):
                self._collect(rank_process)
        if not self.stopping and self._failed():
            self.stop_all()
        if deadline is not None and not self.stopping and time.monotonic() >= deadline:
            self._time_out()
        kill_overdue(self.ranks, self._grace)

    def _time_out(self) -> None:
        """First ask the ranks still running where they are (see stacks.py), then stop them."""
        if self._dumps is None:
            self._dumps = {rp.rank: [] for rp in self.ranks if self._ask_for_stack(rp)}
            self._dump_until = time.monotonic() + stacks.WAIT
        if not self._dumps or time.monotonic() >= self._dump_until:
            self.timed_out = True
            self.stop_all()

    def _ask_for_stack(self, rank_process: RankProcess) -> bool:
        pid = rank_process.process.pid
        if stacks.DUMP_SIGNAL is None or pid is None or rank_process.reaped:
            return False
        if rank_process.rank not in self._started:
            return False  # its handler may not be registered yet: the signal would kill it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, stacks.DUMP_SIGNAL)
            return True
        return False

    def stuck_frames(self) -> dict[int, list[str]]:
        """After a timeout: each asked rank's innermost user frames (see stacks.user_frames)."""
        return {rank: stacks.user_frames(lines) for rank, lines in (self._dumps or {}).items()}

    def stop_all(self) -> None:
        """SIGTERM the ranks still working; ranks that already reported get the grace period to
        exit by themselves (their own exit code is the truthful one) before SIGKILL."""
        self.stopping = True
        for rank_process in self.ranks:
            request_stop(rank_process, terminate=rank_process.rank not in self._reported)

    def _emit_event(self, event: Event) -> None:
        if isinstance(event, (Finished, Failed)):
            self._reported.add(event.rank)
        elif isinstance(event, Started):
            self._started.add(event.rank)
        self._emit(event)

    def _wait_time(self, deadline: float | None) -> float:
        if deadline is None:
            return TICK
        if self._dumps is not None:
            deadline = self._dump_until
        return max(0.0, min(TICK, deadline - time.monotonic()))

    def _collect(self, rank_process: RankProcess) -> None:
        # Everything the rank wrote before it died is already in its pipes: read it first, so
        # its Finished/Failed event is known before its exit is.
        for stream in self._streams.values():
            if stream.rank == rank_process.rank:
                self._pump(stream)
        exitcode = reap(rank_process)
        signal = signal_name(-exitcode) if exitcode is not None and exitcode < 0 else None
        self._emit(
            Exited(
                rank_process.rank,
                exitcode,
                signal,
                stopped_by_launcher=rank_process.ended_by_launcher(exitcode),
                stop_requested=rank_process.stop_requested_at is not None,
            )
        )

    def drain(self) -> None:
        """Read what is left in every pipe and flush partial lines (after all ranks ended)."""
        for stream in self._streams.values():
            self._pump(stream)
            if stream.kind != "events":
                for line in stream.splitter.flush():
                    self._emit(Output(stream.rank, stream.kind, line))

    def _pump(self, stream: _Stream) -> None:
        while stream.open:
            try:
                chunk = _read(stream.fd)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                stream.open = False
                if stream.kind != "events":
                    for line in stream.splitter.flush():
                        self._emit(Output(stream.rank, stream.kind, line))
                return
            if stream.kind == "events":
                for event in stream.decoder.feed(chunk):
                    self._emit_event(event)
            else:
                for line in stream.splitter.feed(chunk):
                    self._emit(Output(stream.rank, stream.kind, line))
                    if self._dumps is not None and stream.kind == "stderr":
                        self._dumps.get(stream.rank, []).append(line)


def _read(fd: int) -> bytes:
    import os

    return os.read(fd, 1 << 16)


def _is_ready(sentinel: int) -> bool:
    return bool(wait([sentinel], timeout=0))
