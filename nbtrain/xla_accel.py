"""The Accelerator on XLA devices (TPU cores, XLA:CPU): the DistributedType.XLA strategy.

Selected through ``parallel.STRATEGIES``; torch_xla is imported only inside these functions, so
importing this module costs nothing where torch_xla is missing.

- device: ``torch_xla.device()`` of the calling ordinal (``current_device``, used by devices.py);
- models: no DDP; parameters are broadcast from ordinal 0 when prepared, so every replica starts
  identical whatever each one's RNG drew;
- optimizers: the gradients are averaged across ordinals just before the optimizer steps (a step
  pre-hook, so accumulation and fp16/bf16 wrappers are unchanged); the step only happens on
  synchronising micro-steps, so the all-reduce does too;
- dataloaders: the same sharding as every other strategy, batches moved to the device, and the
  step boundary (``torch_xla.sync()``, which cuts and runs the lazy graph) when the next batch is
  asked for, as torch_xla's MpDeviceLoader does;
- collectives: XLA all-gather / all-reduce / broadcast, followed by a sync, so their values are
  ready when nbtrain reads them.

Every ``torch_xla.sync`` is looked up at call time (tests on XLA:CPU replace it: tests/xla).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .collectives import Collectives, Done, LocalBackend, Pending
from .data import PreparedDataLoader
from .parallel import DistributedType


def current_device() -> str | None:
    """This ordinal's XLA device, when this process runs XLA: torch_xla already imported (by
    nbtrain's XLA host, or by the user's code) and a PJRT device chosen. Never imports it."""
    if "torch_xla" not in sys.modules or not os.environ.get("PJRT_DEVICE"):
        return None
    import torch_xla

    return str(torch_xla.device())


def sync() -> None:
    import torch_xla

    torch_xla.sync()


def world_size() -> int:
    try:
        import torch_xla.runtime as xr
    except ImportError as exc:
        raise ModuleNotFoundError(
            "DistributedType.XLA needs torch_xla, which is not installed: pip install "
            "'torch_xla[tpu]' (its version must match torch's), or train on CPU/CUDA."
        ) from exc

    return int(xr.world_size())


class XlaStrategy:
    distributed_type = DistributedType.XLA

    def __init__(self, device: torch.device, *, backend: str, timeout: float) -> None:
        self.device = device
        self.world_size = world_size()
        # Optimizers are usually made before prepare() moves the model. Moving a CPU parameter
        # to XLA cannot happen in place (different tensor types), so torch would hand the model
        # new Parameter objects and the optimizer would keep stepping the old CPU ones. Swapping
        # on conversion keeps every Parameter object and moves its payload instead.
        torch.__future__.set_swap_module_params_on_conversion(True)
        transport = XlaBackend(device) if self.world_size > 1 else LocalBackend()
        self.collectives = Collectives(transport, device, timeout)
        self.dataloader_class = XlaDataLoader

    def wrap_model(self, model: nn.Module, ddp_kwargs: dict[str, Any]) -> nn.Module:
        if self.world_size > 1:
            import torch_xla.core.xla_model as xm

            xm.broadcast_master_param(model)  # every replica starts from ordinal 0's values
            sync()
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        # Gradients are only reduced when the optimizer really steps (a synchronising
        # micro-step), so there is nothing to switch off.
        return contextlib.nullcontext()

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the gradients across ordinals right before each real optimizer step."""
        if self.world_size > 1:
            optimizer.register_step_pre_hook(_reduce_gradients)

    def close(self) -> None:
        return None


def _reduce_gradients(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    import torch_xla.core.xla_model as xm

    xm.reduce_gradients(optimizer)


class XlaDataLoader(PreparedDataLoader):
    """A prepared loader whose iteration marks the XLA step when the next batch is asked for."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        for batch in super().__iter__():
            yield batch
            sync()  # the user's step on this batch is one graph: run it before the next batch


# ---------------------------------------------------------------------------------------------
# Collectives transport


class XlaBackend:
    """XLA collectives across every ordinal. Each call ends with a sync (the step marker), which
    runs the collective in one graph on every replica before the values are read."""

    _OPS = {"sum": "sum", "max": "max", "min": "min"}

    def __init__(self, device: torch.device) -> None:
        import torch_xla.runtime as xr

        self.device = device
        self.rank = int(xr.global_ordinal())
        self.world_size = int(xr.world_size())

    def all_gather_async(self, tensor: torch.Tensor) -> Pending:
        return Done(self.all_gather(tensor))

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        import torch_xla.core.xla_model as xm

        flat = tensor.to(self.device).unsqueeze(0)
        # pin_layout=False: the native all-gather, one graph for every replica (the pinned
        # variant builds it from an all-reduce with the ordinal baked in as a constant).
        gathered = xm.all_gather(flat, dim=0, pin_layout=False)
        sync()
        return [part.squeeze(0).to(tensor.device) for part in gathered.cpu().split(1, dim=0)]

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        import torch_xla.core.xla_model as xm

        work = tensor.to(self.device)
        xm.all_reduce(self._OPS[op], [work])
        sync()
        if work is not tensor:
            tensor.copy_(work.to(tensor.device))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        import torch_xla.core.xla_model as xm

        work = tensor.to(self.device)
        xm.collective_broadcast([work], root_ordinal=src)
        sync()
        if work is not tensor:
            tensor.copy_(work.to(tensor.device))

    def all_gather_object(self, obj: Any) -> list[Any]:
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = self.all_gather(torch.tensor([data.numel()], dtype=torch.int64))
        longest = max(int(size) for size in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: data.numel()] = data
        parts = self.all_gather(padded)
        return [
            pickle.loads(part[: int(size)].numpy().tobytes())
            for part, size in zip(parts, sizes, strict=True)
        ]

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return self.all_gather_object(obj if self.rank == src else None)[src]


# ---------------------------------------------------------------------------------------------
# Checkpoints: safetensors reads tensor storage directly, which XLA tensors do not expose, so
# XLA models are written from a CPU copy of their state (tied weights stored once, as
# safetensors' own save_model does) and read back by copying CPU values into the parameters.


def _tied_groups(model: nn.Module) -> list[list[str]]:
    groups: dict[int, list[str]] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(value), []).append(name)
    return list(groups.values())


def write_safetensors(model: nn.Module, path: str) -> None:
    from safetensors.torch import save_file

    state = model.state_dict()
    cpu = {names[0]: state[names[0]].detach().cpu().contiguous() for names in _tied_groups(model)}
    save_file(cpu, path, metadata={"format": "pt"})


def read_safetensors(model: nn.Module, path: str) -> None:
    from safetensors.torch import load_file

    saved = load_file(path, device="cpu")
    state: dict[str, torch.Tensor] = {}
    for names in _tied_groups(model):
        found = next((saved[name] for name in names if name in saved), None)
        if found is not None:
            state.update(dict.fromkeys(names, found))
    model.load_state_dict(state, strict=True)  # copies into the XLA parameters in place
