"""Post-mortem of a failed rank, the kernel's half (the rank's: rank/debugger.py).

- ``FirstFailure``: in the watch loop of a ``debug=True`` launch, the first failed rank that
  opens its post-mortem keeps the prompt and its process (the others are stopped as after any
  failure); a later one is told ``q``.
- ``KeptFailures``: which warm ranks hold the frames of a failure, for ``%ranks_debug`` /
  ``ranks.debug()``, and which one to open by default (the root cause of the last failure).

The prompt itself is the one ``breakpoint()`` uses (pdbprompt.py); ``debug=`` is checked before
anything starts in options/debug.py.
"""

from __future__ import annotations

from nbtrain.kernel.group.outcome import Outcome
from nbtrain.kernel.procs.handles import RankProcess
from nbtrain.shared.errors import SessionError


class FirstFailure:
    """debug=True: the one failed rank whose post-mortem prompt the loop keeps open."""

    def __init__(self) -> None:
        self.rank: int | None = None

    def admit(self, rank_process: RankProcess) -> bool:
        """The first failed rank to pause, unless the launcher had signalled it (then its
        failure is a consequence of the stop)."""
        if self.rank is None and rank_process.stop_signalled_at is None:
            self.rank = rank_process.rank
        return self.rank == rank_process.rank


class KeptFailures:
    """Warm ranks whose last failure's frames are kept (rank/debugger.py: ``keep``)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.kept: dict[int, str] = {}  # rank -> "ZeroDivisionError: division by zero"
        self.last: int | None = None  # the root cause of the last command that failed

    def record(self, ranks: list[int], outcome: Outcome) -> None:
        """A command ended: its failed ranks now hold its frames (a later failure replaces an
        earlier one, as IPython's %debug). Bad input (no traceback) keeps nothing."""
        for rank in ranks:
            failure = outcome.records[rank].failure
            if failure is not None and failure.traceback.startswith("Traceback"):
                first = failure.message.splitlines()[0] if failure.message else ""
                self.kept[rank] = f"{failure.type_name}: {first}" if first else failure.type_name
        root = outcome.root_cause()
        if root is not None and root in self.kept:
            self.last = root

    def forget(self) -> None:
        """A new set of ranks: no frames are left."""
        self.kept.clear()
        self.last = None

    def choose(self, rank: object = None) -> int:
        """The rank to open: ``rank`` if it holds a failure, else the last root cause."""
        if rank is None:
            if not self.kept:
                raise SessionError(
                    "%ranks_debug: no failure to debug: no %%ranks cell or ranks.run(...) has "
                    "failed on these ranks since they started. Run it after a cell fails (as "
                    "%debug), or put breakpoint() in the cell to stop before the error."
                )
            return self.last if self.last is not None else min(self.kept)
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"ranks.debug({rank!r}): give a rank number, e.g. ranks.debug(1).")
        if not 0 <= rank < self.world_size:
            raise SessionError(
                f"%ranks_debug {rank}: there is no rank {rank}; the {self.world_size} warm "
                f"ranks are 0-{self.world_size - 1}. {self._which()}"
            )
        if rank not in self.kept:
            raise SessionError(
                f"%ranks_debug {rank}: rank {rank} has no failure to debug (its commands "
                f"succeeded since the ranks started). {self._which()}"
            )
        return rank

    def _which(self) -> str:
        if not self.kept:
            return "No rank has a failure to debug yet."
        ranks = ", ".join(f"rank {rank} ({what})" for rank, what in sorted(self.kept.items()))
        return f"With a failure to debug: {ranks}."
