"""Text view: compact progress lines per rank and a final summary.

For terminals, CI logs, ``nbtrain launch`` and frontends without widgets. The ranks' output lines
are not this view's: the run prints them (kernel/run/cellout.py), calling ``erase_status`` first.
Progress is printed as whole lines (``[rank 1] train 40/100 12.3 it/s loss 0.52``) at most every
``every`` seconds per rank; only on an interactive terminal does one status line redraw in place,
and it is erased before anything else is printed (output, notes), so no carriage returns reach
logs or files.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

from nbtrain.display.formatting import (
    PHASE_TIMED_AFTER,
    format_rank,
    has_progress,
    phase,
    timed_phase,
)
from nbtrain.display.groups import is_wide
from nbtrain.display.runstate import RankView, RunState
from nbtrain.display.statusline import status_line
from nbtrain.display.wide import GroupLines
from nbtrain.shared.options import OutputMode

PROGRESS_EVERY = 2.0  # seconds between progress lines per rank: readable in CI logs


class TextView:
    def __init__(
        self,
        *,
        output: OutputMode,
        show_progress: bool,
        every: float = PROGRESS_EVERY,
        live: bool | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.output = output
        self.show_progress = show_progress
        self.every = every
        self._stdout = stdout
        self._stderr = stderr
        self.live = _is_terminal(self.stdout) if live is None else live
        self._last_stream: TextIO | None = None
        self._reported: dict[int, tuple[float, tuple[object, ...]]] = {}
        self._status = ""  # the live status line now on screen
        self._note = ""
        self._phases: dict[int, str] = {}  # the phase each rank was last said to be in
        self._groups = GroupLines(every)  # a wide run: lines of groups (wide.py)

    @property
    def stdout(self) -> TextIO:
        return self._stdout if self._stdout is not None else sys.stdout

    @property
    def stderr(self) -> TextIO:
        return self._stderr if self._stderr is not None else sys.stderr

    def draw(self, state: RunState, *, now: bool = False) -> None:
        self._flush()  # (every draw prints what changed: nothing held back for ``now``)
        if not self.show_progress:
            return
        if is_wide(len(state.ranks)):
            self._print_progress(state, final=False)
        elif self.live:
            self._print_finished(state)
            self._draw_status(state)
        else:
            self._print_progress(state, final=False)

    def close(self, state: RunState) -> None:
        self.erase_status()
        self._flush()
        if self.show_progress:
            self._print_progress(state, final=True)
            if state.summary:
                self.stdout.write(state.summary + "\n")
                self.stdout.flush()

    def note(self, text: str) -> None:
        """A node-level message: one line on stderr (once per distinct text)."""
        if not self.show_progress or text == self._note:
            return
        self._note = text
        if text:
            self.erase_status()
            self._write(self.stderr, f"[nbtrain] {text}\n")
            self._flush()

    def _write(self, stream: TextIO, text: str) -> None:
        # Lines are buffered until the next draw, but stdout and stderr keep their order.
        if self._last_stream is not None and self._last_stream is not stream:
            self._last_stream.flush()
        self._last_stream = stream
        stream.write(text)

    def _flush(self) -> None:
        self.stdout.flush()
        self.stderr.flush()

    # -- progress lines -----------------------------------------------------------------------

    def _print_progress(self, state: RunState, *, final: bool) -> None:
        """A line per rank when it changed and its interval passed; every change when final."""
        if is_wide(len(state.ranks)):
            self.stdout.writelines(line + "\n" for line in self._groups.lines(state, final=final))
            self.stdout.flush()
            return
        now = time.monotonic()
        for rank, view in sorted(state.ranks.items()):
            if not (has_progress(view) or view.metrics or view.finished):
                self._print_phase(view)
                continue
            shown = _shown_state(view)
            last_time, last_shown = self._reported.get(rank, (-float("inf"), None))
            if shown == last_shown:
                continue
            ended = view.finished and (last_shown is None or last_shown[-1] != view.status)
            if final or ended or now - last_time >= self.every:
                self.stdout.write(format_rank(view) + "\n")
                self._reported[rank] = (now, shown)
        self.stdout.flush()

    def _print_phase(self, view: RankView) -> None:
        """A rank that shows no progress yet says what it is busy with (starting Python,
        importing torch, forming the process group), once per phase that lasted a while: a
        quick start prints nothing, a slow one says where the seconds go."""
        if not timed_phase(view) or self._phases.get(view.rank) == view.note:
            return
        assert view.note_at is not None
        if time.time() - view.note_at < PHASE_TIMED_AFTER:
            return
        self._phases[view.rank] = view.note
        self.stdout.write(f"[rank {view.rank}] {phase(view)}\n")

    def _print_finished(self, state: RunState) -> None:
        """Live mode: a rank that ended gets its final line above the status line at once."""
        for rank, view in sorted(state.ranks.items()):
            if view.finished and self._reported.get(rank, (0, None))[1] != _shown_state(view):
                self.erase_status()
                self.stdout.write(format_rank(view) + "\n")
                self._reported[rank] = (time.monotonic(), _shown_state(view))

    def _draw_status(self, state: RunState) -> None:
        running = [v for _, v in sorted(state.ranks.items()) if not v.finished]
        if not running:
            self.erase_status()
            return
        # (One column short of the width: a full line would wrap on some terminals.)
        text = status_line(running, max(20, shutil.get_terminal_size().columns - 1))
        if text == self._status:
            return
        pad = " " * max(0, len(self._status) - len(text))
        self.stdout.write("\r" + text + pad)
        self.stdout.flush()
        self._status = text

    def erase_status(self) -> None:
        if self._status:
            self.stdout.write("\r" + " " * len(self._status) + "\r")
            self.stdout.flush()
            self._status = ""


def _shown_state(view: RankView) -> tuple[object, ...]:
    return (view.step, view.total, view.desc, tuple(view.metrics.items()), view.status)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
