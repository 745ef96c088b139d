"""``from accelerate.utils import X`` becomes ``from nbtrain.utils import X``: the names of
Accelerate's ``accelerate.utils`` that nbtrain supports, with Accelerate's signatures.

Each is the one implementation nbtrain already has, re-exported (nothing is defined here):

- across ranks (rank side; every rank makes the same calls): ``gather``, ``gather_object``,
  ``broadcast``, ``broadcast_object_list``, ``reduce`` (default "mean", as Accelerate's),
  ``pad_across_processes``, ``wait_for_everyone``; a rank calling one alone, or with tensors
  that do not match, gets ``DistributedOperationException`` instead of a hang;
- ``send_to_device``, ``set_seed``;
- configuration: ``ProjectConfiguration``, ``DataLoaderConfiguration``,
  ``GradientAccumulationPlugin``, ``FullyShardedDataParallelPlugin``, ``DistributedType``,
  ``LoggerType`` (``log_with``'s names; the trackers themselves: ``nbtrain.tracking``);
- kwargs handlers: ``DistributedDataParallelKwargs``, ``GradScalerKwargs``,
  ``InitProcessGroupKwargs``, ``AutocastKwargs``.

Names load on first use, as in ``nbtrain`` itself.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_OPERATIONS = "nbtrain.accelerator.front.operations"
_HANDLERS = "nbtrain.accelerator.front.handlers"

# name -> (module, its name there)
_LAZY: dict[str, tuple[str, str]] = {
    **{
        name: (_OPERATIONS, name)
        for name in (
            "broadcast",
            "broadcast_object_list",
            "gather",
            "gather_object",
            "pad_across_processes",
            "reduce",
            "send_to_device",
            "wait_for_everyone",
        )
    },
    **{
        name: (_HANDLERS, name)
        for name in (
            "AutocastKwargs",
            "DistributedDataParallelKwargs",
            "GradScalerKwargs",
            "InitProcessGroupKwargs",
        )
    },
    "DistributedOperationException": ("nbtrain.accelerator.comm.handshake", "CollectiveError"),
    "set_seed": ("nbtrain.accelerator.checkpoint.seed", "set_seed"),
    "ProjectConfiguration": ("nbtrain.accelerator.front.compat", "ProjectConfiguration"),
    "DataLoaderConfiguration": ("nbtrain.accelerator.data.loaderconfig", "DataLoaderConfiguration"),
    "GradientAccumulationPlugin": (
        "nbtrain.accelerator.training.accumulation",
        "GradientAccumulationPlugin",
    ),
    "FullyShardedDataParallelPlugin": (
        "nbtrain.accelerator.fsdp.plugin",
        "FullyShardedDataParallelPlugin",
    ),
    "DistributedType": ("nbtrain.accelerator.training.parallel", "DistributedType"),
    "LoggerType": ("nbtrain.accelerator.tracking.choose", "LoggerType"),
}

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from nbtrain.accelerator.checkpoint.seed import set_seed
    from nbtrain.accelerator.comm.handshake import CollectiveError as DistributedOperationException
    from nbtrain.accelerator.data.loaderconfig import DataLoaderConfiguration
    from nbtrain.accelerator.front.compat import ProjectConfiguration
    from nbtrain.accelerator.front.handlers import (
        AutocastKwargs,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
    )
    from nbtrain.accelerator.front.operations import (
        broadcast,
        broadcast_object_list,
        gather,
        gather_object,
        pad_across_processes,
        reduce,
        send_to_device,
        wait_for_everyone,
    )
    from nbtrain.accelerator.fsdp.plugin import FullyShardedDataParallelPlugin
    from nbtrain.accelerator.tracking.choose import LoggerType
    from nbtrain.accelerator.training.accumulation import GradientAccumulationPlugin
    from nbtrain.accelerator.training.parallel import DistributedType


def __getattr__(name: str) -> Any:
    found = _LAZY.get(name)
    if found is None:
        raise AttributeError(
            f"module 'nbtrain.utils' has no attribute {name!r} (nbtrain supports these of "
            f"accelerate.utils: {', '.join(sorted(_LAZY))})"
        )
    module, attribute = found
    return getattr(import_module(module), attribute)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "LoggerType",
    "ProjectConfiguration",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "pad_across_processes",
    "reduce",
    "send_to_device",
    "set_seed",
    "wait_for_everyone",
]
