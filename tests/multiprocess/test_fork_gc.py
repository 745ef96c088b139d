"""Forked ranks never collect the kernel's objects: garbage the kernel had not collected yet
when it forked (a cycle holding a buffered file, say) would otherwise be finalized in every
rank too — the file's buffer written once per rank — and the ranks' collector would walk
objects whose C-level state belongs to the kernel's threads (a rank died of SIGSEGV while
garbage-collecting in a suite run after a Ray cluster test)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from nbtrain import notebook_launcher


class Cycle:
    """Garbage only the cycle collector frees: it refers to itself."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.me = self


def collect_everything() -> int:
    return gc.collect()


def test_kernel_garbage_is_finalized_once_by_the_kernel(tmp_path: Path) -> None:
    path = tmp_path / "kernel.log"
    cycle = Cycle(path.open("w", buffering=1 << 16))
    cycle.handle.write("written once by the kernel\n")  # in the buffer, not in the file yet
    gc.collect()  # the cycle survives into the oldest generation...
    del cycle  # ...and is garbage there until a full collection
    notebook_launcher(
        collect_everything, num_processes=2, start_method="fork", progress="off", output="none"
    )
    gc.collect()
    assert path.read_text() == "written once by the kernel\n"
