"""The Accelerator on XLA devices (TPU cores, XLA:CPU): the DistributedType.XLA strategy.

Selected through ``parallel.STRATEGIES``; torch_xla is imported only inside these functions, so
importing this module costs nothing where torch_xla is missing. Here the strategy; beside it
``xla_loader`` (dataloaders), ``xla_collectives`` (the transport) and ``xla_runtime`` (device,
step mark, safetensors).

- device: ``torch_xla.device()`` of the calling ordinal (``current_device``, used by choice.py);
- models: no DDP; parameters are broadcast from ordinal 0 when prepared, so every replica starts
  identical whatever each one's RNG drew;
- optimizers: the gradients are averaged across ordinals just before the optimizer steps (a step
  pre-hook, so accumulation and fp16/bf16 wrappers are unchanged); the step only happens on
  synchronising micro-steps, so the all-reduce does too. Gradient clipping averages them earlier
  (``reduce_gradients``: the norm must be the full gradient's, the same on every ordinal), and the
  step then skips what is already averaged;
- dataloaders: the same sharding as every other strategy; the dataset runs on the training
  thread with ``num_workers=0`` (random augmentations draw as on the CPU), else in the workers,
  whose batches torch_xla's ParallelLoader moves to the device in a background thread
  (prefetch). The step boundary (``torch_xla.sync()``, which cuts and runs the lazy graph) comes
  when the next batch is asked for, so each training step is one graph;
- collectives: XLA all-gather / all-reduce / broadcast, followed by a sync, so their values are
  ready when nbtrain reads them. The handshake's all-gather runs in a helper thread, so a rank
  left alone in a collective (a peer ended, or never makes the call) gets collectives.py's
  bounded waits and clear errors instead of waiting inside XLA forever; an ordinal that catches
  such an error and goes on fails anyway (``XlaCollectiveAbandoned``);
- checkpoints: save_state marks XLA steps (the device RNG is read at a step boundary, and the
  barriers are steps of their own), and each mark moves the device RNG on. So a run that saves
  and then goes on draws other device random numbers afterwards than a run that never saved; a
  run resumed from the checkpoint draws the same as the run that never saved.

Every ``torch_xla.sync`` is looked up at call time (tests on XLA:CPU replace it: tests/xla).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from nbtrain.accelerator.comm.backends import LocalBackend
from nbtrain.accelerator.comm.collectives import Collectives
from nbtrain.accelerator.devices.xla_collectives import XlaBackend, check_usable
from nbtrain.accelerator.devices.xla_loader import XlaDataLoader
from nbtrain.accelerator.devices.xla_runtime import sync, world_size
from nbtrain.accelerator.training.parallel import DistributedType


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
        # Keyed by the parameters themselves, held weakly (never by id(): a parameter made after
        # one was collected may get its id, and would then be taken for it and never watched).
        # An entry goes with its parameter; forget() drops the rest (Accelerator.free_memory).
        self._averaged = WeakIdKeyDictionary()  # parameters whose .grad is this step's average
        self._watched = WeakIdKeyDictionary()  # parameter -> handle of our accumulate-grad hook

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
            optimizer.register_step_pre_hook(self._before_step)

    def reduce_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Average these parameters' gradients across ordinals now, for gradient clipping: DDP
        has averaged them in backward, XLA only does at the optimizer step, and clipping each
        ordinal's own gradient by its own norm would step every replica differently."""
        if self.world_size == 1:
            return
        fresh = [p for p in parameters if p.grad is not None and p not in self._averaged]
        _average([p.grad for p in fresh if p.grad is not None], self.world_size)
        for parameter in fresh:
            self._averaged[parameter] = True
            self._watch(parameter)

    def _watch(self, parameter: torch.Tensor) -> None:
        # Another backward pass adds this ordinal's own gradient to the average: from then on
        # the gradient needs averaging again.
        if parameter not in self._watched:
            self._watched[parameter] = parameter.register_post_accumulate_grad_hook(
                self._accumulated
            )

    def _accumulated(self, parameter: torch.Tensor) -> None:
        self._averaged.pop(parameter, None)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        check_usable(self.collectives.rank)  # the step's all-reduce is an XLA collective too
        params = [p for group in optimizer.param_groups for p in group["params"]]
        pending = [p.grad for p in params if p.grad is not None and p not in self._averaged]
        _average(pending, self.world_size)
        for parameter in params:
            self._averaged.pop(parameter, None)

    def forget(self) -> None:
        """Accelerator.free_memory: drop what this strategy knows of parameters, and take its
        hook off those still alive (a model kept past free_memory no longer calls into it)."""
        for handle in list(self._watched.values()):
            handle.remove()
        self._watched.clear()
        self._averaged.clear()

    def close(self) -> None:
        return None


def _average(gradients: list[torch.Tensor], world: int) -> None:
    """In place, across every ordinal (one all-reduce, in the step's graph)."""
    if gradients:
        import torch_xla.core.xla_model as xm

        xm.all_reduce(xm.REDUCE_SUM, gradients, scale=1.0 / world)
