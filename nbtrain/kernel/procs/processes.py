"""Rank processes: start them under fork / forkserver / spawn, watch them, stop them for good.

Each rank is a non-daemonic child (so it may start DataLoader workers) that makes itself the
leader of its own process group; stopping a rank signals the whole group, so its DataLoader
workers go with it. Stopping is bounded: SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

import torch.multiprocessing as torch_mp

from nbtrain.kernel.procs import fork_gc, forkserver, shm, signal_hold
from nbtrain.shared.frontend import Frontend, frontend
from nbtrain.shared.options import StartMethod

_SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)


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
    if pid is None or not hasattr(os, "pidfd_open") or _peek_exit(pid) is None:
        return None  # not our child (a forkserver's), or no pidfds here
    try:
        return os.pidfd_open(pid)  # a zombie's pid is still ours: no reuse race
    except OSError:  # an older kernel, or a seccomp filter that denies it
        return None


def context(method: StartMethod) -> Any:
    ctx = torch_mp.get_context(method.value)
    if method is StartMethod.FORKSERVER:
        # Takes effect when the forkserver first starts (then later launches reuse it warm).
        ctx.set_forkserver_preload(forkserver.SERVER_PRELOAD)
    return ctx


def starting_phase(method: StartMethod, count: int) -> str:
    """What starting ``count`` ranks by ``method`` will spend its seconds on, said before it blocks
    (the view cannot redraw while the kernel waits for a fork or for the forkserver); '' when
    that is only a fork of a kernel that has imported everything already."""
    if method is StartMethod.SPAWN:
        return "starting Python"
    if method is StartMethod.FORKSERVER:
        return "" if forkserver.warm() else "starting Python, importing torch (forkserver)"
    cold = [name for name in fork_imports(count) if name not in sys.modules]
    if not cold:
        return ""
    # torch._dynamo alone (a launch in Run All, before the warm-up's last step): say which
    what = "torch._dynamo" if cold == ["torch._dynamo"] else "torch"
    return f"importing {what} {_forking_process()}"


def _forking_process() -> str:
    """Where a fork launch imports torch, in the words of where the user is: a script that
    calls notebook_launcher has no kernel, and its one launch is no "first" one."""
    kind = frontend()
    if kind is Frontend.JUPYTER:
        return "in the kernel (first launch only)"
    if kind is Frontend.IPYTHON:
        return "in IPython (first launch only)"
    return "before forking the ranks"


def fork_imports(count: int) -> list[str]:
    """What a fork launch of ``count`` ranks imports into the kernel first: what every rank
    imports anyway (torch, the rank side, torch._dynamo, which any optimizer imports), once, as
    the forkserver preloads it; the ranks, and every later launch's, inherit it. Also while the
    warm-up has torch._dynamo still to come ("Run All"): leaving it to the ranks made each
    launch's ranks import it again, at the same time; Run All with two launches took 18.2 s that
    way against 11.1 s (benchmarks/runall.py, issue 42)."""
    return list(forkserver.PRELOAD)


def start_ranks(
    method: StartMethod,
    ranks: Sequence[int],
    target: Callable[..., None],
    make_args: Callable[[int, RankPipes, tuple[int, ...]], tuple],
) -> list[RankProcess]:
    """Start one process per rank; ``make_args(rank, pipes, fds_to_close)`` builds its args.

    Under fork, each child inherits every pipe of every rank; it is told which fds to close.
    Under forkserver / spawn only the pipes passed as arguments reach the child.
    """
    ctx = context(method)
    if method is StartMethod.FORK:
        for module in fork_imports(len(ranks)):
            importlib.import_module(module)
    all_pipes = {rank: RankPipes.create(ctx) for rank in ranks}
    started: list[RankProcess] = []
    try:
        # A Ctrl-C during a fork would be raised in an at-fork callback and lost: held, then
        # raised here, after the loop (signal_hold.py), so the ranks started are stopped below.
        with signal_hold.held(), fork_gc.kernel_objects_frozen(method):
            fds = _fd_numbers(all_pipes) if method is StartMethod.FORK else None
            for rank in ranks:
                pipes = all_pipes[rank]
                foreign = _foreign_fds(fds, rank) if fds is not None else ()
                process = ctx.Process(
                    target=target,
                    args=make_args(rank, pipes, foreign),
                    name=f"nbtrain-rank-{rank}",
                    daemon=False,
                )
                with forkserver.main_module_not_inherited(method):
                    process.start()
                _claim_group(process, method)
                started.append(RankProcess(rank, process, pipes, pidfd=exit_fd(process)))
        _note_served(method)
    except BaseException:
        stop(started, grace=0.0)
        close_pidfds(started)
        for pipes in all_pipes.values():
            pipes.close_writers()
            pipes.close_readers()
        raise
    for pipes in all_pipes.values():
        pipes.close_writers()
    for rank_process in started:
        for fd in rank_process.pipes.reader_fds():
            os.set_blocking(fd, False)
    return started


def _note_served(method: StartMethod) -> None:
    if method is StartMethod.FORKSERVER:
        forkserver.served()


def _fd_numbers(all_pipes: dict[int, RankPipes]) -> tuple[list[int], dict[int, tuple[int, ...]]]:
    """Every rank's pipe ends as numbers, asked once: each fork child gets the list of the
    others' (64 ranks: 64 x 448 fileno() calls were 0.1 s of the launch)."""
    kernel = [fd for pipes in all_pipes.values() for fd in pipes.kernel_fds()]
    return kernel, {rank: pipes.rank_fds() for rank, pipes in all_pipes.items()}


def _foreign_fds(
    fds: tuple[list[int], dict[int, tuple[int, ...]]], own: int
) -> tuple[int, ...]:
    kernel, by_rank = fds
    return (*kernel, *(fd for rank, ends in by_rank.items() if rank != own for fd in ends))


def _claim_group(process: BaseProcess, method: StartMethod) -> None:
    # The child also calls setpgid itself; doing it here too closes the window in which a fork
    # child has not yet run that line. Other start methods exec or use another parent: the
    # child's own call is the one that counts there.
    if method is StartMethod.FORK and process.pid is not None:
        with contextlib.suppress(OSError):
            os.setpgid(process.pid, process.pid)


def remote(rank_process: RankProcess) -> RemoteProcess | None:
    """The rank's handle if it runs on another machine (a cluster backend), else None."""
    process = rank_process.process
    return None if isinstance(process, BaseProcess) else process


def send_signal(rank_process: RankProcess, signum: int) -> bool:
    """Signal the rank alone (not its DataLoader workers), wherever it runs; False if it could
    not be (gone, not ours)."""
    handle = remote(rank_process)
    if handle is not None:
        handle.send(signum, group=False)
        return True
    pid = rank_process.process.pid
    if pid is None:
        return False
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_rank(rank_process: RankProcess, signum: int) -> None:
    """Signal the rank's process group (its DataLoader workers) and the rank itself."""
    pid = rank_process.process.pid
    if pid is None or rank_process.reaped:
        return
    if rank_process.stop_signalled_at is None:
        rank_process.stop_signalled_at = time.time()
    handle = remote(rank_process)
    if handle is not None:  # its node signals the group, as below
        rank_process.signals_sent.add(signum)
        handle.send(signum, group=True)
        return
    assert isinstance(rank_process.process, BaseProcess)
    if not hasattr(os, "killpg"):  # Windows: no process groups or POSIX signals
        # Both end in TerminateProcess, which multiprocessing reports as -SIGTERM.
        rank_process.signals_sent.add(signal.SIGTERM)
        if signum == _SIGKILL:
            rank_process.process.kill()
        else:
            rank_process.process.terminate()
        return
    rank_process.signals_sent.add(signum)
    if not _may_signal(rank_process, pid):
        return
    rank_process.group_pids |= shm.group_members(pid)
    # One signal each: the rank leads its own group (itself and its DataLoader workers). Not
    # killpg and kill both: a rank whose SIGTERM handler raises would get a second SIGTERM
    # while handling the first, and die without reporting.
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:  # no group yet (the rank makes it first thing): the rank alone
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    except PermissionError:
        pass


def request_stop(rank_process: RankProcess, *, terminate: bool = True) -> None:
    """Start the bounded stop: SIGTERM now (unless ``terminate`` is False), SIGKILL after the
    grace period (see kill_overdue)."""
    if rank_process.stop_requested_at is None and not rank_process.reaped:
        rank_process.stop_requested_at = time.monotonic()
        if terminate:
            signal_rank(rank_process, signal.SIGTERM)


def kill_overdue(ranks: Iterable[RankProcess], grace: float) -> None:
    now = time.monotonic()
    for rank_process in ranks:
        asked = rank_process.stop_requested_at
        if asked is not None and not rank_process.reaped and now - asked >= grace:
            signal_rank(rank_process, _SIGKILL)


def has_exited(rank_process: RankProcess) -> bool:
    """Has the rank ended? Never reaps it: reap() needs its zombie to hold the pid."""
    if rank_process.reaped:
        return True
    handle = remote(rank_process)
    if handle is not None:
        return handle.exitcode is not None
    peeked = _peek_exit(rank_process.process.pid)
    if peeked is not None:
        return peeked
    # Not our child (the forkserver's: it reaps it and tells us the code) or no waitid here.
    return rank_process.process.exitcode is not None


def _peek_exit(pid: int | None, *, block: bool = False) -> bool | None:
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


def reap(rank_process: RankProcess) -> int | None:
    """Collect an exited rank. Stray descendants still in its group (DataLoader workers) are
    killed first, but only while the group id cannot name anyone else's group."""
    if rank_process.reaped:
        return rank_process.exitcode
    handle = remote(rank_process)
    if handle is not None:  # its node reaps it (and its group)
        handle.join()
        rank_process.exitcode, rank_process.reaped = handle.exitcode, True
        return rank_process.exitcode
    pid = rank_process.process.pid
    if pid is not None and hasattr(os, "killpg") and _group_is_ours(pid):
        # The rank is dead: only its group's stray workers can still make a name, and they are
        # killed now. Whose names are in /dev/shm is read from the names' pids, not from every
        # process's stat (milliseconds per rank on a busy machine). Looked at again after the
        # kill, while the rank's zombie still reserves the group id: a name made in between
        # belongs to a worker still running or a zombie, whose stat still names the group.
        rank_process.group_pids |= shm.segment_makers(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, _SIGKILL)
        rank_process.group_pids |= shm.segment_makers(pid)
    rank_process.process.join()
    rank_process.exitcode = rank_process.process.exitcode
    rank_process.reaped = True
    if pid is not None:
        shm.remove_segments(rank_process.group_pids | {pid})  # all of them are dead by now
    return rank_process.exitcode


def _group_is_ours(pid: int) -> bool:
    """May killpg(pid) be sent after the rank ended? Our own child's zombie holds the pid until
    we reap it (waitid with WNOWAIT waits for the exit without reaping it)."""
    if _peek_exit(pid, block=True):
        return True
    return _pid_unused(pid)


def _may_signal(rank_process: RankProcess, pid: int) -> bool:
    """May ``pid`` (and group ``pid``) be signalled? Yes while it is our child (running, or a
    zombie we have not reaped) or still running; a forkserver rank is reaped by the server."""
    if _peek_exit(pid) is not None or rank_process.process.exitcode is None:
        return True
    return _pid_unused(pid)


def _pid_unused(pid: int) -> bool:
    """No process has this pid: then the number can only name the rank's leftover group (a pid
    stays reserved while a process group uses it as its id). If a process has it, the pid was
    reused, and the rank's group is empty: nothing of ours to signal."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def stop(ranks: Sequence[RankProcess], grace: float) -> None:
    """Terminate, wait up to ``grace`` seconds, kill, and reap every rank. Always returns."""
    for rank_process in ranks:
        request_stop(rank_process)
    deadline = time.monotonic() + grace
    # Wait without reaping (not join): reap() kills the group while the zombie holds the pid.
    running = [rp for rp in ranks if not has_exited(rp)]
    while running and time.monotonic() < deadline:
        time.sleep(0.01)
        running = [rp for rp in running if not has_exited(rp)]
    for rank_process in ranks:
        if not rank_process.reaped:
            if not has_exited(rank_process):
                signal_rank(rank_process, _SIGKILL)
            reap(rank_process)


def close(ranks: Sequence[RankProcess]) -> None:
    close_pidfds(ranks)
    for rank_process in ranks:
        rank_process.pipes.close_readers()
        with contextlib.suppress(ValueError):
            rank_process.process.close()


def close_pidfds(ranks: Sequence[RankProcess]) -> None:
    for rank_process in ranks:
        rank_process.close_pidfd()
