"""Event records sent from the ranks to the kernel, and their framing on a pipe.

Transport only: small frozen records, a length-prefixed frame format, a writer for the rank side
and an incremental decoder for the kernel side. The kernel only ever reads these from pipes it
created for its own child processes, so unpickling them is safe.
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

_HEADER = struct.Struct("!Q")


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
class Progress:
    rank: int
    step: int
    total: int | None
    desc: str | None = None
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Log:
    rank: int
    values: dict[str, float]
    step: int | None = None
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Output:
    """One whole line a rank wrote to stdout or stderr (made on the kernel side)."""

    rank: int
    stream: str
    line: str
    time: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class Finished:
    rank: int
    result: bytes | None
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


@dataclass(frozen=True, slots=True)
class Exited:
    """A rank process ended (made on the kernel side from the process sentinel)."""

    rank: int
    exitcode: int | None
    signal: str | None
    stopped_by_launcher: bool
    time: float = field(default_factory=now)


Event = Started | Status | Progress | Log | Output | Finished | Failed | Exited


class EventSink(Protocol):
    def send(self, event: Event) -> None: ...


def encode(event: Event) -> bytes:
    payload = pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


class PipeWriter:
    """Rank side: writes whole frames to the kernel's pipe.

    Thread-safe (XLA replicas may be threads of one process). A forked grandchild (DataLoader
    worker) inherits the fd but must not write to it, or frames from two processes could interleave.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def send(self, event: Event) -> None:
        if os.getpid() != self._pid:
            return
        view = memoryview(encode(event))
        with self._lock:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]


class FrameDecoder:
    """Kernel side: turns arbitrary chunks read from a pipe into events."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[Event]:
        self._buffer += chunk
        events: list[Event] = []
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            events.append(pickle.loads(bytes(self._buffer[_HEADER.size : end])))
            del self._buffer[:end]
        return events

    @property
    def pending(self) -> int:
        return len(self._buffer)


class CallbackSink:
    """In-process sink (num_processes=1): hands events straight to a callback."""

    def __init__(self, callback: Callable[[Event], None]) -> None:
        self._callback = callback

    def send(self, event: Event) -> None:
        self._callback(event)
