"""Where a rank is stuck: ask it for its stacks, and find the user's frames in the answer.

A launch that outlives ``timeout=`` is nearly always a rank blocked somewhere (a collective that
a peer never joins, a deadlock in teardown, a data loader waiting on a dead worker). Before the
launcher stops the ranks it sends each one ``DUMP_SIGNAL``; the rank's ``faulthandler`` writes
every thread's stack to its stderr pipe (it works even while the main thread is blocked in C++,
holding the GIL), and the TimeoutError names the line each rank was on.
"""

from __future__ import annotations

import os
import re
import signal
import sys

DUMP_SIGNAL: int | None = getattr(signal, "SIGUSR1", None)  # None on Windows: no dump there
WAIT = 1.0  # seconds the launcher waits for the dumps before it stops the ranks
MAX_FRAMES = 6

_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ ")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>.+)$')
# Frames below the user's function: the rank entry, and the XLA host's ordinal entry.
_ENTRY = ("nbtrain/rank/worker.py", "nbtrain/rank/xla_host.py", "nbtrain/rank/session.py")


def enable_dumps() -> None:
    """In a rank: dump every thread's stack to stderr on DUMP_SIGNAL (the launcher's request)."""
    import faulthandler

    if DUMP_SIGNAL is not None:
        faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True)


def user_frames(lines: list[str]) -> list[str]:
    """From one faulthandler dump, the innermost frames of the thread running the user's
    function ("file:line in name", innermost first). Empty if no thread was running it."""
    for block in _threads(lines):
        frames = [m for m in map(_FRAME.match, block) if m is not None]
        entry = next(
            (i for i, m in enumerate(frames) if m["file"].replace("\\", "/").endswith(_ENTRY)),
            None,
        )
        while entry and _plumbing(frames[entry - 1]["file"], frames[entry - 1]["name"]):
            entry -= 1  # nbtrain launch's way into the script: not the user's frames
        if entry:  # the frames above our entry point are the user's (and what they called)
            named = [f"{_short(m['file'])}:{m['line']} in {m['name']}" for m in frames[:entry]]
            if len(named) > MAX_FRAMES:  # keep the innermost ones and the user's function
                named = [*named[: MAX_FRAMES - 2], "...", named[-1]]
            return named
    return []


def is_thread_header(line: str) -> bool:
    """A dump's 'Current thread 0x... (most recent call first):' line."""
    return _THREAD.match(line) is not None


def is_entry_frame(line: str) -> bool:
    """A dump's frame of a rank's entry point: every frame after it (outer ones) is nbtrain's
    or, under fork, the kernel's own stack from before the fork."""
    match = _FRAME.match(line)
    return match is not None and match["file"].replace("\\", "/").endswith(_ENTRY)


def _plumbing(path: str, name: str) -> bool:
    """``nbtrain launch``'s frames between a rank's entry and the script: script.run_script
    and runpy's."""
    path = path.replace("\\", "/")
    if path.endswith("nbtrain/rank/script.py"):
        return name == "run_script"
    return path.endswith(("/runpy.py", "<frozen runpy>"))


def describe(stacks: dict[int, list[str]]) -> str:
    """The TimeoutError's account of where each stuck rank was."""
    parts = []
    for rank, frames in sorted(stacks.items()):
        if frames:
            parts.append(f"rank {rank} was in " + " <- ".join(frames))
    return "\n".join(parts)


def _threads(lines: list[str]) -> list[list[str]]:
    blocks: list[list[str]] = []
    for line in lines:
        if _THREAD.match(line):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    return blocks


def _short(path: str) -> str:
    """.../site-packages/torch/x.py -> torch/x.py, and nbtrain's own files (an editable install
    too) -> nbtrain/x.py; a notebook cell's file name stays as it is."""
    path = path.replace("\\", "/")
    if path.startswith(_PACKAGE):
        return "nbtrain/" + path[len(_PACKAGE):]
    index = path.rfind("site-packages/")
    return path[index + len("site-packages/"):] if index >= 0 else path


# nbtrain's own folder (this file is nbtrain/shared/stacks.py).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/") + "/"
