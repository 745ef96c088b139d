"""The kernel's watch loop over running ranks: read pipes, notice exits, stop on failure.

Started only through a ``RankGroup`` (group/): ``RankGroup.wait`` turns it for a launch or a
warm command and returns how it ended (ending.py); torch's elastic agent turns it from its own
loop (``RankGroup.turn``). The rules of a warm command (one cell on ranks that stay) are the
subclass in cell.py.

Single-threaded and non-blocking (the pipes: pipes.py), so a kernel interrupt is handled at
once.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable

from nbtrain.kernel.group.ending import Ending, How
from nbtrain.kernel.group.fdwait import Poller
from nbtrain.kernel.group.lingering import EXIT_WAIT, Lingering
from nbtrain.kernel.group.outorder import OutputOrder
from nbtrain.kernel.group.pdbprompt import Prompts
from nbtrain.kernel.group.pipes import Pipes
from nbtrain.kernel.group.postmortem import FirstFailure
from nbtrain.kernel.group.whereabouts import Whereabouts
from nbtrain.kernel.procs.handles import RankProcess, has_exited
from nbtrain.kernel.procs.reaping import kill_overdue, reap, request_stop, send_signal
from nbtrain.shared import stacks
from nbtrain.shared.errors import signal_name
from nbtrain.shared.events import (
    Display,
    Event,
    Exited,
    Failed,
    Finished,
    Output,
    Paused,
    Resumed,
    Started,
    Stopped,
    now,
)
from nbtrain.shared.stopping import STOP_SIGNAL

TICK = 0.05  # seconds: the loop wakes at least this often to refresh the view and check limits
MIN_PASS = 0.02  # seconds: in a busy loop, a pass that read something is followed no sooner
BUSY = 0.05  # seconds of passes that each read something: then the loop is busy (see _pace)

__all__ = ["BUSY", "EXIT_WAIT", "TICK", "Supervisor"]


class Supervisor(Whereabouts):
    def __init__(
        self,
        ranks: list[RankProcess],
        emit: Callable[[Event], None],
        *,
        failed: Callable[[], bool],
        grace: float,
        exit_wait: float = EXIT_WAIT,
    ) -> None:
        self.ranks = ranks
        self._emit = emit
        self._failed = failed
        self._grace = grace
        self._poller = Poller()  # registered once: wait() would rebuild it every pass
        # A rank's lines and displays come through separate pipes: put back in its order.
        self._order = OutputOrder(lambda event: self._emit(event))
        self._pipes = Pipes(ranks, lines=self._lines, event=self._emit_event,
                            flushed=lambda output: self._order.line(output.rank, output))
        self._processes = {rank_process.rank: rank_process for rank_process in ranks}
        # How the watch is ending (read through ending(), once it has).
        self._timed_out = self._stopping = self._interrupted = self._stop_asked = False
        self._started: set[int] = set()
        self._swept = 0.0  # when step() last looked at every rank
        self._busy_until = 0.0  # a busy loop's next pass: not before then (see step)
        self._busy_since = 0.0  # passes have read something since then, none BUSY apart
        self._read_at = -BUSY  # when a pass last read something
        self._dumps, self._dump_until, self._final, self._answers = None, 0.0, False, []  # where
        # Progress: when a rank last said anything (an event or a line of output; not the
        # stacks it was asked for), and the pdb prompt's time then (not the run's time).
        self.active_at = time.monotonic()
        self.paused_then = 0.0
        self._reported: set[int] = set()  # ranks that sent Finished/Failed: on their way out
        self._lingering = Lingering(self._processes, exit_wait)
        self._asked: set[int] = set()  # ranks asked to stop gracefully (ask_to_stop)
        # breakpoint() in a rank: its pdb prompt, asked from this loop (pdbprompt.py)
        self.prompts = Prompts({rp.rank: rp.pipes.debug_w for rp in ranks})
        self._post_mortem = FirstFailure()  # debug=True: the failed rank whose prompt stays

    def turn(self, deadline: float | None, tick: Callable[[], None]) -> Ending | None:
        """One turn of the watch: the loop's step, ``tick`` (before a prompt: the view shows
        the rank paused while the human types), a rank's pdb prompt; how the watch ended once
        it has (every rank exited and was reaped; warm: reported the command), else None."""
        self.step(deadline)
        tick()
        self.prompts.turn()
        return None if self.running else self.ending()

    @property
    def running(self) -> bool:
        """Some rank has not exited (or not been reaped) yet."""
        return any(not rp.reaped for rp in self.ranks)

    def ending(self) -> Ending:
        """How the watch ended (ending.py: the first reason that applies)."""
        if self._timed_out:
            how = How.TIMED_OUT
        elif self._interrupted:
            how = How.INTERRUPTED
        elif self._stop_asked:
            how = How.STOPPED
        elif self._failed():
            how = How.FAILED
        else:
            how = How.SUCCEEDED
        return Ending(how, stacks=self.stuck_frames())

    def interrupt(self) -> bool:
        """Ctrl-C for the ranks alone (warm ranks: their command is interrupted, the processes
        stay): KeyboardInterrupt in every rank still working. False: they already were."""
        if self._interrupted:
            return False
        self._interrupted = True
        for rank_process in self.ranks:
            if rank_process.rank in self._waiting():
                send_signal(rank_process, signal.SIGINT)  # the rank alone, not its workers
        return True

    def ask_to_stop(self) -> bool:
        """A graceful stop (on_interrupt="checkpoint"): each rank still working is asked to
        save at its next optimizer step and leave (shared/stopping.py). A rank whose handler
        is not installed yet (not Started) is asked as soon as it starts. False: it was asked
        already, or the ranks were interrupted (nothing more to ask)."""
        if self._stop_asked or self._interrupted:
            return False
        self._stop_asked = True
        self._ask_pending()
        return True

    def _ask_pending(self) -> None:
        if STOP_SIGNAL is None:
            return
        for rank_process in self.ranks:
            rank = rank_process.rank
            if rank in self._asked or rank not in self._started or rank in self._reported:
                continue
            if rank_process.reaped:
                continue
            self._asked.add(rank)
            # The rank alone: its DataLoader workers have no part in it.
            send_signal(rank_process, STOP_SIGNAL)

    def _waiting(self) -> set[int]:
        """The ranks whose ending this watch still waits for."""
        return {rp.rank for rp in self.ranks} - self._reported

    def step(self, deadline: float | None) -> None:
        """One pass of the loop (at most about TICK seconds): read, collect exits, apply the
        rules (``_watch``), kill what overstayed its stop."""
        if deadline is not None:  # a human at a rank's pdb prompt: not the run's time
            deadline += self.prompts.paused_for
        by_sentinel = {rp.sentinel: rp for rp in self.ranks if not rp.reaped}
        watched = self._pipes.open_fds() + list(by_sentinel)
        if self._stop_asked:
            self._ask_pending()
        if (rest := self._busy_until - time.monotonic()) > 0:
            time.sleep(rest)
        ready = self._poller.wait(watched, self._wait_time(deadline))
        backlog = False
        for fd in ready:
            backlog = self._pipes.read(fd) or backlog
        self._pace(bool(ready), backlog)
        self._order.expire()
        # A failure that arrived as an event stops the others before exits are collected, so a
        # rank that reported it and already exited still counts as asked to stop (the view shows
        # a peer-loss rank as stopped, not failed).
        self._stop_on_failure()
        # What looks at every rank runs at most once a TICK, not on every pass: with 64 ranks
        # logging, events wake the loop ~100 times a second (issue 44). A rank whose sentinel
        # woke it is looked at at once.
        sweep = time.monotonic() - self._swept >= TICK
        if sweep:
            self._swept = time.monotonic()
        for rank_process in by_sentinel.values() if sweep else _woken(by_sentinel, ready):
            # Not the sentinel alone: a rank's forked DataLoader workers hold it open. Nor
            # process.exitcode, which would reap the rank before reap() could use its pid.
            if has_exited(rank_process):
                self._collect(rank_process)
        self._answer_where()
        self._watch(deadline, sweep=sweep)
        if sweep:
            kill_overdue(self._killable(), self._grace)

    def _pace(self, read: bool, backlog: bool) -> None:
        """Many ranks keep a pipe ready nearly all the time: once passes have read something
        for BUSY seconds (never BUSY apart), each waits out MIN_PASS before the next, so it
        reads what several ranks sent (issue 44). A burst shorter than that (a warm cell's
        replies, a failure and its peers' exits) is read as it comes; so is a pipe holding more
        than a pass reads (a big result through the pipe: its budget a pass, MIN_PASS apart,
        would be 13 MB a second)."""
        now = time.monotonic()
        if not read:
            return
        if now - self._read_at > BUSY:  # the loop was idle, or not turning (between cells)
            self._busy_since = now
        self._read_at = now
        if now - self._busy_since >= BUSY and not backlog:
            self._busy_until = now + MIN_PASS

    def _stop_on_failure(self) -> None:
        if not self._stopping and self._failed():
            self.stop_all()

    def _watch(self, deadline: float | None, *, sweep: bool) -> None:
        """A launch's rules: a failure stops every rank; so does the deadline, once the ranks
        were asked where they are; a rank that returned but does not exit is stopped (looked
        for on a ``sweep``)."""
        self._stop_on_failure()
        if deadline is not None and not self._stopping and time.monotonic() >= deadline:
            self._time_out()
        for rank_process, why in self._lingering.overdue(self._processes) if sweep else ():
            self._emit(Output(rank_process.rank, "stderr", why))
            request_stop(rank_process)

    def _killable(self) -> list[RankProcess]:
        """Not a failed rank at its post-mortem prompt (debug=True): its stop waits for it."""
        return [
            rp for rp in self.ranks
            if not (rp.rank in self._reported and self.prompts.holds(rp.rank))
        ]

    def _post_mortem_event(self, event: Paused | Resumed, process_rank: int) -> None:
        """A failed rank's pdb (debug=True): the first keeps the prompt, a later one is told
        q; once it ends, the rank gets the grace period to exit from then."""
        rank_process = self._processes[process_rank]
        if isinstance(event, Paused) and not self._post_mortem.admit(rank_process):
            self.prompts.dismiss(event.rank)
            return
        self.prompts.take(event)
        if isinstance(event, Resumed) and rank_process.stop_requested_at is not None:
            rank_process.stop_requested_at = time.monotonic()

    def _time_out(self) -> None:
        """First ask the ranks still running where they are (see stacks.py), then stop them."""
        if not self._final:
            self._request_stacks(None, final=True)
        if not self._dumps or time.monotonic() >= self._dump_until:
            self._timed_out = True
            self.stop_all()

    def _active(self) -> None:
        self.active_at, self.paused_then = time.monotonic(), self.prompts.paused_for

    def idle_for(self) -> float:
        """Seconds since any rank last said anything, less the time a human spent at a pdb
        prompt meanwhile (hang detection: a paused rank is not a hung one)."""
        paused = self.prompts.paused_for - self.paused_then
        return time.monotonic() - self.active_at - paused

    def stop_all(self) -> None:
        """SIGTERM the ranks still working; ranks that already reported get the grace period to
        exit by themselves (their own exit code is the truthful one) before SIGKILL."""
        self._stopping = True
        for rank_process in self.ranks:
            request_stop(rank_process, terminate=rank_process.rank not in self._reported)

    def _emit_event(self, process_rank: int, event: Event) -> None:
        self._active()
        if isinstance(event, (Paused, Resumed)) and event.rank in self._reported:
            self._post_mortem_event(event, process_rank)
            return
        if self.prompts.take(event):
            return
        if isinstance(event, Display):
            # Its marks are in the stdout and stderr pipes already (written before it).
            self._pipes.read_rank(process_rank, outputs_only=True)
            self._order.display(process_rank, event)
            return
        rank_process = self._processes[process_rank]
        if isinstance(event, Failed) and _after_stop(event, rank_process):
            # Its SIGTERM handler raised (some libraries turn SIGTERM into an exception): a
            # consequence of the stop, shown as stopped, never the root cause.
            event = dataclasses.replace(event, after_stop=True, collateral=True)
        if isinstance(event, (Finished, Failed, Stopped)):
            self.prompts.forget(event.rank)
            self._reported.add(event.rank)
            names = event.lingering if isinstance(event, Finished) else ()
            self._lingering.reported(process_rank, event.rank, names)
        elif isinstance(event, Started):
            self._started.add(event.rank)
            self._lingering.started(process_rank, event.rank)
        self._emit(event)

    def _wait_time(self, deadline: float | None) -> float:
        if deadline is None:
            return TICK
        if self._dumps is not None and self._final:
            deadline = self._dump_until
        return max(0.0, min(TICK, deadline - time.monotonic()))

    def _collect(self, rank_process: RankProcess) -> None:
        observed = now()  # when the death was seen: reading the pipes below takes time
        # Everything the rank wrote before it died is already in its pipes: read it first, so
        # its Finished/Failed event is known before its exit is.
        self._pipes.read_rank(rank_process.rank)
        self._order.release(rank_process.rank)
        exitcode = reap(rank_process)
        self.prompts.forget(rank_process.rank)
        signal = signal_name(-exitcode) if exitcode is not None and exitcode < 0 else None
        self._emit(
            Exited(
                rank_process.rank,
                exitcode,
                signal,
                stopped_by_launcher=rank_process.ended_by_launcher(exitcode),
                time=observed,
                stop_requested=rank_process.stop_requested_at is not None,
            )
        )

    def drain(self) -> None:
        """Read what is left in every pipe and flush partial lines (after all ranks ended)."""
        self._pipes.drain()
        self._order.release()

    def _lines(self, rank: int, kind: str, lines: list[str]) -> None:
        asked = self._dumps is not None and kind == "stderr" and rank in self._dumps
        for line in lines:
            dump = asked and stacks.is_dump_line(line)
            if dump:
                assert self._dumps is not None
                self._dumps[rank].append(line)
            else:
                self._active()
            # A timeout's dumps are shown in the cell; where()'s only in the rank's log.
            output = Output(rank, kind, line, dump=dump and self._final,
                            aside=dump and not self._final)
            self._order.line(rank, output)


def _woken(by_sentinel: dict[int, RankProcess], ready: list[int]) -> list[RankProcess]:
    return [by_sentinel[fd] for fd in ready if fd in by_sentinel]


def _after_stop(event: Failed, rank_process: RankProcess) -> bool:
    """Was this failure raised after the launcher signalled the rank to stop?"""
    sent = rank_process.stop_signalled_at
    return sent is not None and event.time >= sent
