"""Rank side of a launch's payload: load the call, return large results through /dev/shm.

The call arrives as a ``sharedmem.Envelope``: under fork it names the kernel's own objects (the
rank finds them in its copy-on-write pages), under forkserver and spawn large tensors and arrays
are mapped from the launch's segment. A large result goes the other way: its bytes are written
once to a segment the kernel maps (and unlinks) instead of being pickled through the pipe.
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Callable
from typing import Any

from . import sharedmem

# The prefix under which this rank may create result segments; set when a launch's envelope
# arrives (None in the kernel and in launches that do not take results that way).
_results_prefix: str | None = None
_counter = itertools.count()


def load_call(payload: bytes) -> tuple[Callable[..., Any], tuple, dict]:
    """``(function, args, kwargs)`` from a launch's envelope (or a plain pickled call)."""
    global _results_prefix
    value = sharedmem.loads(payload, private=True)
    if isinstance(value, sharedmem.Envelope):
        _results_prefix = value.results_prefix
        value = value.call
    function, args, kwargs = value
    return function, args, kwargs


def pack_result(value: Any, pickler: type[sharedmem.SharingPickler]) -> bytes:
    """Pickle a result with ``pickler``; large tensors and arrays through a segment if the
    launch takes them that way. Without room in /dev/shm, the result travels in the pickle."""
    if _results_prefix is None:
        return _dump(value, pickler, None)
    segment = sharedmem.Segment(f"{_results_prefix}r{os.getpid()}_{next(_counter)}")
    data = _dump(value, pickler, segment)
    try:
        segment.write(keep_mapped=False)
    except sharedmem.SharedMemoryError:
        return _dump(value, pickler, None)  # slower, but the result still arrives
    return data


def _dump(value: Any, pickler: type[sharedmem.SharingPickler], segment: Any) -> bytes:
    buffer = io.BytesIO()
    pickler(buffer, segment=segment).dump(value)
    return buffer.getvalue()
