"""A background run's pdb prompts (``breakpoint()`` in a rank, ``debug=True``'s post-mortem),
answered in the cell that waits for the run.

A background run's watch loop is a thread of the kernel: no cell holds the input box for it, and
its prints would land in whatever cell executes. So its ``Prompts`` (group/pdbprompt.py) ask and
say through this desk instead: the rank stays paused, the run's view says "rank N stopped at a
breakpoint: call run.wait() to debug it", and ``run.wait()`` (in the main thread, holding its
cell's stdin) prints the rank's pdb output and asks for each line there. Ctrl-C at that prompt
stops the waiting (the rank stays paused; the next ``run.wait()`` asks again). ``run.stop()``
at a prompt: at once (the rank is told ``q`` and every rank stops), or with a checkpoint (the
rank continues, ``c``, to the next optimizer step where it saves and stops).
"""

from __future__ import annotations

import builtins
import queue
import re
import threading
from collections.abc import Callable

from nbtrain.kernel.group.pdbprompt import no_stdin

__all__ = ["Desk"]


class Desk:
    """The hand-over between the watch loop (``say``, ``ask``) and ``run.wait()`` (``serve``).

    :param stop_asked: the run's pending stop ('now', 'checkpoint' or None).
    """

    def __init__(self, stop_asked: Callable[[], str | None]) -> None:
        self._stop_asked = stop_asked
        self._lock = threading.Lock()
        self._said: list[str] = []  # pdb output not yet shown in a waiting cell
        self._asked: str | None = None  # the prompt a paused rank waits at
        self._answers: queue.Queue[str] = queue.Queue()
        self.note: Callable[[str], None] = print  # a line in the run's view (set by the run)

    # -- the watch loop's thread ------------------------------------------------------------

    def say(self, text: str) -> None:
        with self._lock:
            self._said.append(text)

    def ask(self, prompt: str) -> str:
        """Wait until ``run.wait()`` answers (or ``run.stop()``): the rank's line."""
        found = re.search(r"rank (\d+)", prompt)
        rank = found.group(1) if found else "?"
        self.note(f"[nbtrain] rank {rank} stopped at a breakpoint: call run.wait() to debug it")
        while not self._answers.empty():  # (an answer typed after its prompt had gone)
            self._answers.get_nowait()
        with self._lock:
            self._asked = prompt
        try:
            while True:
                try:
                    return self._answers.get(timeout=0.1)
                except queue.Empty:
                    pass
                stop = self._stop_asked()
                if stop == "checkpoint":
                    return "c"  # on to the next optimizer step, where the stop is served
                if stop is not None:
                    raise KeyboardInterrupt("run.stop() at a breakpoint")
        finally:
            with self._lock:
                self._asked = None

    # -- the waiting cell's thread ------------------------------------------------------------

    def serve(self) -> None:
        """Show the ranks' pdb output so far and, if a rank waits, ask for its line."""
        with self._lock:
            said, self._said = self._said, []
            prompt = self._asked
        for text in said:
            print(text, flush=True)
        if prompt is None or self._stop_asked() is not None:
            return  # (after run.stop(), ask() answers the rank itself: nobody is asked)
        try:
            line = builtins.input(prompt)  # ipykernel's stdin request in the waiting cell
        except BaseException as exc:
            if not no_stdin(exc):
                raise  # Ctrl-C: wait() stops waiting; the rank stays paused
            print("[nbtrain] this cell has no input for pdb: the rank continues (q)", flush=True)
            line = "q"
        self._answers.put(line)
