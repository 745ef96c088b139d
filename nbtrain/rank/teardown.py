"""Keeps a rank's ``destroy_process_group()`` from deadlocking the rank (installed by the worker).

The everyday pattern ``ddp = DistributedDataParallel(model); ...; dist.destroy_process_group()``
followed by ``return`` leaves DDP's reducer holding the last reference to the gloo process group.
When the function's frame is freed, the reducer's destructor destroys the group while holding
the GIL, and ``~ProcessGroupGloo`` joins its worker threads; a worker thread that is still
dropping the last collective's tensors needs the GIL to do so. Both wait forever (seen in about
one run in six of ``nbtrain demo`` on two cores; it is torch's bug, not the user's).

The fix here: every group ``destroy_process_group`` removes stays referenced until the user's
function has returned, so no group is destroyed inside a Python deallocation of theirs.
Destroying still does everything else (the group leaves torch's registry). Then ``release``
frees them, and destroys any group the function left initialized, after handing the GIL to the
groups' threads for a moment so they finish with the last collective's tensors. Leaving groups
to interpreter shutdown instead (spawn ranks run a full finalization) aborts the process now
and then, as a gloo thread asks for the GIL while Python is finalizing.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from typing import Any

_kept: list[Any] = []  # the groups destroy_process_group released: alive until release()
_DRAIN = 0.05  # seconds without the GIL before the kept groups are freed


def install() -> None:
    """Wrap ``torch.distributed.destroy_process_group`` in this process (idempotent)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group
    if getattr(original, "_nbtrain_keeps_groups", False):
        return

    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> None:
        _kept.extend(_released_by(c10d, group))
        original(group)

    destroy_process_group._nbtrain_keeps_groups = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def release(*, finalizing: bool) -> None:
    """After the user's function returned: destroy the groups it left initialized and free the
    kept ones, so none is left for interpreter shutdown (see the module docstring).

    Only a process that will run interpreter finalization (spawn) needs it: fork and forkserver
    children end in ``os._exit``, which frees nothing, so there the groups are simply left as
    they are (saving the drain's pause on every launch)."""
    if not finalizing:
        return
    dist = sys.modules.get("torch.distributed")
    leftover = dist is not None and dist.is_available() and dist.is_initialized()
    if not _kept and not leftover:
        return
    time.sleep(_DRAIN)  # a thread waiting for the GIL to drop a finished work's tensors gets it
    if leftover:
        with contextlib.suppress(Exception):  # best effort: the function's result is already sent
            dist.destroy_process_group()  # type: ignore[union-attr]
    _kept.clear()


def _released_by(c10d: Any, group: Any) -> list[Any]:
    """The groups one destroy_process_group(group) call removes from torch's registry."""
    registry = getattr(getattr(c10d, "_world", None), "pg_map", None)
    if not isinstance(registry, dict):
        return [group] if group is not None else []
    if group is None or group is c10d.GroupMember.WORLD:
        return list(registry)  # destroying the default group destroys every group
    return [group] if group in registry else []
