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
    dataloader_config: Any
    project_configuration: Any
    device_placement: bool
    step_scheduler_with_optimizer: bool
    fsdp_plugin: Any
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
        return self._device

    @property
    def distributed_type(self) -> DistributedType:
        return self._strategy.distributed_type

    @property
    def num_processes(self) -> int:
        return self._collectives.world_size

    @property
    def process_index(self) -> int:
        return self._collectives.rank

    @property
    def local_process_index(self) -> int:
        return self._placement.local_rank

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def is_fsdp2(self) -> bool:
        return self.fsdp_plugin is not None

    @property
    def mixed_precision(self) -> str:
        return self._precision.mode.value

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self._precision.scaler

    @property
    def split_batches(self) -> bool:
        return self._loader_options().split_batches

    @split_batches.setter
    def split_batches(self, value: bool) -> None:  # (for loaders prepared from now on)
        self._split_arg = bool(value)
        self.dataloader_config.split_batches = bool(value)

    @property
    def even_batches(self) -> bool:
        return self._loader_options().even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self._even_arg = bool(value)
        self.dataloader_config.even_batches = bool(value)

    @property
    def dispatch_batches(self) -> bool:
        return self._loader_options().dispatch_batches

    @property
    def use_seedable_sampler(self) -> bool:
        return self._loader_options().seedable

    def _loader_options(self) -> loaderconfig.LoaderOptions:
        return loaderconfig.options(self.dataloader_config, self._split_arg, self._even_arg)

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return getattr(self.project_configuration, "logging_dir", None)

    @property
    def save_iteration(self) -> int:
        """The number of the next automatically named checkpoint."""
        return int(self.project_configuration.iteration)

    # ---------------------------------------------------------------------------------------
    # Gradient accumulation state

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.sync_gradients = bool(value)

    @property
    def gradient_accumulation_steps(self) -> int:
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
        """The user's own module (without DDP; without autocast if keep_fp32_wrapper=False)."""
        inner = self._strategy.unwrap_model(model)
        if not keep_torch_compile:
            inner = getattr(inner, "_orig_mod", inner)
        if not keep_fp32_wrapper:
            precision.unwrap_forward(getattr(inner, "_orig_mod", inner))
        return inner

    # ---------------------------------------------------------------------------------------
    # Training step

