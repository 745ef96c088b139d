"""How ranks train together: the process group, model wrapping and gradient sync.

A strategy per ``DistributedType``, found in ``STRATEGIES``. The TPU issue adds
``DistributedType.XLA: "nbtrain.accelerator.devices.xla:XlaStrategy"`` there, one module that
implements the same small ``Strategy`` protocol (device, collectives backend, wrap/unwrap,
no_sync); nothing else changes. Strategy modules are imported only when chosen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from enum import Enum
from importlib import import_module
from typing import Any, Protocol

import torch
from torch import nn

from nbtrain.accelerator.comm.backends import LocalBackend, ProcessGroupBackend
from nbtrain.accelerator.comm.collectives import Collectives


class DistributedType(str, Enum):
    """How this run is distributed (a ``str`` Enum: ``== "MULTI_GPU"`` works as in Accelerate)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    XLA = "XLA"
    FSDP = "FSDP"  # several ranks sharding one model (nbtrain.fsdp), as Accelerate names it
    # Accelerate's other types: never an nbtrain run's, there so that scripts comparing against
    # them (``if accelerator.distributed_type == DistributedType.DEEPSPEED:``) run unchanged.
    DEEPSPEED = "DEEPSPEED"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


def distributed_type_for(device: torch.device, world_size: int) -> DistributedType:
    if device.type == "xla":
        return DistributedType.XLA
    if world_size == 1:
        return DistributedType.NO
    return DistributedType.MULTI_GPU if device.type == "cuda" else DistributedType.MULTI_CPU


class Strategy(Protocol):
    distributed_type: DistributedType
    collectives: Collectives

    def wrap_model(self, model: nn.Module, ddp_kwargs: dict[str, Any]) -> nn.Module: ...

    def unwrap_model(self, model: nn.Module) -> nn.Module: ...

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]: ...

    def close(self) -> None:
        """Release what the strategy set up (its process group)."""
        ...


class SingleProcess:
    """One rank: nothing to wrap, nothing to sync, every collective is the identity."""

    distributed_type = DistributedType.NO

    def __init__(self, device: torch.device, *, backend: str, timeout: float) -> None:
        self.collectives = Collectives(LocalBackend(), device, timeout)

    def wrap_model(self, model: nn.Module, ddp_kwargs: dict[str, Any]) -> nn.Module:
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        return None


class DataParallel:
    """Several ranks on CPU (gloo) or CUDA (nccl): DistributedDataParallel on one process group."""

    def __init__(self, device: torch.device, *, backend: str, timeout: float) -> None:
        self.device = device
        self.distributed_type = (
            DistributedType.MULTI_GPU if device.type == "cuda" else DistributedType.MULTI_CPU
        )
        self._owns_group = ensure_process_group(backend, timeout)
        self.collectives = Collectives(ProcessGroupBackend(), device, timeout)

    def wrap_model(self, model: nn.Module, ddp_kwargs: dict[str, Any]) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            return model
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (e.g. a frozen teacher): DDP would refuse it
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, **ddp_kwargs)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        no_sync = getattr(model, "no_sync", None)
        return no_sync() if callable(no_sync) else contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync(self, model: nn.Module) -> Iterator[None]:
        """The next backward all-reduces although the forward ran under no_sync: DDP then did
        not prepare its reducer for that backward, so it is prepared here (DDP's own flags;
        nothing else is changed)."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            yield
            return
        saved = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved

    def close(self) -> None:
        """Destroy the process group if this strategy made it (not one the user's code made)."""
        import torch.distributed as dist

        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False


STRATEGIES: dict[DistributedType, str] = {
    DistributedType.NO: "nbtrain.accelerator.training.parallel:SingleProcess",
    DistributedType.MULTI_CPU: "nbtrain.accelerator.training.parallel:DataParallel",
    DistributedType.MULTI_GPU: "nbtrain.accelerator.training.parallel:DataParallel",
    DistributedType.XLA: "nbtrain.accelerator.devices.xla:XlaStrategy",
}


def create(
    kind: DistributedType, device: torch.device, *, backend: str, timeout: float
) -> Strategy:
    location = STRATEGIES.get(kind)
    if location is None:
        raise NotImplementedError(
            f"DistributedType.{kind.name} is not supported by this version of nbtrain; train on "
            "CPU or CUDA (Accelerator(cpu=True) forces the CPU)."
        )
    module_name, _, attribute = location.partition(":")
    factory = getattr(import_module(module_name), attribute)
    strategy: Strategy = factory(device, backend=backend, timeout=timeout)
    return strategy


def ensure_process_group(backend: str, timeout: float) -> bool:
    """Initialise the default process group unless the user's code already did; True if it
    was made here."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(
            "This build of torch has no torch.distributed, which several ranks need. Install a "
            "standard torch build, or run with num_processes=1."
        )
    if dist.is_initialized():
        return False
    from nbtrain.rank.reporting import say

    say(f"forming the process group ({backend}): waiting for every rank")
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout))
    say("")
    return True
