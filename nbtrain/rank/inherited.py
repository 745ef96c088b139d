"""What a rank must not inherit from the kernel: Hugging Face Accelerate's process-wide states,
and the devices Transformers' ``TrainingArguments`` cached there.

A forked rank starts with a copy of the kernel's memory. If the kernel formed Accelerate's
``PartialState`` (a 1-process launch that ran in the kernel, an ``Accelerator()`` or a
``TrainingArguments(...).device`` in a cell), every ``PartialState()`` / ``Accelerator()`` in
the rank would return that copy: ``DistributedType.NO``, "process 0 of 1" on every rank, with no
error. So each rank forgets them before the user's code runs, and forms the launch's world from
its own environment. The kernel's own state is left as it was (this runs in the rank only).
Forkserver and spawn ranks start clean; the reset costs them nothing.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable
from typing import Any

# Accelerate's singletons: each class keeps its state in the class attribute ``_shared_state``.
_ACCELERATE_STATES = ("PartialState", "AcceleratorState", "GradientState")
_TRAINING_ARGS_CACHE = "_setup_devices"  # TrainingArguments' cached_property: device, world
# Set up here already (a warm rank runs many calls): their device is this process's own.
# (By id, checked against a weak reference: TrainingArguments, a dataclass, is unhashable.)
_refreshed: dict[int, weakref.ref[Any]] = {}


def forget_accelerate_states() -> None:
    """Empty Accelerate's shared states in this process (only if the kernel loaded Accelerate:
    a rank that never had it does not import it)."""
    module = sys.modules.get("accelerate.state")
    if module is None:
        return
    for name in _ACCELERATE_STATES:
        shared = getattr(getattr(module, name, None), "_shared_state", None)
        if shared is not None:
            # clear(), not a new dict: instances made in the kernel share this very dict, so
            # they too see the rank's state once the rank forms it.
            shared.clear()


def forget_cached_devices(function: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """Set up again, for this rank, the device a ``TrainingArguments`` the call brings along (an
    argument, or a global or closure variable of the function) cached in the kernel: its
    ``distributed_state``, ``world_size``, ``process_index`` and ``device`` become the rank's.
    (Set up now, not on first use: ``world_size`` reads ``distributed_state`` without it.)"""
    module = sys.modules.get("transformers.training_args")
    if module is None:
        return
    kind = module.TrainingArguments
    found = {id(value): value for value in _reachable(function, args, kwargs)}
    for value in found.values():
        known = _refreshed.get(id(value))
        if not isinstance(value, kind) or (known is not None and known() is value):
            continue
        if vars(value).pop(_TRAINING_ARGS_CACHE, None) is not None:
            getattr(value, _TRAINING_ARGS_CACHE)  # (a cached_property: computes and caches)
        _refreshed[id(value)] = weakref.ref(value)


def _reachable(function: Any, args: tuple, kwargs: dict[str, Any]) -> Iterable[Any]:
    """The call's arguments and the function's globals and closure values: where notebook code
    keeps a ``TrainingArguments`` built in an earlier cell (no deeper walk: it would touch,
    and so copy, every page of the kernel's heap)."""
    yield from args
    yield from kwargs.values()
    code = getattr(function, "__code__", None)
    names = code.co_names if code is not None else ()
    namespace = getattr(function, "__globals__", {})
    yield from (namespace[name] for name in names if name in namespace)
    for cell in getattr(function, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
