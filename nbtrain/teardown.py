"""Keeps a rank's ``destroy_process_group()`` from deadlocking the rank (installed by the worker).

The everyday pattern ``ddp = DistributedDataParallel(model); ...; dist.destroy_process_group()``
followed by ``return`` leaves DDP's reducer holding the last reference to the gloo process group.
When the function's frame is freed, the reducer's destructor destroys the group while holding
the GIL, and ``~ProcessGroupGloo`` joins its worker threads; a worker thread that is still
dropping the last collective's tensors needs the GIL to do so. Both wait forever (seen in about
one run in six of ``nbtrain demo`` on two cores; it is torch's bug, not the user's).

The fix here: every group ``destroy_process_group`` removes stays referenced until the rank's
process exits, so no group is ever destroyed inside a Python deallocation. Destroying still does
everything else (the group leaves torch's registry; a new ``init_process_group`` works). The
cost is one idle group's threads and sockets per destroyed group until the rank exits.
"""

from __future__ import annotations

import functools
from typing import Any

_kept: list[Any] = []  # the groups destroy_process_group released: alive until exit


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


def _released_by(c10d: Any, group: Any) -> list[Any]:
    """The groups one destroy_process_group(group) call removes from torch's registry."""
    registry = getattr(getattr(c10d, "_world", None), "pg_map", None)
    if not isinstance(registry, dict):
        return [group] if group is not None else []
    if group is None or group is c10d.GroupMember.WORLD:
        return list(registry)  # destroying the default group destroys every group
    return [group] if group in registry else []
