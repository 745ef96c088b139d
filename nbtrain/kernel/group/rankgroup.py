"""RankGroup: one set of rank processes, from start to close, for every launch kind.

The interface, in the order a user of the group calls it::

    group = RankGroup(backend)              # warm=True: ranks that serve one command at a time
    group.start(emit, failed)               # place the ranks, open the channel (Supervisor)
    group.begin(ranks, emit, failed)        # warm: a new command's ranks and listeners
    with group.stopped_on_error(ending):    # whatever escapes: stop every rank, ending(exc)
        end = group.wait(deadline, tick, interrupts)  # THE watch (Ctrl-C by Interrupts):
                                            # how it ended (ending.py), its stacks included
    group.stacks()                          # where each rank was, asked at a timeout
    group.stop(wait=...)                    # terminate, GRACE, kill; reap
    group.close()                           # pipes, processes, then the backend's own
    group.shutdown()                        # stop + close, Ctrl-C held meanwhile

Each turn of the watch is ``Supervisor.turn`` (supervisor.py: reads the pipes, notices exits,
stops on a failure or the deadline; cell.py: a warm command's rules); the group is the only
caller that turns it, in ``wait`` or, for torch's elastic agent, one ``turn`` at a time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from nbtrain.kernel.group.backend import Backend
from nbtrain.kernel.group.cell import CellSupervisor
from nbtrain.kernel.group.ending import Ending
from nbtrain.kernel.group.interrupts import Interrupts, sigint_deferred
from nbtrain.kernel.group.supervisor import EXIT_WAIT, Supervisor
from nbtrain.kernel.procs import handles, reaping
from nbtrain.shared.events import Event
from nbtrain.shared.stacks import RankStack

GRACE = 2.0  # seconds between SIGTERM and SIGKILL when stopping ranks (read at each use)

__all__ = ["EXIT_WAIT", "GRACE", "RankGroup"]


def _nothing() -> None:
    pass


class RankGroup:
    """The rank processes of one launch (or of a warm session), placed by ``backend``."""

    def __init__(self, backend: Backend, *, warm: bool = False) -> None:
        """``warm``: the ranks stay between commands (``begin``); what they write after a
        command belongs to none, so stopping them reads nothing more."""
        self.backend = backend
        self.warm = warm
        self.processes: list[handles.RankProcess] = []
        self.supervisor: Supervisor | None = None
        self.closed = False

    def start(self, emit: Callable[[Event], None], failed: Callable[[], bool]) -> Supervisor:
        """Start the ranks and open their channel: the Supervisor that feeds ``emit`` every
        event and stops every rank once ``failed()`` (EXIT_WAIT, GRACE: read now)."""
        self.processes = self.backend.start()
        kind = CellSupervisor if self.warm else Supervisor
        self.supervisor = kind(
            self.processes, emit, failed=failed, grace=GRACE, exit_wait=EXIT_WAIT
        )
        return self.supervisor

    def begin(
        self, ranks: set[int], emit: Callable[[Event], None], failed: Callable[[], bool]
    ) -> None:
        """Warm ranks: a command runs on ``ranks``; ``wait`` returns once each reported."""
        channel = self.channel
        assert isinstance(channel, CellSupervisor), "begin() is for a warm group"
        channel.begin_cell(ranks, emit, failed)

    def wait(
        self,
        deadline: float | None,
        tick: Callable[[], None],
        interrupts: Interrupts,
        *,
        first: Callable[[], None] = _nothing,
        redraw: Callable[[], None] = _nothing,
    ) -> Ending:
        """The one watch: until every rank exited (warm: reported the command), with ``tick``
        after every turn and Ctrl-C as ``interrupts`` says; how it ended. ``first`` runs under
        that policy already (the warm ranks' commands are sent there); ``redraw`` draws the
        view at once, before a rank's pdb prompt (pdbprompt.py) holds the loop."""
        supervisor = self.channel
        supervisor.prompts.ready = redraw
        with interrupts.handling(supervisor) as check:
            first()

            def turned() -> None:
                check()
                tick()

            while supervisor.turn(deadline, turned) is None:
                pass
        supervisor.drain()
        return supervisor.ending()  # (after the last of the pipes was read)

    def turn(self, deadline: float | None, tick: Callable[[], None] = _nothing) -> Ending | None:
        """One turn of the watch, for callers whose loop is someone else's (torch's agent):
        how it ended once it has, else None."""
        return self.channel.turn(deadline, tick)

    @contextlib.contextmanager
    def stopped_on_error(self, ending: Callable[[BaseException], None]) -> Iterator[None]:
        """Whatever escapes the block (Ctrl-C, an error in the kernel) stops every rank first
        (a second Ctrl-C meanwhile is held, then raised), then ``ending(exc)`` says so, then the
        group is closed and the exception goes on."""
        try:
            yield
        except BaseException as exc:
            with sigint_deferred():
                self.stop()
                ending(exc)
                self.close()
            raise

    def stacks(self) -> dict[int, RankStack]:
        """Where each rank asked at a timeout (or stuck in a command) was: its user frames."""
        return self.supervisor.stuck_frames() if self.supervisor is not None else {}

    def exited(self) -> list[handles.RankProcess]:
        """The ranks that have ended (warm ranks: one that died between commands)."""
        return [rp for rp in self.processes if handles.has_exited(rp)]

    def stop(self, *, wait: float = 0.0) -> None:
        """Give the ranks ``wait`` seconds to leave by themselves (asked by the caller), then
        terminate, kill after GRACE, and reap; a one-shot group reads what they wrote last."""
        if self.closed:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and len(self.exited()) < len(self.processes):
            time.sleep(0.01)
        reaping.stop(self.processes, GRACE)
        if self.supervisor is not None and not self.warm:
            self.supervisor.drain()

    def shutdown(self) -> None:
        """``stop`` then ``close``, a Ctrl-C meanwhile held, then raised (idempotent): how the
        elastic agent ends each attempt's group, whatever ended it."""
        with sigint_deferred():
            self.stop()
            self.close()

    def close(self) -> None:
        """Close the pipes and the process handles, then free the backend's own (idempotent)."""
        if self.closed:
            return
        self.closed = True
        reaping.close(self.processes)
        self.backend.close()

    @property
    def channel(self) -> Supervisor:
        """The Supervisor reading the ranks' pipes (how the watch ended: ``wait``'s value)."""
        if self.supervisor is None:
            raise RuntimeError("the rank group was not started: call start() first")
        return self.supervisor
