"""The watch of warm ranks: one command (a cell) at a time on processes that stay.

The same loop as a launch's (supervisor.py), with a command's rules: the watch ends once each
rank of the command reported (not exited); a rank that exits breaks the world (every rank is
stopped: the session restarts); a failure or an interrupt gives the others STUCK_GRACE to
report, past which their stacks are asked for and every rank is stopped (they were stuck).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from nbtrain.kernel.group.ending import Ending
from nbtrain.kernel.group.supervisor import BUSY, TICK, Supervisor
from nbtrain.shared.events import Event

# Seconds the other ranks of a command get to finish (or fail) after one failed, and to return
# to idle after an interrupt, before they count as stuck.
STUCK_GRACE = 1.0


class CellSupervisor(Supervisor):
    """A Supervisor for warm ranks (``RankGroup(warm=True)``): ``begin_cell`` before each
    command."""

    _cell: frozenset[int] = frozenset()  # the ranks of the current command (none before the first)
    _grace_from: float | None = None  # when one failed or they were interrupted
    _stuck = False  # some stayed busy past the grace: every rank was stopped

    def begin_cell(self, ranks: set[int], emit: Callable[[Event], None],
                   failed: Callable[[], bool]) -> None:
        """A new command runs on ``ranks``: the watch ends once each of them reported
        Finished/Failed for it. The pipes' decoders carry over; the rest is new."""
        self._cell = frozenset(ranks)
        self._emit, self._failed = emit, failed
        self._reported.clear()
        self._started.clear()
        self._dumps, self._grace_from, self._final = None, None, False
        self._answers.clear()
        self._timed_out = self._interrupted = self._stuck = self._stop_asked = False
        self._asked.clear()
        self.prompts.paused_for = 0.0
        self._read_at = -BUSY  # a command's replies are a burst of their own (Supervisor._pace)
        self._active()

    @property
    def running(self) -> bool:
        """Some rank of the command has not reported yet (stopping them: not exited yet)."""
        if self._stopping:
            return super().running
        return not self._cell <= self._reported

    def ending(self) -> Ending:
        return dataclasses.replace(super().ending(), broken=self._stopping, stuck=self._stuck)

    def interrupt(self) -> bool:
        """Those not back within STUCK_GRACE count as stuck."""
        interrupted = super().interrupt()
        self._start_grace()
        return interrupted

    def _waiting(self) -> set[int]:
        return set(self._cell - self._reported)

    def _start_grace(self) -> None:
        if self._grace_from is None:
            self._grace_from = time.monotonic()

    def _stop_on_failure(self) -> None:
        """A failure gives the others the grace to report (``_watch``), not a stop."""

    def _watch(self, deadline: float | None, *, sweep: bool) -> None:
        if self._stopping:
            return
        if any(rp.reaped for rp in self.ranks):
            self.stop_all()
            return
        if self._failed():
            self._start_grace()
        if deadline is not None and time.monotonic() >= deadline and not self._interrupted:
            self._timed_out = True
            self.interrupt()
        if self._grace_from is not None and time.monotonic() - self._grace_from >= STUCK_GRACE:
            self._stop_stuck()

    def _stop_stuck(self) -> None:
        if not self._final:
            self._request_stacks(self._waiting(), final=True)
        if not self._dumps or time.monotonic() >= self._dump_until:
            self._stuck = True
            self.stop_all()

    def _wait_time(self, deadline: float | None) -> float:
        if self._grace_from is not None or self._dumps is not None:
            return TICK
        return super()._wait_time(deadline)

    def _resting(self, rank: int) -> bool:
        return rank not in self._waiting()

    def _outside(self, rank: int) -> str:
        if self._resting(rank):
            return "idle (between cells)" if rank not in self._cell else "returned"
        return super()._outside(rank)
