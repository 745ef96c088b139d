"""``breakpoint()`` and ``pdb.set_trace()`` in a rank: a pdb whose prompt is the kernel's.

A rank has no terminal. Its pdb (``RankPdb``) reads its lines from the debug pipe the kernel
writes (kernel/procs/processes.py: RankPipes.debug_w) and writes its output into events: each
time it wants a line it sends ``Paused`` (what it wrote since the last prompt, and where it
stopped) and a ``Status`` note for the live view ("paused in pdb (line N)"); when a command
lets the rank run again it sends ``Resumed``. The kernel asks the human (kernel/group/pdbprompt.py).

``q`` (or ``exit``, or end of input) ends the debugging, not the rank: the rank continues and
ignores every later breakpoint of this launch (warm ranks: of this cell), as IPython's ``%debug``
leaves the program alone; plain pdb's ``q`` would raise BdbQuit and fail the rank instead.
A rank without a debug pipe (torch_xla's host process) says so and continues.

Post-mortem (``post_mortem``): the same pdb on the frames of a failure, as IPython's ``%debug``:
a warm rank keeps its last failure (``keep``, in ``sys.last_traceback`` as Python does) until
``%ranks_debug`` sends ``Debug``; a one-shot rank of ``notebook_launcher(..., debug=True)`` opens
it after reporting its failure, before it exits. ``c`` or ``q`` ends it.
"""

from __future__ import annotations

import io
import pdb
import sys
from multiprocessing.connection import Connection
from types import FrameType, TracebackType
from typing import Any

from nbtrain.rank import rankenv
from nbtrain.rank.failures import users_traceback
from nbtrain.shared.events import EventSink, Failed, Paused, Resumed, Status
from nbtrain.shared.stacks import users_outermost

_ENDING = frozenset({"c", "cont", "continue", "q", "quit", "exit", "EOF"})


class _State:
    def __init__(self, rank: int, sink: EventSink, lines: Connection | None) -> None:
        self.rank, self.sink, self.lines = rank, sink, lines
        self.ignoring = False  # after q: later breakpoints of this launch (or cell) are skipped


_state: _State | None = None


def install(rank: int, sink: EventSink, lines: Connection | None) -> None:
    """In a rank: ``breakpoint()`` and ``pdb.set_trace()`` open a RankPdb."""
    global _state
    _state = _State(rank, sink, lines)
    sys.breakpointhook = _breakpointhook
    pdb.set_trace = set_trace


def begin() -> None:
    """A warm rank's new command: breakpoints count again after an earlier ``q``."""
    if _state is not None:
        _state.ignoring = False


# What PYTHONBREAKPOINT may say and still mean "the notebook's prompt": unset, pdb, and what
# ray.init writes into every process that uses Ray (a kernel connected to a cluster, Ray's
# workers): not the user's choice, and Ray's own debugger has no way to this cell.
_OURS = ("", "pdb.set_trace", "ray.util.rpdb.set_trace", "ray.util.rpdb._driver_set_trace")


def _breakpointhook(*args: Any, **kwargs: Any) -> Any:
    chosen = rankenv.variable("PYTHONBREAKPOINT") or ""
    if chosen not in _OURS:  # PYTHONBREAKPOINT=0, or another debugger the user chose
        return sys.__breakpointhook__(*args, **kwargs)
    return set_trace(frame=sys._getframe(1))


def set_trace(*, header: str | None = None, frame: FrameType | None = None) -> None:
    """pdb.set_trace() in a rank (pdb's signature, plus the frame to stop in)."""
    frame = frame or sys._getframe(1)
    state = _state
    if state is None or state.ignoring:
        return
    if state.lines is None:
        print(
            f"[nbtrain] rank {state.rank}: breakpoint() at {_where(frame)} ignored: this rank has "
            "no debugger channel (an XLA ordinal: not supported yet); it continues.",
            file=sys.stderr,
            flush=True,
        )
        return
    debugger = RankPdb(state)
    if header is not None:
        debugger.message(header)
    debugger.set_trace(frame)


def keep(exc: BaseException) -> None:
    """A warm rank's command failed: keep its frames for ``%ranks_debug`` where Python keeps
    them (``sys.last_value = sys.last_traceback = None`` frees them, and their tensors); the
    next failure replaces them."""
    tb = users_traceback(exc.__traceback__)
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb


def debug_last() -> None:
    """``%ranks_debug``: pdb on the frames of this rank's last failure."""
    exc, tb = getattr(sys, "last_value", None), getattr(sys, "last_traceback", None)
    rank = _state.rank if _state is not None else "?"
    if exc is None or tb is None:
        error = RuntimeError(
            f"rank {rank} has no failure to debug (none since it started, or its frames were "
            "freed through sys.last_value / sys.last_traceback); %ranks_debug follows a failed "
            "%%ranks cell."
        )
        error.nbtrain_bad_input = True  # type: ignore[attr-defined]
        raise error
    post_mortem(tb, f"{_summary(exc)}. c or q ends it; the rank stays warm.")


def after_failure(exc: BaseException, failed: Failed) -> None:
    """``debug=True`` (one-shot): pdb on the failing frames, after the Failed event went out
    (the kernel stops the other ranks meanwhile), before the rank exits. Not for a rank that
    only lost a peer (the root cause is elsewhere) nor for an interrupt (the human asked to
    stop)."""
    if failed.collateral or isinstance(exc, KeyboardInterrupt):
        return
    tb = users_traceback(exc.__traceback__)
    if tb is not None:
        post_mortem(tb, f"{_summary(exc)}. c or q ends it; then the launch raises the error.")


def post_mortem(tb: TracebackType, about: str) -> None:
    """Open the kernel's prompt on the frames of ``tb``, at its innermost frame."""
    state = _state
    if state is None or state.lines is None:
        rank = state.rank if state is not None else "?"
        print(f"[nbtrain] rank {rank}: no debugger channel here (an XLA ordinal): no "
              "post-mortem.", file=sys.stderr, flush=True)
        return
    debugger = RankPdb(state, post_mortem=True)
    debugger.message(f"[nbtrain] post-mortem of rank {state.rank}: {about}")
    debugger.reset()
    debugger.interaction(None, tb)


def _summary(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__qualname__}: {text}" if text else type(exc).__qualname__


class _Prompt(io.TextIOBase):
    """The pdb's stdin: each readline is a Paused event, answered through the debug pipe."""

    def __init__(self, debugger: RankPdb) -> None:
        self.debugger = debugger

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        debugger, state = self.debugger, self.debugger.state
        frame = debugger.curframe
        where = _where(frame) if frame is not None else "?"
        line = where.rsplit(":", 1)[-1]
        what = "post-mortem pdb" if debugger.post_mortem else "paused in pdb"
        state.sink.send(Status(state.rank, f"{what} (line {line})"))
        state.sink.send(Paused(state.rank, debugger.take_output(), where))
        assert state.lines is not None
        try:
            answer = state.lines.recv_bytes().decode("utf-8", "replace")
        except (EOFError, OSError):
            return ""  # the kernel is gone: pdb reads EOF and quits
        return answer.rstrip("\r\n") + "\n"


class RankPdb(pdb.Pdb):
    """pdb with the kernel's prompt as its terminal (see the module docstring)."""

    def __init__(self, state: _State, *, post_mortem: bool = False) -> None:
        self.state = state
        self.post_mortem = post_mortem  # on a failure's frames: nothing runs after it
        self._output = io.StringIO()
        super().__init__(stdin=_Prompt(self), stdout=self._output, nosigint=True)  # type: ignore[arg-type]
        self.prompt = ""  # the kernel writes the prompt: "(Pdb) rank N> "

    def get_stack(
        self, f: FrameType | None, t: TracebackType | None
    ) -> tuple[list[tuple[FrameType, int]], int]:
        """The user's frames only, from the launched function (or the cell, or the script)
        down: ``where``, ``up`` and ``down`` never reach multiprocessing's, nbtrain's or, under
        fork, the kernel's frames above it."""
        stack, index = super().get_stack(f, t)
        start = users_outermost([(frame.f_code.co_filename, frame.f_code.co_name)
                                 for frame, _ in stack])
        if start is None or not start <= index < len(stack):
            return stack, index  # stopped outside the user's frames: show all of them
        return stack[start:], index - start

    def take_output(self) -> str:
        text = self._output.getvalue()
        self._output.seek(0)
        self._output.truncate()
        return text

    def postcmd(self, stop: Any, line: str) -> Any:
        stop = super().postcmd(stop, line)
        if stop:
            command = line.split(maxsplit=1)[0] if line.strip() else ""
            state = self.state
            stepping = command not in _ENDING and not self.post_mortem
            state.sink.send(Resumed(state.rank, self.take_output(), stepping))
            state.sink.send(Status(state.rank, ""))
        return stop

    def do_quit(self, arg: str) -> bool:
        """q(uit) | exit: end the debugging; the rank continues and skips later breakpoints."""
        self.state.ignoring = not self.post_mortem
        self.clear_all_breaks()
        self.set_continue()
        return True

    do_q = do_exit = do_quit

    def do_EOF(self, arg: str) -> bool:
        """End of input: as q."""
        return self.do_quit(arg)


def _where(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"
