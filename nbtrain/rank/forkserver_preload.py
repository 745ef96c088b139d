"""The forkserver's one preload module (kernel/procs/forkserver.py): imports what ranks start with,
deaf to Ctrl-C meanwhile.

multiprocessing's forkserver ignores Ctrl-C only once its preload is over, and drops an
ImportError of a preload module. A Ctrl-C in the kernel reaches its forkserver too (they share
a process group), and one pressed while a cold forkserver imported numpy for torch became an
ImportError ("cannot load module more than once per process"): that forkserver lived on half
imported and served ranks whose ``import torch`` failed. Ctrl-C is ignored here from the first
import on; the handler the forkserver had is restored after, so ranks get theirs as before. A
module that is truly missing is skipped, as multiprocessing does: a rank that needs it raises.
"""

from __future__ import annotations

import importlib
import signal

from nbtrain.shared.preload import PRELOAD


def _preload() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError:  # (as multiprocessing would): the rank then imports it itself
                continue
    finally:
        signal.signal(signal.SIGINT, previous)


_preload()
