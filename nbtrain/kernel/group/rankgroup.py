"""RankGroup: one set of rank processes, from start to close, for every launch kind.

The interface, in the order a user of the group calls it::

    group = RankGroup(backend)              # warm=True: ranks that serve one command at a time
    group.start(emit, failed)               # place the ranks, open the channel (Supervisor)
    group.begin(ranks, emit, failed)        # warm: a new command's ranks and listeners
    with group.stopped_on_error(ending):    # whatever escapes: stop every rank, ending(exc)
        group.watch(deadline, tick, interrupts)   # THE watch loop (Ctrl-C by Interrupts)
    group.stacks()                          # where each rank was, asked at a timeout
    group.stop(wait=...)                    # terminate, GRACE, kill; reap
    group.close()                           # pipes, processes, then the backend's own

The loop itself is ``Supervisor.run`` (supervisor.py: reads the pipes, notices exits, stops on a
failure or the deadline); the group is the only caller that starts it for a launch or a command.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from nbtrain.kernel.group.backend import Backend
from nbtrain.kernel.group.interrupts import Interrupts, sigint_deferred
from nbtrain.kernel.group.supervisor import EXIT_WAIT, Supervisor
from nbtrain.kernel.procs import processes
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
        self.processes: list[processes.RankProcess] = []
        self.supervisor: Supervisor | None = None
        self.closed = False

    def start(self, emit: Callable[[Event], None], failed: Callable[[], bool]) -> Supervisor:
        """Start the ranks and open their channel: the Supervisor that feeds ``emit`` every
        event and stops every rank once ``failed()`` (EXIT_WAIT, GRACE: read now)."""
        self.processes = self.backend.start()
        self.supervisor = Supervisor(
            self.processes, emit, failed=failed, grace=GRACE, exit_wait=EXIT_WAIT
        )
        return self.supervisor

    def begin(
        self, ranks: set[int], emit: Callable[[Event], None], failed: Callable[[], bool]
    ) -> None:
        """Warm ranks: a command runs on ``ranks``; ``watch`` returns once each reported."""
        self.channel.begin_cell(ranks, emit, failed)

    def watch(
        self,
        deadline: float | None,
        tick: Callable[[], None],
        interrupts: Interrupts,
        *,
        first: Callable[[], None] = _nothing,
        redraw: Callable[[], None] = _nothing,
    ) -> None:
        """The one watch loop: until every rank exited (warm: reported the command), with
        ``tick`` after every turn and Ctrl-C as ``interrupts`` says. ``first`` runs under that
        policy already (the warm ranks' commands are sent there); ``redraw`` draws the view
        at once, before a rank's pdb prompt (pdbprompt.py) holds the loop."""
        supervisor = self.channel
        supervisor.prompts.ready = redraw
        with interrupts.handling(supervisor) as check:
            first()

            def turn() -> None:
                check()
                tick()

            supervisor.run(deadline, turn)
        supervisor.drain()

    def step(self, deadline: float | None) -> None:
        """One turn of the loop, for callers whose loop is someone else's (torch's agent)."""
        self.channel.step(deadline)

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

    def exited(self) -> list[processes.RankProcess]:
        """The ranks that have ended (warm ranks: one that died between commands)."""
        return [rp for rp in self.processes if processes.has_exited(rp)]

    def stop(self, *, wait: float = 0.0) -> None:
        """Give the ranks ``wait`` seconds to leave by themselves (asked by the caller), then
        terminate, kill after GRACE, and reap; a one-shot group reads what they wrote last."""
        if self.closed:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and len(self.exited()) < len(self.processes):
            time.sleep(0.01)
        processes.stop(self.processes, GRACE)
        if self.supervisor is not None and not self.warm:
            self.supervisor.drain()

    def close(self) -> None:
        """Close the pipes and the process handles, then free the backend's own (idempotent)."""
        if self.closed:
            return
        self.closed = True
        processes.close(self.processes)
        self.backend.close()

    @property
    def channel(self) -> Supervisor:
        """The Supervisor reading the ranks' pipes (its flags: stopping, timed_out, ...)."""
        if self.supervisor is None:
            raise RuntimeError("the rank group was not started: call start() first")
        return self.supervisor
