"""The kernel's watch loop over running ranks: read pipes, notice exits, stop on failure.

Started only through a ``RankGroup`` (group/): ``RankGroup.watch`` runs it for a launch or a
warm command, ``RankGroup.step`` turns it from torch's elastic agent.

Single-threaded and non-blocking: every pipe is read in whatever chunks are available, so a rank
that dies mid-message or a huge result can never stall the loop, and a kernel interrupt is
handled at once. Each pass reads at most READ_BUDGET bytes per pipe: a rank printing in a tight
loop cannot keep the loop from its other duties (timeout, peers' failures, redraws).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nbtrain.kernel.group.fdwait import Poller
from nbtrain.kernel.group.outorder import OutputOrder
from nbtrain.kernel.group.pdbprompt import Prompts
from nbtrain.kernel.group.postmortem import FirstFailure
from nbtrain.kernel.procs.processes import (
    RankProcess,
    has_exited,
    kill_overdue,
    reap,
    request_stop,
    send_signal,
)
from nbtrain.shared import stacks
from nbtrain.shared.errors import signal_name
from nbtrain.shared.events import (
    Display,
    Event,
    Exited,
    Failed,
    Finished,
    FrameDecoder,
    Output,
    Paused,
    Resumed,
    Started,
    Stopped,
    now,
)
from nbtrain.shared.lines import LineSplitter
from nbtrain.shared.stopping import STOP_SIGNAL

TICK = 0.05  # seconds: the loop wakes at least this often to refresh the view and check limits
MIN_PASS = 0.02  # seconds: a pass that read something is followed by the next no sooner
READ_SIZE = 1 << 16  # bytes per read
READ_BUDGET = 4 * READ_SIZE  # bytes read from one pipe per pass of the loop (unbounded at the end)
# Seconds a rank that reported Finished/Failed may take to exit by itself. Interpreter shutdown
# waits for non-daemon threads (and multiprocessing for non-daemon children): one left running
# would keep the launch from ever returning.
EXIT_WAIT = 10.0  # generous: a loaded machine can take seconds to finalize a spawned rank
MAX_LOAD_FACTOR = 6.0  # the most a busy machine stretches EXIT_WAIT (a rank naming nothing)
# Warm ranks (kernel/warm/): seconds the other ranks of a cell get to finish (or fail) after
# one failed, and to return to idle after an interrupt, before they count as stuck.
STUCK_GRACE = 1.0


@dataclass
class _Stream:
    rank: int
    kind: str  # "stdout" | "stderr" | "events"
    fd: int
    splitter: LineSplitter = field(default_factory=LineSplitter)
    decoder: FrameDecoder = field(default_factory=FrameDecoder)
    open: bool = True


class Supervisor:
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
        self._exit_wait = exit_wait
        self._streams: dict[int, _Stream] = {}
        self._poller = Poller()  # registered once: wait() would rebuild it every pass
        # A rank's lines and displays come through separate pipes: put back in its order.
        self._order = OutputOrder(lambda event: self._emit(event))
        self._processes = {rank_process.rank: rank_process for rank_process in ranks}
        for rank_process in ranks:
            out, err, evt = rank_process.pipes.reader_fds()
            for kind, fd in (("stdout", out), ("stderr", err), ("events", evt)):
                self._streams[fd] = _Stream(rank_process.rank, kind, fd)
        self.timed_out = False
        self.stopping = False
        self._started: set[int] = set()
        self._swept = 0.0  # when step() last looked at every rank
        self._busy_until = 0.0  # the next pass after one that read something: not before then
        # Where each rank is (stacks.py): the stderr of each asked rank since the last request,
        # until when the answers are awaited, whether the request came before stopping the
        # ranks (a timeout: the dumps are shown in the cell) or from where() (only the picture
        # is shown), and who waits for the picture.
        self._dumps: dict[int, list[str]] | None = None
        self._dump_until = 0.0
        self._final = False
        self._answers: list[Callable[[dict[int, stacks.RankStack]], None]] = []
        # Progress: when a rank last said anything (an event or a line of output; not the
        # stacks it was asked for), and the pdb prompt's time then (not the run's time).
        self.active_at = time.monotonic()
        self.paused_then = 0.0
        # Ranks that sent Finished/Failed: already on their way out.
        self._reported: set[int] = set()
        # Per process (key: its rank): the ranks its events named as started and as reported
        # (an XLA host process speaks for several ordinals), when all of them had reported, and
        # the names of what still ran in it when its function returned.
        self._speaks_for: dict[int, set[int]] = {rp.rank: set() for rp in ranks}
        self._done_for: dict[int, set[int]] = {rp.rank: set() for rp in ranks}
        self._done_at: dict[int, float] = {}
        self._lingering: dict[int, tuple[str, ...]] = {}
        # Warm ranks: the ranks of the current cell (None: a launch, watched until all exit),
        # when they were interrupted or one failed (the others' grace starts), and whether
        # some were stuck past it (then every rank is stopped and the session restarts).
        self._cell: set[int] | None = None
        self._grace_from: float | None = None
        self.interrupted = False
        self.stuck = False
        self.stop_asked = False  # a graceful stop was asked for (ask_to_stop)
        self._asked: set[int] = set()
        # breakpoint() in a rank: its pdb prompt, asked from this loop (pdbprompt.py)
        self.prompts = Prompts({rp.rank: rp.pipes.debug_w for rp in ranks})
        self._post_mortem = FirstFailure()  # debug=True: the failed rank whose prompt stays

    def run(self, deadline: float | None, tick: Callable[[], None]) -> None:
        """Return when every rank has exited and been reaped."""
        while self.running:
            self.step(deadline)
            tick()  # (before a prompt: the view shows the rank paused while the human types)
            self.prompts.turn()

    @property
    def running(self) -> bool:
        """Some rank has not exited (or not been reaped) yet; in a cell (``begin_cell``), some
        rank of the cell has not reported it yet (unless the ranks are being stopped)."""
        if self._cell is None or self.stopping:
            return any(not rp.reaped for rp in self.ranks)
        return not self._cell <= self._reported

    # -- warm ranks: one cell at a time on processes that stay ----------------------------

    def begin_cell(self, ranks: set[int], emit: Callable[[Event], None],
                   failed: Callable[[], bool]) -> None:
        """A new cell runs on ``ranks`` (a warm session): ``run`` returns once each of them
        reported Finished/Failed for it. The pipes' decoders carry over; the rest is new."""
        self._cell = set(ranks)
        self._emit, self._failed = emit, failed
        self._reported.clear()
        self._started.clear()
        self._dumps, self._grace_from, self._final = None, None, False
        self._answers.clear()
        self.timed_out = self.interrupted = self.stuck = self.stop_asked = False
        self._asked.clear()
        self.prompts.paused_for = 0.0
        self._active()

    def interrupt(self) -> None:
        """Ctrl-C (or the cell's timeout): KeyboardInterrupt in every rank still in the cell;
        those not back within STUCK_GRACE count as stuck."""
        self.interrupted = True
        for rank_process in self.ranks:
            if rank_process.rank in self._cell_waiting():
                send_signal(rank_process, signal.SIGINT)  # the rank alone, not its workers
        self._start_grace()

    def ask_to_stop(self) -> None:
        """A graceful stop (on_interrupt="checkpoint"): each rank still working is asked to
        save at its next optimizer step and leave (shared/stopping.py). A rank whose handler
        is not installed yet (not Started) is asked as soon as it starts."""
        self.stop_asked = True
        self._ask_pending()

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

    def _cell_waiting(self) -> set[int]:
        return (self._cell or set()) - self._reported

    def _start_grace(self) -> None:
        if self._grace_from is None:
            self._grace_from = time.monotonic()

    def _watch_cell(self, deadline: float | None) -> None:
        """A cell's rules: a rank that exits breaks the world (stop all: the session restarts);
        a failure or an interrupt gives the others STUCK_GRACE to report; past it, their
        stacks are asked for and every rank is stopped."""
        if self.stopping:
            return
        if any(rp.reaped for rp in self.ranks):
            self.stop_all()
            return
        if self._failed():
            self._start_grace()
        if deadline is not None and time.monotonic() >= deadline and not self.interrupted:
            self.timed_out = True
            self.interrupt()
        if self._grace_from is not None and time.monotonic() - self._grace_from >= STUCK_GRACE:
            self._stop_stuck()

    def _stop_stuck(self) -> None:
        if not self._final:
            self._request_stacks(self._cell_waiting(), final=True)
        if not self._dumps or time.monotonic() >= self._dump_until:
            self.stuck = True
            self.stop_all()

    def step(self, deadline: float | None) -> None:
        """One turn of the loop (at most about TICK seconds); callers that own the loop, such
        as torch's elastic agent (agent.py), call it themselves."""
        if deadline is not None:  # a human at a rank's pdb prompt: not the run's time
            deadline += self.prompts.paused_for
        by_sentinel = {rp.sentinel: rp for rp in self.ranks if not rp.reaped}
        watched = [s.fd for s in self._streams.values() if s.open] + list(by_sentinel)
        if self.stop_asked:
            self._ask_pending()
        # Many ranks keep a pipe ready nearly all the time: a busy loop waits out MIN_PASS
        # between passes, so each pass reads what several ranks sent (issue 44).
        if (rest := self._busy_until - time.monotonic()) > 0:
            time.sleep(rest)
        ready = self._poller.wait(watched, self._wait_time(deadline))
        if ready:
            self._busy_until = time.monotonic() + MIN_PASS
        for fd in ready:
            if fd in self._streams:
                self._pump(self._streams[fd], budget=READ_BUDGET)
        self._order.expire()
        # A failure that arrived as an event stops the others before exits are collected, so a
        # rank that reported it and already exited still counts as asked to stop (the view shows
        # a peer-loss rank as stopped, not failed).
        if self._cell is None and not self.stopping and self._failed():
            self.stop_all()
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
        if self._cell is not None:
            self._watch_cell(deadline)
        else:
            if not self.stopping and self._failed():
                self.stop_all()
            if deadline is not None and not self.stopping and time.monotonic() >= deadline:
                self._time_out()
            if sweep:
                self._stop_lingering()
        if sweep:
            kill_overdue(self._killable(), self._grace)

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

    def _stop_lingering(self) -> None:
        """Stop a rank that reported but has not exited within ``exit_wait``: its result is in.
        A rank that named what keeps it alive (a non-daemon thread or child) gets that wait; one
        that named nothing is only slow to shut down (a busy machine): its wait grows with the
        machine's load, and the note blames nothing of the user's."""
        now = time.monotonic()
        load_factor = _load_factor() if self._done_at else 1.0  # (one system call, not one a rank)
        for rank, done_at in list(self._done_at.items()):
            rank_process = self._processes[rank]
            names = self._lingering.get(rank, ())
            wait = self._exit_wait * (1.0 if names else load_factor)
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
            self._emit(Output(rank, "stderr", f"[nbtrain] rank {rank} returned, but {why}"))
            request_stop(rank_process)

    def _time_out(self) -> None:
        """First ask the ranks still running where they are (see stacks.py), then stop them."""
        if not self._final:
            self._request_stacks(None, final=True)
        if not self._dumps or time.monotonic() >= self._dump_until:
            self.timed_out = True
            self.stop_all()

    # -- where each rank is ------------------------------------------------------------------

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

    def _active(self) -> None:
        self.active_at, self.paused_then = time.monotonic(), self.prompts.paused_for

    def idle_for(self) -> float:
        """Seconds since any rank last said anything, less the time a human spent at a pdb
        prompt meanwhile (hang detection: a paused rank is not a hung one)."""
        paused = self.prompts.paused_for - self.paused_then
        return time.monotonic() - self.active_at - paused

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
            if self._cell is not None and rank not in self._cell_waiting():
                where = stacks.RankStack(note=self._outside(rank))
            elif rank in dumps:
                where = stacks.rank_stack(dumps[rank])
                if not where.frames:
                    where = stacks.RankStack(note=self._outside(rank))
            else:
                where = stacks.RankStack(note=self._unasked(rank_process))
            picture[rank] = where
        return picture

    def _outside(self, rank: int) -> str:
        if self._cell is not None and rank not in self._cell_waiting():
            return "idle (between cells)" if rank not in self._cell else "returned"
        return "outside the function (starting, or returned)"

    def _unasked(self, rank_process: RankProcess) -> str:
        if rank_process.reaped:
            return "exited"
        if rank_process.rank in self._reported:
            return "returned"
        if rank_process.rank not in self._started:
            return "starting"
        return "did not answer"

    def stop_all(self) -> None:
        """SIGTERM the ranks still working; ranks that already reported get the grace period to
        exit by themselves (their own exit code is the truthful one) before SIGKILL."""
        self.stopping = True
        for rank_process in self.ranks:
            request_stop(rank_process, terminate=rank_process.rank not in self._reported)

    def _emit_event(self, event: Event, process_rank: int) -> None:
        self._active()
        if isinstance(event, (Paused, Resumed)) and event.rank in self._reported:
            self._post_mortem_event(event, process_rank)
            return
        if self.prompts.take(event):
            return
        if isinstance(event, Display):
            # Its marks are in the stdout and stderr pipes already (written before it).
            for stream in self._streams.values():
                if stream.rank == process_rank and stream.kind != "events":
                    self._pump(stream, budget=READ_BUDGET)
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
            self._done_for[process_rank].add(event.rank)
            if isinstance(event, Finished) and event.lingering:
                self._lingering[process_rank] = event.lingering
        elif isinstance(event, Started):
            self._started.add(event.rank)
            self._speaks_for[process_rank].add(event.rank)
        done = self._done_for[process_rank]
        # (a process that reported nothing yet, only a start-up phase, is not done)
        if done and self._speaks_for[process_rank] <= done:
            self._done_at.setdefault(process_rank, time.monotonic())
        else:
            self._done_at.pop(process_rank, None)  # an XLA host: another ordinal started
        self._emit(event)

    def _wait_time(self, deadline: float | None) -> float:
        if self._cell is not None and (self._grace_from is not None or self._dumps is not None):
            return TICK
        if deadline is None:
            return TICK
        if self._dumps is not None and self._final:
            deadline = self._dump_until
        return max(0.0, min(TICK, deadline - time.monotonic()))

    def _collect(self, rank_process: RankProcess) -> None:
        observed = now()  # when the death was seen: reading the pipes below takes time
        # Everything the rank wrote before it died is already in its pipes: read it first, so
        # its Finished/Failed event is known before its exit is.
        for stream in self._streams.values():
            if stream.rank == rank_process.rank:
                self._pump(stream)
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
        for stream in self._streams.values():
            self._pump(stream)
            if stream.kind != "events":
                for line in stream.splitter.flush():
                    self._order.line(stream.rank, Output(stream.rank, stream.kind, line))
        self._order.release()

    def _pump(self, stream: _Stream, budget: int | None = None) -> None:
        """Read what the pipe holds (at most ``budget`` bytes; all of it when None)."""
        taken = 0
        while stream.open and (budget is None or taken < budget):
            try:
                chunk = _read(stream.fd)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                stream.open = False
                if stream.kind != "events":
                    for line in stream.splitter.flush():
                        self._order.line(stream.rank, Output(stream.rank, stream.kind, line))
                return
            taken += len(chunk)
            if stream.kind == "events":
                self._decode(stream, chunk)
            else:
                self._lines(stream, stream.splitter.feed(chunk))

    def _lines(self, stream: _Stream, lines: list[str]) -> None:
        asked = self._dumps is not None and stream.kind == "stderr" and stream.rank in self._dumps
        for line in lines:
            dump = asked and stacks.is_dump_line(line)
            if dump:
                assert self._dumps is not None
                self._dumps[stream.rank].append(line)
            else:
                self._active()
            # A timeout's dumps are shown in the cell; where()'s only in the rank's log.
            output = Output(stream.rank, stream.kind, line, dump=dump and self._final,
                            aside=dump and not self._final)
            self._order.line(stream.rank, output)

    def _decode(self, stream: _Stream, chunk: bytes) -> None:
        for event in stream.decoder.feed(chunk):
            self._emit_event(event, stream.rank)
        for problem in stream.decoder.take_problems():  # the frames after it still count
            self._emit(Output(stream.rank, "stderr", f"[nbtrain] protocol error: {problem}"))


def _woken(by_sentinel: dict[int, RankProcess], ready: list[int]) -> list[RankProcess]:
    return [by_sentinel[fd] for fd in ready if fd in by_sentinel]


def _after_stop(event: Failed, rank_process: RankProcess) -> bool:
    """Was this failure raised after the launcher signalled the rank to stop?"""
    sent = rank_process.stop_signalled_at
    return sent is not None and event.time >= sent


def _read(fd: int) -> bytes:
    return os.read(fd, READ_SIZE)


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average here (Windows)
        return 0.0


def _load_factor() -> float:
    """How much slower than idle this machine runs: load per core, 1 at most idle."""
    cores = os.cpu_count() or 1
    return min(MAX_LOAD_FACTOR, max(1.0, _load() / cores))
