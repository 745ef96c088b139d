"""The kernel's half of a rank's pdb (rank/debugger.py): the ``(Pdb) rank N>`` prompt.

The watch loop (Supervisor.turn) hands every ``Paused`` / ``Resumed`` event here and calls
``turn`` after each pass: one rank at a time holds the prompt (the others wait their turn, and
the prompt says so); its pdb output is printed, the human's line is read with ``input()`` (in a
kernel: ipykernel's stdin request, the frontend's input box; in ``nbtrain launch``: the
terminal) and written to that rank's debug pipe. The seconds spent at the prompt are counted
(``paused_for``) so a launch's timeout does not run while a human reads a stack.

Without an input (a kernel run by nbclient without allow_stdin, a script whose stdin is not a
terminal) the rank is told ``q``: it says so, continues, and skips its later breakpoints.
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection

from nbtrain.kernel.host import cellnames
from nbtrain.kernel.host.stdin import can_ask
from nbtrain.shared.events import Paused, Resumed

NO_INPUT = (
    "[nbtrain] rank {rank} stopped at breakpoint() ({where}), but this run has no input to "
    "type pdb commands in (a kernel run without stdin, such as nbclient's, or a script whose "
    "stdin is not a terminal): the rank continues and ignores its later breakpoints."
)


def no_stdin(exc: BaseException) -> bool:
    """``input()`` failed for want of a stdin (not Ctrl-C)."""
    return isinstance(exc, EOFError) or type(exc).__name__ == "StdinNotImplementedError"


class Prompts:
    """The pdb prompts of one group's ranks (see the module docstring)."""

    def __init__(
        self,
        lines: dict[int, Connection],
        ask: Callable[[str], str] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.lines = lines
        self.ask = ask or _input
        self._say = say or _print
        self.waiting: dict[int, Paused] = {}  # ranks whose pdb waits for a line, in order
        self.holder: int | None = None  # the rank the prompt belongs to until it continues
        self.paused_for = 0.0  # seconds spent waiting for the human, all prompts together
        self.no_input = not can_ask()
        self.ready: Callable[[], None] = _nothing  # draws the view before the prompt blocks

    def handed(self, ask: Callable[[str], str], say: Callable[[str], None]) -> None:
        """A background run: no cell holds the input box, and a print from its thread would
        land in whatever cell runs; the prompt is asked and its output said through its desk
        (run/desk.py: answered in the cell that calls run.wait())."""
        self.ask, self._say, self.no_input = ask, say, False

    def take(self, event: object) -> bool:
        """A Paused / Resumed event (True), or not ours (False)."""
        if isinstance(event, Paused):
            self.waiting[event.rank] = event
            return True
        if isinstance(event, Resumed):
            if event.text:
                self.say(event.text)
            if self.holder == event.rank and not event.stepping:
                self.holder = None
            return True
        return False

    def say(self, text: str) -> None:
        """Show the rank's pdb output, its cells named as the notebook names them."""
        self._say(cellnames.in_pdb_text(text))

    def forget(self, rank: int) -> None:
        """The rank reported or ended: it holds no prompt any more."""
        self.waiting.pop(rank, None)
        if self.holder == rank:
            self.holder = None

    @contextlib.contextmanager
    def scripted(self, lines: Sequence[str]) -> Iterator[None]:
        """Inside: the prompts are answered with ``lines`` (shown as if typed), then ``c``; for
        a post-mortem in a run nobody types in (a notebook run by nbclient, a report)."""
        answers = iter([*lines, "c"])

        def ask(prompt: str) -> str:
            line = next(answers, "c")
            self._say(f"{prompt}{line}")
            return line

        saved = self.ask, self.no_input
        self.ask, self.no_input = ask, False
        try:
            yield
        finally:
            self.ask, self.no_input = saved

    def holds(self, rank: int) -> bool:
        """The rank's pdb waits for a line, or holds the prompt."""
        return rank == self.holder or rank in self.waiting

    def dismiss(self, rank: int) -> None:
        """Tell a paused rank ``q`` without asking anyone (a post-mortem not wanted)."""
        self.forget(rank)
        self._send(rank, "q")

    def turn(self) -> None:
        """If a rank waits for a line and the prompt is free (or its own), ask for one."""
        if self.holder is None and self.waiting:
            self.holder = next(iter(self.waiting))
        rank = self.holder
        if rank is None or rank not in self.waiting:
            return  # the holder is stepping: wait for its next pause
        paused = self.waiting.pop(rank)
        self.ready()  # the view shows "paused in pdb", the rank's output so far is out
        if self.no_input:
            self.say(NO_INPUT.format(rank=rank, where=paused.where))
            self._send(rank, "q")
            return
        if paused.text:
            self.say(paused.text.rstrip("\n"))
        others = sorted(self.waiting)
        if others:
            names = ", ".join(map(str, others))
            self.say(f"[nbtrain] also paused at a breakpoint, waiting their turn: rank {names}")
        started = time.monotonic()
        try:
            line = self.ask(f"(Pdb) rank {rank}> ")
        except BaseException as exc:
            if not no_stdin(exc):
                self._send(rank, "q")  # Ctrl-C at the prompt: let the rank go, then stop
                raise
            self.no_input = True
            self.say(NO_INPUT.format(rank=rank, where=paused.where))
            line = "q"
        finally:
            self.paused_for += time.monotonic() - started
        self._send(rank, line)

    def _send(self, rank: int, line: str) -> None:
        with contextlib.suppress(OSError):  # the rank died meanwhile: its exit says so
            self.lines[rank].send_bytes(line.encode("utf-8"))


def _nothing() -> None:
    pass


def _input(prompt: str) -> str:
    # Looked up at each prompt: ipykernel swaps builtins.input for each execution (its stdin
    # request answers that execution, and raises when the frontend allows no stdin).
    return builtins.input(prompt)


def _print(text: str) -> None:
    print(text, flush=True)
