"""The Accelerator's ``prepare``: what each model, optimizer, scheduler and dataloader becomes
(core.py assembles the parts)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from nbtrain.accelerator.data import loaderconfig, loaders
from nbtrain.accelerator.data import prepared as data
from nbtrain.accelerator.front.base import PREPARED_MODELS, AcceleratorBase
from nbtrain.accelerator.training.optim import PreparedOptimizer, PreparedScheduler
from nbtrain.accelerator.training.parallel import DistributedType


class PrepareMethods(AcceleratorBase):
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, dataloaders and LR schedulers, in any order; they come
        back in the same order (a single object when one is given).

        :param args: the objects to prepare.
        :param device_placement: one bool per object: whether to move it to ``device`` (default: the
            Accelerator's ``device_placement``).
        :raises ValueError: ``device_placement`` does not have one bool per object.
        :raises TypeError: an object of a kind ``prepare`` does not know.
        """
        if device_placement is None:
            device_placement = [self.device_placement] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(
                f"prepare(device_placement={device_placement!r}) needs one bool per object "
                f"({len(args)} given)."
            )
        kinds = [_kind_of(obj, index) for index, obj in enumerate(args)]
        result = list(args)
        # Models first (optimizers must see parameters on their device), schedulers after
        # their optimizers; the order of the objects given does not matter.
        for phase in ("model", "optimizer", "scheduler", "dataloader"):
            for index, (obj, kind) in enumerate(zip(args, kinds, strict=True)):
                if kind == phase:
                    result[index] = self._prepare_one(kind, obj, device_placement[index])
        # resume=True loads once everything is prepared
        self._stops.after_prepare(self._checkpoint_target())
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_one(self, kind: str, obj: Any, placement: bool) -> Any:
        if kind == "model":
            return self.prepare_model(obj, device_placement=placement)
        if kind == "optimizer":
            return self.prepare_optimizer(obj, device_placement=placement)
        if kind == "scheduler":
            return self.prepare_scheduler(obj)
        if kind == "dataloader":
            return self.prepare_data_loader(obj, device_placement=placement)
        return obj  # None passes through

    def prepare_model(
        self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> nn.Module:
        """Place the model, run its forward under mixed precision and (unless
        ``evaluation_mode``, for a model that is only evaluated) wrap it in DDP.

        :param model: a ``torch.nn.Module``.
        :param device_placement: move it to ``device`` (default: the Accelerator's
            ``device_placement``).
        :param evaluation_mode: place it without wrapping it in DDP.
        """
        for prepared in self._models:  # preparing again (the wrapper or the raw module)
            if model is prepared or model is self._strategy.unwrap_model(prepared):
                return prepared
        placement = self.device_placement if device_placement is None else device_placement
        if placement and not any(p.is_meta for p in model.parameters()):
            model.to(self._device)  # (meta weights: FSDP's cpu_ram_efficient_loading fills them)
        self._precision.wrap_forward(self._strategy.unwrap_model(model))
        wrapped = model if evaluation_mode else self._strategy.wrap_model(model, self._ddp_kwargs)
        self._models.append(wrapped)
        PREPARED_MODELS.add(wrapped)
        return wrapped

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> PreparedOptimizer:
        """Prepare one optimizer (``prepare`` does it for each optimizer it gets): its state on the
        model's device, its steps skipped on accumulation micro-steps and scaled in fp16.

        :param optimizer: a ``torch.optim.Optimizer`` (one already prepared is returned as is).
        :param device_placement: move its state to the device (default: the Accelerator's
            ``device_placement``).
        """
        if isinstance(optimizer, PreparedOptimizer):
            return optimizer
        placement = self.device_placement if device_placement is None else device_placement
        if placement and optimizer.state and self._device.type != "cpu":
            # load_state_dict casts existing state (e.g. Adam moments) to each param's device.
            optimizer.load_state_dict(optimizer.state_dict())
        hook = getattr(self._strategy, "prepare_optimizer", None)
        if hook is not None:  # XLA: gradients are all-reduced right before each real step
            hook(optimizer)
        prepared = PreparedOptimizer(optimizer, self.gradient_state, self._precision.scaler)
        self._optimizers.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> PreparedScheduler:
        """Prepare one learning-rate scheduler (``prepare`` does it): it steps when its optimizer
        really steps, once per rank's share of the batches as Accelerate does.

        :param scheduler: a ``torch.optim.lr_scheduler`` scheduler, for an optimizer prepared before
            it (one already prepared is returned as is).
        """
        if isinstance(scheduler, PreparedScheduler):
            return scheduler
        target = getattr(scheduler, "optimizer", None)
        linked = [o for o in self._optimizers if target is o or target is o.optimizer]
        prepared = PreparedScheduler(
            scheduler,
            linked or list(self._optimizers),
            self.gradient_state,
            num_processes=self.num_processes,
            split_batches=self.split_batches,
            step_with_optimizer=self.step_scheduler_with_optimizer,
        )
        self._schedulers.append(prepared)
        return prepared

    def prepare_data_loader(
        self,
        loader: DataLoader,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Any = None,
    ) -> data.PreparedDataLoader:
        """With ``dispatch_batches`` the main process loads and sends each rank its rows
        (dispatch.py); ``slice_fn_for_dispatch`` is accepted and not used: the rows a rank gets
        follow the same sharding as without dispatching.

        :param loader: a ``torch.utils.data.DataLoader``.
        :param device_placement: move its batches to ``device`` (default: the Accelerator's
            ``device_placement``).
        """
        if isinstance(loader, data.PreparedDataLoader):
            return loader
        placement = self.device_placement if device_placement is None else device_placement
        opts = self._loader_options()
        seed = loaderconfig.agree_on_seed(loader, opts, self._collectives)
        # XLA:CPU ordinals are threads sharing the user's loader and generator: following it
        # would advance it once per ordinal, so several ordinals seed each epoch instead.
        xla = self.distributed_type is DistributedType.XLA and self.num_processes > 1
        prepared = loaders.prepare_data_loader(
            loader,
            world_size=self.num_processes,
            rank=self.process_index,
            split_batches=opts.split_batches,
            even_batches=opts.even_batches,
            seed=seed,
            device=self._device if placement else None,
            gradient_state=self.gradient_state,
            loader_class=getattr(self._strategy, "dataloader_class", None),
            seedable=opts.seedable or xla,
            follow_user=opts.data_seed is None,
            share=functools.partial(self._collectives.broadcast_object, from_process=0),
            dispatch_with=self._collectives if opts.dispatch_batches else None,
        )
        if self._stops.active:
            prepared.stop_point = functools.partial(self._stops.point, self._checkpoint_target())
            self._stops.arm()
        self._dataloaders.append(prepared)
        return prepared


def _kind_of(obj: Any, index: int) -> str:
    if obj is None:
        return "none"
    if isinstance(obj, nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, DataLoader):
        return "dataloader"
    if isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, PreparedScheduler)) or (
        hasattr(obj, "optimizer")
        and callable(getattr(obj, "step", None))
        and callable(getattr(obj, "state_dict", None))
    ):
        return "scheduler"
    raise TypeError(
        f"prepare() got {_describe(obj)} as object #{index}. It prepares torch.nn.Module models, "
        "torch.optim optimizers, torch.utils.data.DataLoader loaders and LR schedulers; use other "
        "objects directly, without prepare()." + _hint(obj)
    )


def _describe(obj: Any) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__name__}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"


def _hint(obj: Any) -> str:
    if isinstance(obj, type) and issubclass(obj, (nn.Module, torch.optim.Optimizer)):
        return f" Pass an instance, e.g. {obj.__name__}(...), not the class."
    if isinstance(obj, torch.utils.data.Dataset):
        return " Wrap a Dataset in a DataLoader first: DataLoader(dataset, batch_size=...)."
    if isinstance(obj, (list, tuple)):
        return " Pass the objects one by one: prepare(*objects)."
    return ""
