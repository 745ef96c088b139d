"""Rank output as the calling cell's own output, and every line kept in a per-launch log folder.

Every whole line a rank writes reaches the kernel as an ``Output`` event. Here it becomes part of
the cell's stream output: written to the kernel's ``sys.stdout`` / ``sys.stderr`` (which ipykernel
sends as the cell's stream messages, so it is in the saved notebook, nbconvert, papermill and
nbclient), rank-prefixed, filtered by ``output=``. Lines are buffered and written once per tick
of the run (ipykernel coalesces further), never one message per line.

A rank that floods is summarised, not dropped silently: the cell takes lines at up to RATE per
second (with a burst of BURST); past that, lines are held back and counted, and a line in the cell
says how many and where they are. Every line of every rank (whatever ``output=`` says) is also
written to ``<log root>/<launch>/rank-<r>.log``, so nothing is ever lost; the newest KEEP launch
folders are kept.

Rich output a rank displays (``display()``, ``plt.show()``) arrives as a ``Display`` event and is
shown in the cell in its rich form, labelled with the rank: text/plain is prefixed, and a
text/html form (the rank's HTML, or its image inlined) carries the label; the original mime types
stay in the bundle for other tools. A rank's display updates (``display_id``) update the same
output. Outside a Jupyter kernel its text/plain form is printed as a rank line.

Stack dumps (a timeout's, where?'s, hang detection's) go to the log folder only: the cell gets
the one account of where each rank was (stacks.describe, in the TimeoutError or the note), which
names the rank's file as the log, not the raw dump with nbtrain's frames and the kernel's temp
file names above it (issue 42).
"""

from __future__ import annotations

import base64
import contextlib
import html
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from nbtrain.display.runstate import OutputLine
from nbtrain.kernel.host import environment
from nbtrain.kernel.run.outgroup import LineGroups
from nbtrain.shared.events import Display
from nbtrain.shared.frontend import Frontend, frontend
from nbtrain.shared.options import OutputMode

RATE = 2000.0  # lines per second the cell takes from all ranks together, sustained
BURST = 5000  # lines the cell takes at once before the rate applies
KEEP = 20  # launch log folders kept under the log root (oldest removed first)
NOTICE_EVERY = 2.0  # seconds between "held back" lines while a flood goes on


@dataclass
class _Held:
    total: int = 0
    by_rank: dict[int, int] = field(default_factory=dict)
    said: int = 0  # how many of them a line in the cell already told about
    said_at: float = 0.0


class CellOutput:
    """The output side of one launch: log files, the cell's streams, flood control."""

    def __init__(
        self,
        mode: OutputMode,
        *,
        before_write: Callable[[], None] = lambda: None,
        hold: Callable[[], bool] = lambda: False,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        wide: bool = False,
        rich: Callable[[int, str], None] | None = None,
    ) -> None:
        """``stdout``/``stderr``: where lines go (default: the cell's); ``rich``: where a
        rank's display goes as text instead of the cell (a background run's pane)."""
        self.mode = mode
        # A wide run: identical lines of several ranks written once with their ranks (outgroup)
        self._groups = LineGroups() if wide else None
        self._rich = rich
        self._before_write = before_write  # a terminal view erases its live status line
        # True while the view is still to appear (a warm cell's first 0.5 s, DeferredView):
        # lines wait, so they come below the dashboard, as the later ones do.
        self._hold = hold
        self._stdout, self._stderr = stdout, stderr
        self._pending: list[tuple[str, str]] = []  # (stream, text) in arrival order
        self._tokens = float(BURST)
        self._refilled = time.monotonic()
        self._held = _Held()
        self._files: dict[int, IO[str]] = {}
        self.folder: Path | None = None  # created with the first line
        self._handles: dict[tuple[int, str | None], Any] = {}  # a rank's display ids
        # Where the cell's text is copied to as well: a page reloaded mid-launch gets no stream
        # output of this cell (display/reloaded.py).
        self.copy_to: Callable[[str], None] | None = None

    # -- lines in --------------------------------------------------------------------------

    def take(self, line: OutputLine) -> None:
        """Called for every line as it arrives (a RunState output listener)."""
        text = line.text
        self._log(line.rank, line.stream, text)
        if line.aside or line.dump:
            return  # a stack dump: logged; the picture in the cell says where the rank was
        if not self._shows(line.rank):
            return
        if not self._admit():
            self._held.total += 1
            self._held.by_rank[line.rank] = self._held.by_rank.get(line.rank, 0) + 1
            return
        entry = (line.stream, f"[rank {line.rank}] {text}\n")
        if self._groups is not None:
            self._groups.add(line.rank, line.stream, text, time.monotonic())
        else:
            self._pending.append(entry)

    def _shows(self, rank: int) -> bool:
        if self.mode is OutputMode.NONE:
            return False
        return self.mode is OutputMode.ALL or rank == 0

    def _admit(self) -> bool:
        now = time.monotonic()
        self._tokens = min(float(BURST), self._tokens + (now - self._refilled) * RATE)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    # -- lines out -------------------------------------------------------------------------

    def flush(self, *, final: bool = False, now: bool = False) -> None:
        """Write what arrived since the last flush to the cell, one write per stream run
        (``now``: even while the view is still to appear)."""
        if not (final or now) and self._hold():
            return
        notice = self._notice(final)
        if self._groups is not None:
            self._pending.extend(self._groups.take(time.monotonic(), final=final or now))
        if not self._pending and notice is None:
            return
        self._before_write()
        runs: list[tuple[str, list[str]]] = []
        for stream, text in self._pending:
            if runs and runs[-1][0] == stream:
                runs[-1][1].append(text)
            else:
                runs.append((stream, [text]))
        self._pending = []
        for stream, texts in runs:
            self._write(stream, "".join(texts))
        if notice is not None:
            self._write("stderr", notice)

    def note(self, text: str) -> None:
        """A block of nbtrain's own (where each rank is) in the cell, after the lines so far;
        shown whatever ``output=`` says, since it was asked for."""
        self.flush(now=True)
        self._before_write()
        self._write("stderr", text.rstrip("\n") + "\n")

    def _write(self, name: str, text: str) -> None:
        stream = self._stream(name)
        stream.write(text)
        stream.flush()  # keeps stdout and stderr in their order
        if self.copy_to is not None:
            self.copy_to(text)

    def _notice(self, final: bool) -> str | None:
        held = self._held
        fresh = held.total - held.said
        if not fresh:
            return None
        now = time.monotonic()
        if not final and now - held.said_at < NOTICE_EVERY:
            return None
        held.said, held.said_at = held.total, now
        return f"[nbtrain] {self.held_summary()}\n"

    def held_summary(self) -> str:
        """'1,234 output lines held back (rank 0: 1,200, rank 1: 34); every line is in DIR'."""
        held = self._held
        if not held.total:
            return ""
        ranks = ", ".join(f"rank {rank}: {n:,}" for rank, n in sorted(held.by_rank.items()))
        return (
            f"{held.total:,} output lines held back from the cell ({ranks}); every line is in "
            f"{self.folder}"
        )

    def _stream(self, name: str) -> TextIO:
        import sys

        if name == "stderr":
            return self._stderr if self._stderr is not None else sys.stderr
        return self._stdout if self._stdout is not None else sys.stdout

    # -- rich output ---------------------------------------------------------------------------

    def show(self, event: Display) -> None:
        """A rank's display: after the lines that came before it, in the cell."""
        if not self._shows(event.rank):
            return
        self.flush(now=True)
        text = str(event.data.get("text/plain", "")).rstrip("\n")
        self._log(event.rank, "stdout", f"[display] {text}")
        if self._rich is not None:
            self._rich(event.rank, text)
            return
        if frontend() is not Frontend.JUPYTER:
            self._pending.append(("stdout", f"[rank {event.rank}] {text}\n"))
            return
        from IPython.display import display

        if self.copy_to is not None:  # (its text form: a reloaded page gets no display)
            self.copy_to(f"[rank {event.rank}] {text}\n")
        bundle = labelled(event.rank, event.data)
        key = (event.rank, event.display_id)
        handle = self._handles.get(key) if event.display_id else None
        if handle is not None and event.update:
            handle.update(bundle, raw=True, metadata=event.metadata)
        elif event.display_id:
            self._handles[key] = display(
                bundle, raw=True, metadata=event.metadata, display_id=True
            )
        else:
            display(bundle, raw=True, metadata=event.metadata)

    # -- the log folder ----------------------------------------------------------------------

    def _log(self, rank: int, stream: str, text: str) -> None:
        handle = self._files.get(rank)
        if handle is None:
            handle = self._open(rank)
            if handle is None:
                return
        handle.write(text + "\n" if stream == "stdout" else f"[stderr] {text}\n")

    def _open(self, rank: int) -> IO[str] | None:
        with contextlib.suppress(OSError):  # no writable log root: the cell still gets lines
            if self.folder is None:
                self.folder = _new_launch_folder(environment.log_root())
            handle = open(self.folder / f"rank-{rank}.log", "a", encoding="utf-8")  # noqa: SIM115
            self._files[rank] = handle
            return handle
        return None

    def close(self) -> None:
        self.flush(final=True)
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                handle.close()
        self._files.clear()


def labelled(rank: int, data: dict[str, Any]) -> dict[str, Any]:
    """A rank's display with the rank's label in its text forms (see with_label)."""
    text = data.get("text/plain")
    plain = None if text is None else f"[rank {rank}] {text}"
    return with_label(data, f"rank {rank}", plain, "nbtrain-rank-display")


def with_label(
    data: dict[str, Any], label: str, plain: str | None, css_class: str
) -> dict[str, Any]:
    """The bundle with ``plain`` as its text/plain and an HTML form showing ``label`` above the
    rank's HTML or image (frontends prefer HTML; image/png stays for other tools)."""
    bundle = dict(data)
    if plain is not None:
        bundle["text/plain"] = plain
    body = bundle.get("text/html")
    if body is None:
        for mime in ("image/png", "image/jpeg"):
            image = bundle.get(mime)
            if isinstance(image, bytes):  # a spawn rank's formatter gives raw bytes
                image = bundle[mime] = base64.b64encode(image).decode("ascii")
            if isinstance(image, str):
                body = f'<img src="data:{mime};base64,{image}">'
                break
    if body is not None:
        bundle["text/html"] = (
            f'<div class="{css_class}"><div style="font-size:smaller;opacity:0.7">'
            f"{html.escape(label)}</div>{body}</div>"
        )
    elif isinstance(bundle.get("text/markdown"), str):
        # Markdown without HTML (frontends render it as is): the label as its first line.
        bundle["text/markdown"] = f"<sub>{html.escape(label)}</sub>\n\n{bundle['text/markdown']}"
    return bundle


def _new_launch_folder(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        folder = root / f"{stamp}-{os.getpid()}-{attempt}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        _prune(root, keep=folder)
        return folder
    raise OSError(f"no free launch folder name under {root}")


def _prune(root: Path, *, keep: Path) -> None:
    """Keep the newest KEEP launch folders (never the one just made)."""
    folders = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in folders[: max(0, len(folders) - KEEP)]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)
