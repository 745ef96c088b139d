"""A rank's handles in the kernel: its pipes, its process (ours, or a node's on another
machine), and whether it has exited, read without reaping it (reap() in reaping.py needs the
zombie to hold the pid)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol


@dataclass
class RankPipes:
    """The kernel's read ends and the rank's write ends of one rank's three pipes, and the
    one pipe the other way: the lines a human types at a rank's pdb prompt
    (kernel/group/pdbprompt.py), read by the rank only while it is paused at a breakpoint."""

    stdout_r: Connection
    stdout_w: Connection
    stderr_r: Connection
    stderr_w: Connection
    events_r: Connection
    events_w: Connection
    debug_r: Connection  # the rank's end
    debug_w: Connection  # the kernel's end

    @classmethod
    def create(cls, ctx: Any) -> RankPipes:
        pairs = [ctx.Pipe(duplex=False) for _ in range(4)]
        (out_r, out_w), (err_r, err_w), (evt_r, evt_w), (dbg_r, dbg_w) = pairs
        return cls(out_r, out_w, err_r, err_w, evt_r, evt_w, dbg_r, dbg_w)

    def reader_fds(self) -> tuple[int, int, int]:
        return self.stdout_r.fileno(), self.stderr_r.fileno(), self.events_r.fileno()

    def writer_fds(self) -> tuple[int, int, int]:
        return self.stdout_w.fileno(), self.stderr_w.fileno(), self.events_w.fileno()

    def rank_fds(self) -> tuple[int, ...]:
        """The ends a rank holds (its writers, and the debug pipe's reader)."""
        return (*self.writer_fds(), self.debug_r.fileno())

    def kernel_fds(self) -> tuple[int, ...]:
        """The ends the kernel holds (its readers, and the debug pipe's writer)."""
        return (*self.reader_fds(), self.debug_w.fileno())

    def close_writers(self) -> None:
        """The kernel, once the rank started: close the rank's ends."""
        for conn in (self.stdout_w, self.stderr_w, self.events_w, self.debug_r):
            conn.close()

    def close_readers(self) -> None:
        """The kernel, when the rank is done: close its own ends."""
        for conn in (self.stdout_r, self.stderr_r, self.events_r, self.debug_w):
            if not conn.closed:
                conn.close()


class RemoteProcess(Protocol):
    """A rank's process on another machine (a cluster backend's): whoever placed it answers.

    Its ``pid`` names a process of its node, so it is never signalled from here: ``send`` asks
    the node to. ``sentinel`` is a local fd that becomes readable once the rank ended (its
    output is then in its local pipes); ``join`` returns within a bounded time."""

    pid: int | None
    sentinel: int
    exitcode: int | None  # None while the rank runs

    def send(self, signum: int, *, group: bool) -> None: ...

    def join(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class RankProcess:
    rank: int
    process: BaseProcess | RemoteProcess
    pipes: RankPipes
    stop_requested_at: float | None = None
    stop_signalled_at: float | None = None  # wall clock (comparable to events' times)
    reaped: bool = False
    exitcode: int | None = field(default=None)
    signals_sent: set[int] = field(default_factory=set)  # by the launcher, to stop the rank
    group_pids: set[int] = field(default_factory=set)  # seen in its process group (see shm.py)
    pidfd: int | None = None  # our own child's (see exit_fd), closed by close()
    # Closes the pidfd once, by close() or when this object is collected (a holder that never
    # calls close(), as the process's own sentinel is closed with it).
    _pidfd_closer: Callable[[], Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.pidfd is not None:
            self._pidfd_closer = weakref.finalize(self, os.close, self.pidfd)

    def close_pidfd(self) -> None:
        if self._pidfd_closer is not None:
            self._pidfd_closer()  # (a finalizer runs at most once)
        self.pidfd = None

    def ended_by_launcher(self, exitcode: int | None) -> bool:
        """Did one of the launcher's own signals end this rank? A rank that exited by itself
        (os._exit(3), its own SIGKILL) just before a stop request was not stopped: its death is
        the root cause, even if a peer's lost-connection error reached the kernel first."""
        return exitcode is not None and exitcode < 0 and -exitcode in self.signals_sent

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None
        return pid

    @property
    def sentinel(self) -> int:
        """An fd that becomes readable once the rank has exited: its pidfd if it is our child
        (see exit_fd), else its process's sentinel."""
        return self.pidfd if self.pidfd is not None else self.process.sentinel


def exit_fd(process: BaseProcess) -> int | None:
    """A pidfd of our child ``process`` (Linux >= 5.3), or None. It becomes readable exactly
    when waitid can see the exit. The multiprocessing sentinel is no substitute for a watch
    loop: it becomes readable while the process is still being torn down (a few ms in which a
    loop waiting on it would spin, as has_exited still says no), and never while a forked
    DataLoader worker holds its inherited copy open."""
    pid = process.pid
    if pid is None or not hasattr(os, "pidfd_open") or peek_exit(pid) is None:
        return None  # not our child (a forkserver's), or no pidfds here
    try:
        return os.pidfd_open(pid)  # a zombie's pid is still ours: no reuse race
    except OSError:  # an older kernel, or a seccomp filter that denies it
        return None


def remote(rank_process: RankProcess) -> RemoteProcess | None:
    """The rank's handle if it runs on another machine (a cluster backend), else None."""
    process = rank_process.process
    return None if isinstance(process, BaseProcess) else process


def has_exited(rank_process: RankProcess) -> bool:
    """Has the rank ended? Never reaps it: reap() needs its zombie to hold the pid."""
    if rank_process.reaped:
        return True
    handle = remote(rank_process)
    if handle is not None:
        return handle.exitcode is not None
    peeked = peek_exit(rank_process.process.pid)
    if peeked is not None:
        return peeked
    # Not our child (the forkserver's: it reaps it and tells us the code) or no waitid here.
    return rank_process.process.exitcode is not None


def peek_exit(pid: int | None, *, block: bool = False) -> bool | None:
    """True if our child ``pid`` has exited, left unreaped; None where that cannot be known."""
    if pid is None or not hasattr(os, "waitid"):
        return None
    flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
    try:
        return os.waitid(os.P_PID, pid, flags) is not None
    except ChildProcessError:  # not our child, or already reaped
        return None
    except InterruptedError:
        return None
