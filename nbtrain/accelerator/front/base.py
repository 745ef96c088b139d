"""The Accelerator's state and where this rank sits: the attributes every part of the
front end shares, its properties, and ``unwrap_model`` (core.py assembles the parts)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from nbtrain.accelerator.checkpoint import stopping
from nbtrain.accelerator.checkpoint.target import CheckpointTarget
from nbtrain.accelerator.comm import collectives
from nbtrain.accelerator.data import loaderconfig
from nbtrain.accelerator.data import prepared as data
from nbtrain.accelerator.training import precision
from nbtrain.accelerator.training.accumulation import GradientState, check_steps
from nbtrain.accelerator.training.optim import PreparedOptimizer, PreparedScheduler
from nbtrain.accelerator.training.parallel import DistributedType
from nbtrain.rank import rankenv

F = TypeVar("F", bound=Callable[..., Any])




# Models any Accelerator of this process prepared: as in Accelerate (whose state is one per
# process), a later Accelerator() works with what an earlier one prepared, e.g. in a later cell
# of warm ranks (kernel/warm/).
PREPARED_MODELS: weakref.WeakSet[nn.Module] = weakref.WeakSet()


class AcceleratorBase:
    """What every part of the Accelerator front end reads (set up by Accelerator.__init__)."""

    # Set by Accelerator.__init__ (core.py); declared here for the methods of every part.
    gradient_state: GradientState
    """Where gradient accumulation stands (``sync_gradients``, ``num_steps``, ...)."""
    dataloader_config: Any
    """The ``DataLoaderConfiguration`` prepared loaders follow."""
    project_configuration: Any
    """The ``ProjectConfiguration``: project and logging folders, automatic checkpoint naming."""
    device_placement: bool
    """Whether ``prepare`` moves objects to ``device`` unless told otherwise."""
    step_scheduler_with_optimizer: bool
    """Whether prepared schedulers step with their optimizer (Accelerate's default: True)."""
    fsdp_plugin: Any
    """The ``FullyShardedDataParallelPlugin`` when models are sharded with FSDP2, else None."""
    _split_arg: bool
    _even_arg: bool
    _placement: rankenv.Placement
    _device: torch.device
    _precision: precision.Precision
    _ddp_kwargs: Any
    _strategy: Any
    _collectives: collectives.Collectives
    _models: list[nn.Module]
    _optimizers: list[PreparedOptimizer]
    _schedulers: list[PreparedScheduler]
    _dataloaders: list[data.PreparedDataLoader]
    _custom: list[Any]
    _stops: stopping.Stops
    _trigger: int

    def _checkpoint_target(self) -> CheckpointTarget:
        """This Accelerator as its checkpoints see it (state.py builds it; declared here so
        every part of the front end can hand it to checkpoint/)."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------
    # Where this rank is

    @property
    def device(self) -> torch.device:
        """The device this rank computes on: ``cuda:<local rank>`` (or the GPU ``gpu_ids`` gave it),
        an XLA device, else the CPU. ``prepare`` moves models and batches here."""
        return self._device

    @property
    def distributed_type(self) -> DistributedType:
        """How the ranks train together: a ``DistributedType`` (``MULTI_CPU``, ``MULTI_GPU``,
        ``XLA``, ``FSDP``, or ``NO`` for one process)."""
        return self._strategy.distributed_type

    @property
    def num_processes(self) -> int:
        """How many ranks the launch runs (its world size)."""
        return self._collectives.world_size

    @property
    def process_index(self) -> int:
        """This rank's number, 0 to ``num_processes - 1`` (its global rank)."""
        return self._collectives.rank

    @property
    def local_process_index(self) -> int:
        """This rank's number on its own machine (its local rank)."""
        return self._placement.local_rank

    @property
    def is_main_process(self) -> bool:
        """True on rank 0 only: where to save, print or log once for the whole launch."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on the first rank of each machine (local rank 0)."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """True on the rank numbered ``num_processes - 1``."""
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        """True when the launch has more than one rank."""
        return self.num_processes > 1

    @property
    def is_fsdp2(self) -> bool:
        """True when this Accelerator shards models with FSDP2 (``fsdp_plugin`` given)."""
        return self.fsdp_plugin is not None

    @property
    def mixed_precision(self) -> str:
        """The precision mode in use: ``'no'``, ``'fp16'`` or ``'bf16'``."""
        return self._precision.mode.value

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The fp16 gradient scaler (``torch.amp.GradScaler``) with ``mixed_precision='fp16'``, else
        None; ``backward`` and the prepared optimizer use it for you."""
        return self._precision.scaler

    @property
    def split_batches(self) -> bool:
        """True: a prepared loader's batch is split across the ranks (each rank gets a slice); False
        (default): each rank loads whole batches of its own. Set it before ``prepare`` for loaders
        prepared afterwards."""
        return self._loader_options().split_batches

    @split_batches.setter
    def split_batches(self, value: bool) -> None:  # (for loaders prepared from now on)
        self._split_arg = bool(value)
        self.dataloader_config.split_batches = bool(value)

    @property
    def even_batches(self) -> bool:
        """True (default): every rank gets as many batches as the others, the last ones completed
        with samples from the start; False: the last batches may differ. Set it before ``prepare``
        for loaders prepared afterwards."""
        return self._loader_options().even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self._even_arg = bool(value)
        self.dataloader_config.even_batches = bool(value)

    @property
    def dispatch_batches(self) -> bool:
        """True: rank 0 loads every batch and sends each rank its part
        (``DataLoaderConfiguration(dispatch_batches=True)``); False: each rank loads its own."""
        return self._loader_options().dispatch_batches

    @property
    def use_seedable_sampler(self) -> bool:
        """True: prepared loaders shuffle with a seedable sampler, the same order on every rank for
        a given seed and epoch (``DataLoaderConfiguration(use_seedable_sampler=True)``)."""
        return self._loader_options().seedable

    def _loader_options(self) -> loaderconfig.LoaderOptions:
        return loaderconfig.options(self.dataloader_config, self._split_arg, self._even_arg)

    @property
    def project_dir(self) -> str | None:
        """The project folder (``project_dir=`` or ``ProjectConfiguration``): where automatically
        named checkpoints go; None if not set."""
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        """Where trackers write their files (``logging_dir=`` or ``ProjectConfiguration``), None if
        not set."""
        return getattr(self.project_configuration, "logging_dir", None)

    @property
    def save_iteration(self) -> int:
        """The number of the next automatically named checkpoint."""
        return int(self.project_configuration.iteration)

    # ---------------------------------------------------------------------------------------
    # Gradient accumulation state

    @property
    def sync_gradients(self) -> bool:
        """True when the current step synchronises gradients (the last micro-step of an
        accumulation, or every step without accumulation): the step where the optimizer really
        steps."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.sync_gradients = bool(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        """How many micro-steps each optimizer step accumulates (``gradient_accumulation_steps=``).

        :raises ValueError: when set to a number below 1.
        """
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self.gradient_state.num_steps = check_steps(value)

    @property
    def step(self) -> int:
        """Micro-steps since gradients were last synchronised (Accelerate's ``step``)."""
        return self.gradient_state.step

    @step.setter
    def step(self, value: int) -> None:
        self.gradient_state.step = int(value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when the fp16 grad scaler skipped the last step (inf/NaN gradients)."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    # ---------------------------------------------------------------------------------------
    # prepare

    def unwrap_model(
        self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        """The user's own module (without DDP; without autocast if keep_fp32_wrapper=False).

        :param model: a prepared model.
        :param keep_fp32_wrapper: keep the forward that autocasts and returns float32 outputs
            (default True).
        :param keep_torch_compile: keep a ``torch.compile`` wrapper (default True); False: the
            compiled module's original.
        """
        inner = self._strategy.unwrap_model(model)
        if not keep_torch_compile:
            inner = getattr(inner, "_orig_mod", inner)
        if not keep_fp32_wrapper:
            precision.unwrap_forward(getattr(inner, "_orig_mod", inner))
        return inner

    # ---------------------------------------------------------------------------------------
    # Training step

