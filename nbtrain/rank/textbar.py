"""progress() and log() outside a launch: a text bar on stderr, metrics printed or shown in it.

On a terminal or in a Jupyter cell the bar redraws in place (carriage return, about 10 times a
second); anywhere else (CI logs, files) it prints a plain line every few seconds and at the end.
Metrics logged while a bar runs are shown in the bar instead of printed, so a loop that logs
every step does not flood the output.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

from nbtrain.shared.frontend import Frontend, frontend
from nbtrain.shared.units import format_duration, format_metrics

T = TypeVar("T")

LIVE_EVERY = 0.1  # seconds between redraws in place
LINE_EVERY = 5.0  # seconds between plain lines where carriage returns would pile up
BAR_WIDTH = 20

_active = threading.local()  # the innermost bar of this thread, which shows logged metrics


class TextBar:
    """One loop's text bar; while open it is the bar of this thread that shows logged metrics."""

    def __init__(self, total: int | None, desc: str | None, stream: TextIO | None = None) -> None:
        self.total = total
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.live = _redraws_in_place(self.stream)
        self.every = LIVE_EVERY if self.live else LINE_EVERY
        self.started = time.monotonic()
        self.next_due = self.started + (0.0 if self.live else self.every)
        self.metrics: dict[str, float] = {}
        self.n = 0
        self._outer: TextBar | None = getattr(_active, "bar", None)
        self._closed = False
        _active.bar = self
        if self.live:
            self.show()

    def update_to(self, step: int) -> None:
        self.n = step
        if time.monotonic() >= self.next_due:
            self.show()

    def close(self, *, complete: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if getattr(_active, "bar", None) is self:
            _active.bar = self._outer
        if complete and self.total is None:
            self.total = self.n
        self.show(final=True)

    def show(self, *, final: bool = False) -> None:
        now = time.monotonic()
        self.next_due = now + self.every
        line = format_bar(self.desc, self.n, self.total, now - self.started, self.metrics)
        if self.live:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def text_progress(iterable: Iterable[T], total: int | None, desc: str | None) -> Iterator[T]:
    bar = TextBar(total, desc)
    monotonic = time.monotonic
    complete = False
    try:
        for item in iterable:
            yield item
            bar.n += 1
            if monotonic() >= bar.next_due:
                bar.show()
        complete = True
    finally:
        bar.close(complete=complete)


def bar_running() -> bool:
    """A text bar is drawn in this thread (outside a launch: ``progress()``)."""
    return getattr(_active, "bar", None) is not None


def print_metrics(values: dict[str, float], step: int | None) -> None:
    bar: TextBar | None = getattr(_active, "bar", None)
    if bar is not None:
        bar.metrics.update(values)
        return
    prefix = f"step {step}: " if step is not None else ""
    print(prefix + format_metrics(values), flush=True)


def format_bar(
    desc: str | None, n: int, total: int | None, elapsed: float, metrics: dict[str, float]
) -> str:
    rate = n / elapsed if elapsed > 0 and n else None
    parts = [f"{desc}:"] if desc else []
    if total:
        filled = min(BAR_WIDTH, BAR_WIDTH * n // total)
        parts += [f"{n}/{total}", "[" + "#" * filled + "-" * (BAR_WIDTH - filled) + "]"]
        parts.append(f"{100 * n // total}%")
    else:
        parts.append(f"{n}" if total is None else f"{n}/{total}")
    if rate:
        parts.append(f"{rate:.1f} it/s")
        if total and n < total:
            parts.append("ETA " + format_duration((total - n) / rate))
    if metrics:
        parts.append(format_metrics(metrics))
    return " ".join(parts)


def _redraws_in_place(stream: TextIO) -> bool:
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):
        return False
    return frontend() is Frontend.JUPYTER  # notebook frontends honour carriage returns
