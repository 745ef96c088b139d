"""processes.py: a rank's exit is noticed without reaping it, so its group is killed while the
rank's zombie still holds the pid (a reaped pid may be reused: killpg would hit a stranger)."""

from __future__ import annotations

import gc
import os
import time
from multiprocessing.connection import wait

import psutil
import pytest

from nbtrain.kernel.options.config import StartMethod
from nbtrain.kernel.procs import handles, processes, reaping


def exit_leaving_a_worker(stdout, stderr, events):
    """Like a rank whose DataLoader worker outlives it: a child in the rank's process group."""
    os.setpgid(0, 0)
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    os._exit(3)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_exit_is_seen_without_reaping_and_the_group_dies_before_the_pid_is_freed(method):
    def make_args(rank, pipes, close):
        return (pipes.stdout_w, pipes.stderr_w, pipes.events_w)

    [rank] = processes.start_ranks(StartMethod(method), [0], exit_leaving_a_worker, make_args)
    try:
        deadline = time.monotonic() + 60
        while not handles.has_exited(rank):
            assert time.monotonic() < deadline, "the rank never exited"
            time.sleep(0.01)
        assert _state(rank.pid) == "Z", "noticing the exit reaped the rank: its pid is free"
        workers = [p for p in psutil.process_iter() if _pgid(p.pid) == rank.pid]
        assert [p.pid for p in workers if p.pid != rank.pid], "the worker did not start"
        assert reaping.reap(rank) == 3
        assert not os.path.exists(f"/proc/{rank.pid}"), "reap() left the zombie"
        survivors = _running_after([p for p in workers if p.pid != rank.pid], timeout=10)
        assert survivors == [], "the rank's worker survived it"
    finally:
        reaping.stop([rank], grace=0.0)
        reaping.close([rank])


def test_the_watched_fd_wakes_at_the_exit_even_while_a_worker_holds_the_sentinel():
    """The watch loop waits on ``sentinel``: for our own child, a pidfd. The multiprocessing
    sentinel stays unreadable while the rank's forked worker holds its copy (the loop would
    only notice the exit at its next tick) and becomes readable before the exit can be
    waited for (the loop would spin)."""
    def make_args(rank, pipes, close):
        return (pipes.stdout_w, pipes.stderr_w, pipes.events_w)

    [rank] = processes.start_ranks(StartMethod.FORK, [0], exit_leaving_a_worker, make_args)
    pidfd = rank.pidfd
    try:
        assert wait([rank.sentinel], timeout=60), "the rank's exit did not wake the wait"
        assert handles.has_exited(rank), "woken before the exit could be waited for"
        assert not wait([rank.process.sentinel], timeout=0), "the worker let go of the sentinel"
    finally:
        reaping.stop([rank], grace=0.0)
        reaping.close([rank])
    with pytest.raises(OSError):
        os.fstat(pidfd)  # close() closed it


def exit_at_once(stdout, stderr, events):
    os._exit(0)


def test_a_rank_dropped_without_close_closes_its_pidfd():
    """A holder that never calls close() (a Ray node's rank host) leaks no pidfd."""
    def make_args(rank, pipes, close):
        return (pipes.stdout_w, pipes.stderr_w, pipes.events_w)

    [rank] = processes.start_ranks(StartMethod.FORK, [0], exit_at_once, make_args)
    pidfd = rank.pidfd
    assert pidfd is not None
    reaping.stop([rank], grace=0.0)
    rank.pipes.close_readers()
    del rank
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(pidfd)


def _running_after(workers: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those still running after ``timeout``. A killed worker is reparented to init or a
    subreaper, which reaps it when it likes: its zombie is dead, not a survivor."""
    deadline = time.monotonic() + timeout
    while True:
        running = [p for p in workers if _is_running(p)]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def _is_running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class _CountedFlushes:
    """sys.stdout / sys.stderr stand-in that counts its flushes (ipykernel's flush is a round
    trip to its IO thread: worth one per launch, not one per rank)."""

    def __init__(self) -> None:
        self.flushes = 0

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        self.flushes += 1


def flush_as_multiprocessing_does(stdout, stderr, events):
    """A rank about to start a process of its own: multiprocessing's flush still flushes here."""
    import sys
    from multiprocessing import util

    sys.stdout = counted = _CountedFlushes()
    util._flush_std_streams()
    os._exit(0 if counted.flushes == 1 else 5)


def test_the_kernel_flushes_its_streams_once_per_launch_and_a_rank_as_always(monkeypatch):
    def make_args(rank, pipes, close):
        return (pipes.stdout_w, pipes.stderr_w, pipes.events_w)

    out, err = _CountedFlushes(), _CountedFlushes()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    ranks = processes.start_ranks(
        StartMethod.FORK, [0, 1, 2, 3], flush_as_multiprocessing_does, make_args
    )
    try:
        assert (out.flushes, err.flushes) == (1, 1), "one flush per launch, not per rank"
        for rank in ranks:
            rank.process.join(timeout=60)
        assert [rank.process.exitcode for rank in ranks] == [0, 0, 0, 0]
    finally:
        reaping.stop(ranks, grace=0.0)
        reaping.close(ranks)
