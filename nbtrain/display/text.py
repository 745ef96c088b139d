"""Text view: rank-prefixed output lines and compact periodic progress lines."""

from __future__ import annotations

import sys
import time

from ..config import OutputMode
from ..monitor import OutputLine, RankStatus, RankView, RunState

PROGRESS_EVERY = 2.0  # seconds between progress lines per rank: readable in CI logs


class TextView:
    def __init__(self, *, output: OutputMode, show_progress: bool) -> None:
        self.output = output
        self.show_progress = show_progress
        self._next_line = 0
        self._last_report: dict[int, tuple[float, int]] = {}

    def draw(self, state: RunState) -> None:
        self._print_output(state)
        if self.show_progress:
            self._print_progress(state, final=False)

    def close(self, state: RunState) -> None:
        self._print_output(state)
        if self.show_progress:
            self._print_progress(state, final=True)
            if state.summary:
                print(state.summary, file=sys.stdout, flush=True)

    def _print_output(self, state: RunState) -> None:
        lines = state.lines_since(self._next_line)
        if not lines:
            return
        dropped = lines[0].index - self._next_line
        if dropped > 0:
            print(f"[nbtrain] {dropped} output lines dropped", file=sys.stderr)
        for line in lines:
            if self._shows(line):
                stream = sys.stderr if line.stream == "stderr" else sys.stdout
                stream.write(f"[rank {line.rank}] {line.text}\n")
        self._next_line = lines[-1].index + 1
        sys.stdout.flush()
        sys.stderr.flush()

    def _shows(self, line: OutputLine) -> bool:
        if self.output is OutputMode.NONE:
            return False
        return self.output is OutputMode.ALL or line.rank == 0

    def _print_progress(self, state: RunState, *, final: bool) -> None:
        now = time.monotonic()
        for rank, view in state.ranks.items():
            if view.total is None and view.step == 0:
                continue
            last_time, last_step = self._last_report.get(rank, (0.0, -1))
            changed = view.step != last_step
            due = now - last_time >= PROGRESS_EVERY
            if changed and (due or (final and view.status is not RankStatus.RUNNING)):
                print(format_rank(view), flush=True)
                self._last_report[rank] = (now, view.step)


def format_rank(view: RankView) -> str:
    parts = [f"[rank {view.rank}]"]
    if view.desc:
        parts.append(view.desc)
    parts.append(f"{view.step}/{view.total}" if view.total is not None else f"{view.step}")
    if view.rate:
        parts.append(f"{view.rate:.1f} it/s")
    for name, value in list(view.metrics.items())[:4]:
        parts.append(f"{name} {value:.4g}")
    if view.status is not RankStatus.RUNNING:
        parts.append(view.status.value)
    return " ".join(parts)
