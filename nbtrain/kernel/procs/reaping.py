"""Ending ranks for good: signal a rank (its whole process group: its DataLoader workers go
with it), the bounded stop (SIGTERM, a grace period, then SIGKILL), reaping (with the stray
workers' shared-memory names), closing the kernel's ends."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Sequence
from multiprocessing.process import BaseProcess

from nbtrain.kernel.procs import shm
from nbtrain.kernel.procs.handles import RankProcess, has_exited, peek_exit, remote

_SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)


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
    if peek_exit(pid, block=True):
        return True
    return _pid_unused(pid)


def _may_signal(rank_process: RankProcess, pid: int) -> bool:
    """May ``pid`` (and group ``pid``) be signalled? Yes while it is our child (running, or a
    zombie we have not reaped) or still running; a forkserver rank is reaped by the server."""
    if peek_exit(pid) is not None or rank_process.process.exitcode is None:
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
