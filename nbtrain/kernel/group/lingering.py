"""Ranks that reported their ending but whose process has not exited: when to stop them.

A rank's result is in once it sent Finished/Failed; its process should then exit by itself.
Interpreter shutdown waits for non-daemon threads (and multiprocessing for non-daemon children):
one left running would keep the launch from ever returning, so the Supervisor stops such a
process after ``exit_wait`` and says why. An XLA host process speaks for several ordinals: it is
done once every ordinal it named as started has reported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from nbtrain.kernel.procs.handles import RankProcess

# Seconds a rank that reported Finished/Failed may take to exit by itself.
EXIT_WAIT = 10.0  # generous: a loaded machine can take seconds to finalize a spawned rank
MAX_LOAD_FACTOR = 6.0  # the most a busy machine stretches EXIT_WAIT (a rank naming nothing)


class Lingering:
    """Per process (key: its rank): the ranks its events named as started and as reported,
    when all of them had reported, and what still ran in it when its function returned."""

    def __init__(self, process_ranks: Iterable[int], exit_wait: float) -> None:
        self.exit_wait = exit_wait
        self._speaks_for: dict[int, set[int]] = {rank: set() for rank in process_ranks}
        self._done_for: dict[int, set[int]] = {rank: set() for rank in self._speaks_for}
        self._done_at: dict[int, float] = {}
        self._names: dict[int, tuple[str, ...]] = {}

    def started(self, process_rank: int, rank: int) -> None:
        self._speaks_for[process_rank].add(rank)
        self._update(process_rank)

    def reported(self, process_rank: int, rank: int, names: tuple[str, ...] = ()) -> None:
        """``rank`` (run by ``process_rank``) sent its ending; ``names``: what still ran."""
        self._done_for[process_rank].add(rank)
        if names:
            self._names[process_rank] = names
        self._update(process_rank)

    def _update(self, process_rank: int) -> None:
        done = self._done_for[process_rank]
        # (a process that reported nothing yet, only a start-up phase, is not done)
        if done and self._speaks_for[process_rank] <= done:
            self._done_at.setdefault(process_rank, time.monotonic())
        else:
            self._done_at.pop(process_rank, None)  # an XLA host: another ordinal started

    def overdue(self, processes: dict[int, RankProcess]) -> list[tuple[RankProcess, str]]:
        """The processes to stop now, each with why (for its stderr). A rank that named what
        keeps it alive (a non-daemon thread or child) gets ``exit_wait``; one that named
        nothing is only slow to shut down (a busy machine): its wait grows with the machine's
        load, and the note blames nothing of the user's."""
        now = time.monotonic()
        due = []
        load_factor = _load_factor() if self._done_at else 1.0  # (one system call, not one a rank)
        for rank, done_at in list(self._done_at.items()):
            rank_process = processes[rank]
            names = self._names.get(rank, ())
            wait = self.exit_wait * (1.0 if names else load_factor)
            if now - done_at < wait or rank_process.reaped or rank_process.stop_requested_at:
                continue
            del self._done_at[rank]
            if names:
                why = (
                    f"did not exit within {wait:g}s ({', '.join(names)} still running); "
                    "stopped it. Make such threads daemon=True or join them before returning."
                )
            else:
                why = (
                    f"its process was still shutting down after {wait:.0f}s (nothing of the "
                    f"function's was left running; machine load {_load():.1f}); stopped it."
                )
            due.append((rank_process, f"[nbtrain] rank {rank} returned, but {why}"))
        return due


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average here (Windows)
        return 0.0


def _load_factor() -> float:
    """How much slower than idle this machine runs: load per core, 1 at most idle."""
    cores = os.cpu_count() or 1
    return min(MAX_LOAD_FACTOR, max(1.0, _load() / cores))
