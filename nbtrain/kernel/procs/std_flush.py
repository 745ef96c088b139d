"""One flush of the kernel's sys.stdout and sys.stderr per launch, not one per rank.

multiprocessing flushes both streams before it starts each process (so that a forked child does
not write the parent's buffered text again). In a Jupyter kernel each flush of ipykernel's
streams is a round trip to its IO thread, whether anything is buffered or not: at 64 ranks that
was the largest part of the kernel's own time to start them, after fork itself (benchmarks/
README: Wide runs). Ranks are started in one loop, with signals held, and the kernel writes
nothing meanwhile: the streams are flushed once before the loop, and multiprocessing's flush is
skipped for each start in it. Only in the kernel's own process: a rank (which inherits the
skip) flushes before it forks its DataLoader workers as multiprocessing always does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from multiprocessing import util

# (A private function of multiprocessing, in every CPython since 3.4; where it is missing,
# nothing is skipped.)
_original = getattr(util, "_flush_std_streams", None)  # private: maybe absent
_skipping_in: int | None = None  # the pid of the kernel while it starts ranks


def _flush_unless_starting_ranks() -> None:
    if os.getpid() != _skipping_in and _original is not None:
        _original()


@contextlib.contextmanager
def flushed_once() -> Iterator[None]:
    """Processes started inside the block skip multiprocessing's flush of sys.stdout and
    sys.stderr: they were flushed once as the block began."""
    global _skipping_in
    if _original is None:
        yield
        return
    _original()
    _skipping_in = os.getpid()
    util._flush_std_streams = _flush_unless_starting_ranks  # type: ignore[attr-defined]
    try:
        yield
    finally:
        _skipping_in = None
