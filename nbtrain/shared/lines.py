"""Bytes in, whole lines out: how a process's raw output becomes rank-prefixed lines.

Used by the kernel for each rank's stdout/stderr pipes, and by torch_xla's host process for the
output of its ordinal threads.
"""

from __future__ import annotations

import codecs

MAX_LINE = 1 << 16  # a "line" longer than this is emitted in pieces rather than held forever
_MARK = "\x00nbtrain-display-mark "  # NULs: a line no program prints by itself


class LineSplitter:
    """Bytes in, whole lines out. A carriage return keeps only what a terminal would show."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes) -> list[str]:
        text = self._partial + self._decoder.decode(data)
        *lines, self._partial = text.split("\n")
        if len(self._partial) > MAX_LINE:
            lines.append(self._partial)
            self._partial = ""
        return [line.rsplit("\r", 1)[-1] if "\r" in line else line for line in lines]

    def flush(self) -> list[str]:
        rest = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [rest.rsplit("\r", 1)[-1]] if rest else []


def mark_line(mark: int) -> str:
    """The line a rank writes to its stdout and stderr before its display numbered ``mark``
    (kernel/group/outorder.py), never shown."""
    return f"{_MARK}{mark}\x00\n"


def parse_mark(line: str) -> tuple[str, int | None]:
    """(text, number) of a line that ends in a mark: the text before it is what the rank had
    printed without a newline (``print(..., end="")``); (line, None) for any other line."""
    at = line.find(_MARK)
    if at < 0:
        return line, None
    try:
        return line[:at], int(line[at + len(_MARK) :].rstrip("\x00"))
    except ValueError:
        return line, None
