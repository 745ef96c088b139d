"""Where each rank is (shared/stacks.py): the watch loop asks the running ranks for their
stacks (a timeout, a stuck warm cell, or ``where()``), collects the answers for
``stacks.WAIT`` seconds, and draws the picture: an asked rank's user frames and collective; the
others, why they were not asked.

A part of ``Supervisor`` (supervisor.py), mixed in; what it reads of the supervisor is declared
below.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from nbtrain.kernel.procs.handles import RankProcess
from nbtrain.kernel.procs.reaping import send_signal
from nbtrain.shared import stacks


class Whereabouts:
    """The where-is-each-rank half of ``Supervisor``."""

    ranks: list[RankProcess]
    _started: set[int]  # ranks that reported Started (their dump handler is registered)
    _reported: set[int]  # ranks that sent Finished/Failed
    # The stderr of each asked rank since the last request, until when the answers are awaited,
    # whether the request came before stopping the ranks (a timeout: the dumps are shown in the
    # cell) or from where() (only the picture is shown), and who waits for the picture.
    _dumps: dict[int, list[str]] | None = None
    _dump_until = 0.0
    _final = False
    _answers: list[Callable[[dict[int, stacks.RankStack]], None]]

    def ask_where(self, answer: Callable[[dict[int, stacks.RankStack]], None]) -> None:
        """Ask every running rank for its stacks; ``answer(picture)`` is called from this loop
        once they had stacks.WAIT seconds to answer (one request serves every asker)."""
        self._answers.append(answer)
        if self._dumps is None or time.monotonic() >= self._dump_until:
            self._request_stacks(None, final=False)

    def _request_stacks(self, ranks: set[int] | None, *, final: bool) -> None:
        self._dumps = {
            rp.rank: []
            for rp in self.ranks
            if (ranks is None or rp.rank in ranks) and self._ask_for_stack(rp)
        }
        self._dump_until = time.monotonic() + stacks.WAIT
        self._final = final

    def _answer_where(self) -> None:
        if not self._answers or time.monotonic() < self._dump_until:
            return
        answers, self._answers = self._answers, []
        picture = self.stuck_frames()
        for answer in answers:
            answer(picture)

    def _ask_for_stack(self, rank_process: RankProcess) -> bool:
        pid = rank_process.process.pid
        if stacks.DUMP_SIGNAL is None or pid is None or rank_process.reaped:
            return False
        if rank_process.rank not in self._started:
            return False  # its handler may not be registered yet: the signal would kill it
        return send_signal(rank_process, stacks.DUMP_SIGNAL)

    def stuck_frames(self) -> dict[int, stacks.RankStack]:
        """Where each rank was at the last request for stacks (after a timeout, or for
        where()): an asked rank's user frames and collective; the others, why not asked."""
        dumps = self._dumps or {}
        picture = {}
        for rank_process in self.ranks:
            rank = rank_process.rank
            if self._resting(rank):
                where = stacks.RankStack(note=self._outside(rank))
            elif rank in dumps:
                where = stacks.rank_stack(dumps[rank])
                if not where.frames:
                    where = stacks.RankStack(note=self._outside(rank))
            else:
                where = stacks.RankStack(note=self._unasked(rank_process))
            picture[rank] = where
        return picture

    def _resting(self, rank: int) -> bool:
        """Not asked, and nothing to ask: a warm rank outside the command (cell.py)."""
        return False

    def _outside(self, rank: int) -> str:
        return "outside the function (starting, or returned)"

    def _unasked(self, rank_process: RankProcess) -> str:
        if rank_process.reaped:
            return "exited"
        if rank_process.rank in self._reported:
            return "returned"
        if rank_process.rank not in self._started:
            return "starting"
        return "did not answer"
