"""Rank side of a launch's payload: unpack the call, pack the result (large results through
/dev/shm).

The call arrives as a ``sharedmem.Envelope``: under fork it names the kernel's own objects (the
rank finds them in its copy-on-write pages), under forkserver and spawn large tensors and arrays
are mapped from the launch's segment. A large result goes the other way: its bytes are written
once to a segment the kernel maps (and unlinks) instead of being pickled through the pipe.
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

from nbtrain.shared import sharedmem
from nbtrain.shared.serialization import describe_return_error, tied_to_process

# The prefix under which this rank may create result segments; set when a launch's envelope
# arrives (None in the kernel and in launches that do not take results that way).
_results_prefix: str | None = None
_counter = itertools.count()


def unpack_call(payload: bytes) -> tuple[Callable[..., Any], tuple, dict]:
    """``(function, args, kwargs)`` from a launch's envelope (or a plain pickled call)."""
    global _results_prefix
    value = sharedmem.loads(payload, private=True)
    if isinstance(value, sharedmem.Envelope):
        _results_prefix = value.results_prefix
        value = value.call
    function, args, kwargs = value
    return function, args, kwargs


def take_results_as(prefix: str | None) -> None:
    """Large results of the next command go to segments named ``prefix...`` (a warm rank's
    pull or cell; a launch's envelope sets it in ``unpack_call``)."""
    global _results_prefix
    _results_prefix = prefix


def pack_result(
    value: Any,
    pickler: type[sharedmem.SharingPickler] | None = None,
    *,
    rank: int = 0,
    what: str = "return value",
) -> bytes:
    """Pickle a result with ``pickler``; large tensors and arrays through a segment if the
    launch takes them that way. Without room in /dev/shm, the result travels in the pickle.

    :raises ReturnValueError: ``value`` cannot travel (a lock, an open file): names rank
        ``rank``, its ``what`` ("return value"), the culprit's type and what to return instead.
    """
    try:
        return _pack(value, pickler or ResultPickler)
    except _OpenFile as exc:
        raise describe_return_error(value, exc, rank=rank, what=what, culprit=exc.file) from None
    except Exception as exc:  # whatever pickling raises: TypeError, PicklingError, ...
        raise describe_return_error(value, exc, rank=rank, what=what) from None


def _pack(value: Any, pickler: type[sharedmem.SharingPickler]) -> bytes:
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


class _OpenFile(pickle.PicklingError):
    """An open file in a result: refused, never sent as something else (serialization.py)."""

    def __init__(self, file: object) -> None:
        super().__init__(f"an open file: {file!r}")
        self.file = file


class ResultPickler(sharedmem.SharingPickler):
    """Moves tensors to the CPU on the way out, so the kernel needs no GPU or XLA runtime;
    refuses open files (cloudpickle would send one opened for reading as a StringIO)."""

    def reducer_override(self, obj: Any) -> Any:
        if tied_to_process(obj):
            raise _OpenFile(obj)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            needs_cpu = obj.device.type != "cpu"
            needs_detach = obj.requires_grad and obj.grad_fn is not None
            if needs_cpu or needs_detach:
                moved = obj.detach().cpu()
                if obj.requires_grad and not needs_detach:
                    moved.requires_grad_(True)
                return _identity, (moved,)
        return super().reducer_override(obj)


def _identity(value: Any) -> Any:
    return value
