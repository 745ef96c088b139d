"""Event records sent from the ranks to the kernel, and their framing on a pipe.

Transport only: small frozen records, a packet format, a writer for the rank side and an
incremental decoder for the kernel side. The kernel only ever reads these from pipes it created
for its own child processes, so unpickling them is safe.

Framing: each pickled event is cut into packets of at most PIPE_BUF bytes, each tagged with the
writing process's id. POSIX makes a write of at most PIPE_BUF bytes to a pipe atomic, so several
processes may share one pipe (torch_xla's per-chip processes, DataLoader workers calling
``nbtrain.log``) without ever interleaving inside a packet; the decoder reassembles per writer.
A frame's first and last packets are flagged: a frame cut short (a KeyboardInterrupt between two
packets of one send) is dropped when its writer's next frame begins, never glued to it.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

_PACKET = struct.Struct("!IIB")  # writer id (pid), payload length, flags (_LAST | _FIRST)
_LAST = 1
_FIRST = 2
_PIPE_BUF = getattr(select, "PIPE_BUF", 512)
_CHUNK = _PIPE_BUF - _PACKET.size


def now() -> float:
    """Wall-clock time: comparable across processes and across machines with synced clocks."""
    return time.time()


@dataclass(frozen=True, slots=True)
class Started:
    rank: int
    pid: int
    device: str
    host: str
    local_rank: int = 0
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Status:
    """A free-text phase such as 'waiting for nodes (1 of 2 joined)'."""

    rank: int
    text: str
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Paused:
    """The rank's pdb waits for a line (rank/debugger.py): ``text`` is what pdb wrote since
    its last prompt (where it stopped, the answer to the last command)."""

    rank: int
    text: str
    where: str  # "file:line" of the frame pdb stopped in
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Resumed:
    """The rank's pdb let the rank run again: ``stepping`` (n, s, r, ...) means it will
    pause again soon; else (c, q) the prompt is free for another rank."""

    rank: int
    text: str
    stepping: bool
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Strategy:
    """How the rank trains, when it is more than data parallel (e.g. 'fsdp2')."""

    rank: int
    name: str
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """The rank's GPU and the memory its caching allocator holds there (torch's reserved
    bytes: what this rank takes from the card), sent with progress while it changes."""

    rank: int
    name: str
    reserved: int
    total: int
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Tracked:
    """Where the run is recorded by one experiment tracker (a TensorBoard log dir, an MLflow
    run, a W&B run dir or URL): the dashboard's summary names it."""

    rank: int
    where: str
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Progress:
    rank: int
    step: int
    total: int | None
    desc: str | None = None  # what the view shows: outer loops as a prefix ('epoch 2/3 · train')
    time: float = field(default_factory=now)
    loop: str | None = None  # the innermost loop's own description (None: same as desc)
    # The enclosing loops, outermost first: (iterations completed before the current one,
    # total or None). With every total known the view can tell the whole run's ETA.
    outer: tuple[tuple[int, int | None], ...] = ()
    start: int = 0  # steps of this pass done before it began (a resumed run): not this run's
    # Optimizer steps this rank's Accelerator really took so far (not accumulation micro-steps,
    # not steps the fp16 grad scaler skipped): the view's rate counts these. 0: none (raw loops).
    optimizer_steps: int = 0


@dataclass(frozen=True, slots=True)
class Log:
    rank: int
    values: dict[str, float]
    step: int | None = None
    time: float = field(default_factory=now)
    # Points logged before (values, step) since the rank's last update, oldest first: one
    # event carries an interval's points, and every point reaches the chart.
    earlier: tuple[tuple[int, dict[str, float]], ...] = ()


@dataclass(frozen=True, slots=True)
class Output:
    """One whole line a rank wrote to stdout or stderr (made on the kernel side)."""

    rank: int
    stream: str
    line: str
    time: float = field(default_factory=now)
    dump: bool = False  # part of a stack dump the launcher asked for (a timeout)
    aside: bool = False  # part of a dump where() asked for: the rank's log only (stacks.py)


@dataclass(frozen=True, slots=True)
class Display:
    """Rich output a rank displayed (``display()``, ``plt.show()``): a mime bundle for the cell.
    ``display_id`` and ``update`` follow IPython's display updates, per rank."""

    rank: int
    data: dict[str, Any]
    metadata: dict[str, Any]
    display_id: str | None = None
    update: bool = False
    time: float = field(default_factory=now)
    # The number of the mark the rank wrote to its stdout and stderr just before (0: none):
    # the kernel shows the display between the lines written before and after it.
    mark: int = 0


@dataclass(frozen=True, slots=True)
class Finished:
    rank: int
    result: bytes | None
    time: float = field(default_factory=now)
    # Non-daemon threads / child processes still running when the function returned: the
    # process cannot exit before they end (named if the launcher has to stop it).
    lingering: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Stopped:
    """The rank saved the checkpoint of a graceful stop and left its function there."""

    rank: int
    step: int
    path: str
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Failed:
    rank: int
    type_name: str
    message: str
    traceback: str
    exception: bytes | None
    exitcode: int
    collateral: bool
    time: float = field(default_factory=now)
    # Set by the kernel: raised after the launcher had asked this rank to stop (a SIGTERM
    # handler that raises), so a consequence of the stop, never a root cause.
    after_stop: bool = False


@dataclass(frozen=True, slots=True)
class Exited:
    """A rank process ended (made on the kernel side from the process sentinel)."""

    rank: int
    exitcode: int | None
    signal: str | None
    stopped_by_launcher: bool  # one of the launcher's own signals ended it
    time: float = field(default_factory=now)
    stop_requested: bool = False  # the launcher had asked it to stop (it may have ended first)


@dataclass(frozen=True, slots=True)
class ResumedFrom:
    """The run resumed from a checkpoint (``source``: its folder's name) after ``step``
    optimizer steps: the dashboard's header and summary say so."""

    rank: int
    source: str
    step: int
    time: float = field(default_factory=now)


Event = (
    Started
    | Status
    | ResumedFrom
    | Paused
    | Resumed
    | Strategy
    | GpuUsage
    | Tracked
    | Progress
    | Log
    | Output
    | Display
    | Finished
    | Stopped
    | Failed
    | Exited
)


class EventSink(Protocol):
    def send(self, event: Event) -> None: ...


def encode(event: Event, writer: int = 0) -> list[bytes]:
    """The packets of one event, each small enough to be written atomically."""
    payload = pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
    pieces = [payload[i : i + _CHUNK] for i in range(0, len(payload), _CHUNK)] or [b""]
    last = len(pieces) - 1
    return [
        _PACKET.pack(writer, len(p), (_LAST if i == last else 0) | (_FIRST if i == 0 else 0)) + p
        for i, p in enumerate(pieces)
    ]


class PipeWriter:
    """Rank side: writes events to the kernel's pipe, safely from any thread or process."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()  # keeps one thread's packets of a frame together
        self._nonblocking_fd: int | None = None
        self._nonblocking_pid = 0

    def send(self, event: Event) -> None:
        packets = encode(event, os.getpid())
        with self._lock:
            for packet in packets:
                os.write(self._fd, packet)  # blocking pipe, <= PIPE_BUF: all or nothing

    def try_send(self, event: Event) -> bool:
        """Send without ever blocking; False if the kernel is behind and the pipe is full.

        For updates that a later one supersedes (progress): a slow kernel must never stall
        training. Only single-packet events qualify (a multi-packet frame must not be abandoned
        halfway); larger ones go through the blocking send.
        """
        packets = encode(event, os.getpid())
        fd = self._nonblocking() if len(packets) == 1 else None
        if fd is None:
            self.send(event)
            return True
        with self._lock:
            try:
                os.write(fd, packets[0])  # <= PIPE_BUF: written whole or not at all
            except BlockingIOError:
                return False
        return True

    def _nonblocking(self) -> int | None:
        """A second, non-blocking description of the same pipe (O_NONBLOCK set on the shared one
        would make the blocking sends fail instead). Opened once per process, via /proc."""
        if self._nonblocking_pid != os.getpid():
            self._nonblocking_pid = os.getpid()
            try:
                self._nonblocking_fd = os.open(
                    f"/proc/self/fd/{self._fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
                )
            except OSError:  # no /proc (macOS): fall back to blocking sends
                self._nonblocking_fd = None
        return self._nonblocking_fd


class FrameDecoder:
    """Kernel side: turns arbitrary chunks read from a pipe into events.

    A frame that cannot be used (cut short, or not unpicklable) never stops the decoding of the
    frames after it: it is described in ``problems`` for the caller to report.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._frames: dict[int, bytearray] = {}  # writer id -> frame so far
        self.problems: list[str] = []

    def feed(self, chunk: bytes) -> list[Event]:
        self._buffer += chunk
        events: list[Event] = []
        offset = 0
        while len(self._buffer) - offset >= _PACKET.size:
            writer, length, flags = _PACKET.unpack_from(self._buffer, offset)
            end = offset + _PACKET.size + length
            if len(self._buffer) < end:
                break
            if flags & _FIRST and self._frames.get(writer):
                del self._frames[writer]
                self.problems.append(f"an event from process {writer} was cut short and dropped")
            frame = self._frames.setdefault(writer, bytearray())
            frame += self._buffer[offset + _PACKET.size : end]
            offset = end
            if flags & _LAST:
                event = self._load(writer, bytes(self._frames.pop(writer)))
                if event is not None:
                    events.append(event)
        del self._buffer[:offset]
        return events

    def _load(self, writer: int, frame: bytes) -> Event | None:
        try:
            event: Event = pickle.loads(frame)
            return event
        except Exception as exc:
            self.problems.append(
                f"an event from process {writer} could not be decoded "
                f"({type(exc).__name__}: {exc}) and was dropped"
            )
            return None

    def take_problems(self) -> list[str]:
        problems, self.problems = self.problems, []
        return problems

    @property
    def pending(self) -> int:
        return len(self._buffer) + sum(len(frame) for frame in self._frames.values())


class CallbackSink:
    """In-process sink (num_processes=1): hands events straight to a callback."""

    def __init__(self, callback: Callable[[Event], None]) -> None:
        self._callback = callback

    def send(self, event: Event) -> None:
        self._callback(event)
