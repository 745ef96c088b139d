"""Forked ranks leave the kernel's objects to the kernel's garbage collector.

A forked rank starts with a copy of every object of the kernel, garbage not yet collected
included. Left to the rank's collector, that garbage would be finalized once in every rank as
well as in the kernel (a buffered file in a cycle: its buffer written once per process), and the
collector would walk objects whose C-level state belongs to kernel threads that do not exist in
the rank (a rank died of SIGSEGV while garbage-collecting after the kernel had used Ray). The
kernel's objects are frozen (``gc.freeze``: moved out of every generation the collector scans)
for the moment of the fork, and thawed in the kernel right after: the rank's collector only sees
what the rank makes. It also keeps the collector from touching, and so copying, the kernel's
memory pages in every rank.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from nbtrain.shared.options import StartMethod


@contextlib.contextmanager
def kernel_objects_frozen(method: StartMethod) -> Iterator[None]:
    """Forks made inside the block start with the kernel's objects frozen. A kernel that froze
    objects itself (``gc.get_freeze_count()``) manages this already and is left as it is:
    thawing afterwards would thaw its objects too."""
    if method is not StartMethod.FORK or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
