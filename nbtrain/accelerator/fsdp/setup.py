"""The Accelerator's few FSDP decisions, kept out of accelerator.py: which plugin applies (the
argument, else ``ACCELERATE_USE_FSDP``), the refusal on XLA, the strategy, the live view's
strategy label, and the full-weights file of ``save_model``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nbtrain.accelerator.fsdp import plugin as fsdp_plugin


def plugin_for(
    plugin: object, device: torch.device
) -> fsdp_plugin.FullyShardedDataParallelPlugin | None:
    chosen = fsdp_plugin.from_environment() if plugin is None else fsdp_plugin.coerce(plugin)
    if chosen is not None and device.type == "xla":
        raise ValueError(
            "Accelerator(fsdp_plugin=...) on XLA: nbtrain's FSDP is torch's FSDP2, which does "
            "not run on XLA devices. On TPUs shard with torch_xla's own SPMD sharding "
            "(torch_xla.distributed.spmd: mark_sharding, or its FSDPv2 wrapper "
            "torch_xla.experimental.spmd_fully_sharded_data_parallel) outside the Accelerator; "
            "drop fsdp_plugin= (and ACCELERATE_USE_FSDP) to train with data parallelism."
        )
    return chosen


def create(
    device: torch.device,
    world_size: int,
    plugin: fsdp_plugin.FullyShardedDataParallelPlugin,
    backend: str,
    timeout: float,
) -> Any:
    from nbtrain.accelerator.fsdp.strategy import FsdpStrategy

    return FsdpStrategy(device, world_size, plugin.settings(), backend=backend, timeout=timeout)


def announce(strategy: Any) -> None:
    """Tell the live view (inside an nbtrain launch) which strategy this rank trains with."""
    name = getattr(strategy, "name", None)
    if name:
        from nbtrain.rank.reporting import announce_strategy

        announce_strategy(name)


def sharded(strategy: Any, model: nn.Module) -> bool:
    """Does ``model`` go through FSDP's gathering (get_state_dict / save_model)?"""
    return any(model is m for m in getattr(strategy, "models", ()))


def save_full(
    state: dict[str, torch.Tensor], directory: str | os.PathLike[str], safe: bool
) -> Path:
    """(Main process.) save_model's file from a gathered full state dict."""
    from nbtrain.accelerator.checkpoint.state import model_file
    from nbtrain.accelerator.fsdp.checkpoint import write_state_dict

    path, safe = model_file(directory, safe)
    write_state_dict(state, path, safe)
    return path
