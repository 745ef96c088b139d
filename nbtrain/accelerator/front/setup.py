"""What Accelerator.__init__ gathers from its arguments: Accelerate's arguments nbtrain has no
feature for (warned about or refused), the True/False ones, the kwargs handlers' options, the
gradient accumulation state and the strategy."""

from __future__ import annotations

from typing import Any

import torch

from nbtrain.accelerator.comm import collectives
from nbtrain.accelerator.devices import choice as devices
from nbtrain.accelerator.front import compat, handlers
from nbtrain.accelerator.fsdp import setup as fsdp_setup
from nbtrain.accelerator.training import parallel
from nbtrain.accelerator.training.accumulation import GradientState, check_steps

# Accelerate's arguments for features nbtrain does not have (compat.check_unsupported), in the
# order they are checked.
UNSUPPORTED = (
    "rng_types",
    "dynamo_backend",
    "dynamo_plugin",
    "deepspeed_plugin",
    "deepspeed_plugins",
    "megatron_lm_plugin",
    "torch_tp_plugin",
    "parallelism_config",
)
FLAGS = (
    "cpu",
    "device_placement",
    "split_batches",
    "even_batches",
    "step_scheduler_with_optimizer",
)


def check_arguments(arguments: dict[str, Any]) -> handlers.Options:
    """``arguments``: Accelerator.__init__'s, by name. Refuses bad ones before anything is set
    up, and returns the options of ``kwargs_handlers``."""
    compat.check_unsupported({name: arguments[name] for name in UNSUPPORTED})
    for name in FLAGS:
        value = arguments[name]
        if not isinstance(value, bool):
            raise TypeError(f"Accelerator({name}={value!r}) must be True or False.")
    return handlers.collect(arguments["kwargs_handlers"])


def strategy_for(
    device: torch.device, world_size: int, options: handlers.Options, fsdp_plugin: Any
) -> parallel.Strategy:
    """Initialises the process group (lazily: here, not at import) when there are several
    ranks, with the backend that fits the device unless the user's code already made one."""
    kind = parallel.distributed_type_for(device, world_size)
    backend = options.backend or devices.process_group_backend(
        device, torch.distributed.is_available() and torch.distributed.is_nccl_available()
    )
    timeout = options.timeout or collectives.DEFAULT_TIMEOUT
    devices.activate(device)  # before the process group: nccl binds the current GPU
    if fsdp_plugin is not None:
        return fsdp_setup.create(device, world_size, fsdp_plugin, backend, timeout)
    return parallel.create(kind, device, backend=backend, timeout=timeout)


def gradient_state(steps: object, plugin: Any) -> GradientState:
    if plugin is None:
        return GradientState(num_steps=check_steps(steps))
    if steps != 1:
        raise ValueError(
            "Pass either gradient_accumulation_steps= or gradient_accumulation_plugin=, not both "
            f"(got gradient_accumulation_steps={steps!r} and a plugin)."
        )
    return GradientState.from_plugin(plugin)
