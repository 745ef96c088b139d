"""The Accelerator: Hugging Face Accelerate's training API, inside nbtrain's ranks.

A thin front end, assembled from parts (front/): ``base`` (state and where this rank sits),
``prepare`` (what prepare() makes of each object), ``training`` (backward, accumulation,
clipping), ``processes`` (calls across ranks), ``state`` (checkpoints, saved models); this module
holds construction (its arguments are checked in ``setup``), trackers and logging.
Each concern lives in its own sub-package of nbtrain.accelerator and is only delegated to from
here: ``rankenv`` (where this rank sits), ``devices/`` (which device, XLA), ``training/``
(process group, DDP, strategy per DistributedType, precision, accumulation, optimizer),
``comm/`` (collectives), ``data/``, ``checkpoint/``, ``fsdp/``, ``compat`` (Accelerate's state
view, project configuration and the arguments nbtrain has no feature for), ``tracking/``
(experiment trackers); live progress and metrics go to ``reporting``.

Collective calls (every rank must make them, in the same order): prepare() of a model or a
dataloader, gather, gather_for_metrics, reduce, broadcast, pad_across_processes,
wait_for_everyone, main_process_first, check_trigger, save_state, load_state. A rank calling
one of nbtrain's collectives alone gets an error rather than a hang (see comm/collectives.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from torch import nn

from nbtrain.accelerator.checkpoint import stopping
from nbtrain.accelerator.data import loaderconfig
from nbtrain.accelerator.data import prepared as data
from nbtrain.accelerator.devices import choice as devices
from nbtrain.accelerator.front import compat, handlers, setup
from nbtrain.accelerator.front.prepare import PrepareMethods
from nbtrain.accelerator.front.processes import ProcessMethods
from nbtrain.accelerator.front.state import StateMethods
from nbtrain.accelerator.front.training import TrainingStep
from nbtrain.accelerator.fsdp import setup as fsdp_setup
from nbtrain.accelerator.tracking.front import Tracking
from nbtrain.accelerator.training import join, precision
from nbtrain.accelerator.training.accumulation import (
    GradientAccumulationPlugin,
)
from nbtrain.accelerator.training.optim import PreparedOptimizer, PreparedScheduler
from nbtrain.accelerator.training.parallel import DistributedType
from nbtrain.rank import rankenv
from nbtrain.shared.options import MixedPrecision

F = TypeVar("F", bound=Callable[..., Any])


class Accelerator(PrepareMethods, StateMethods, ProcessMethods, TrainingStep):
    """Device placement, distributed training, mixed precision and checkpoints for one rank.

    Accelerate's constructor arguments are accepted. Implemented: those below up to
    ``kwargs_handlers`` (``dataloader_config``: split_batches, even_batches, data_seed,
    use_seedable_sampler, dispatch_batches), ``project_dir`` / ``project_config`` (automatic
    checkpoint naming), ``log_with`` (experiment trackers, accelerator/tracking/: one run per
    launch on the main process, continued on resume). Accepted with a one-time warning saying
    what nbtrain does instead: ``rng_types``,
    ``dynamo_backend`` / ``dynamo_plugin``; ``fsdp_plugin`` (FSDP2, see
    accelerator/fsdp/plugin.py; also turned on by ACCELERATE_USE_FSDP=true, as
    ``accelerate launch --use_fsdp`` sets it). Refused: DeepSpeed, Megatron-LM and
    tensor-parallel plugins.

    Intentional differences from Accelerate 1.15, each for a reason:

    - ``clip_grad_norm_`` / ``clip_grad_value_`` on a non-final accumulation micro-step leave the
      partial gradients alone (Accelerate clips them, and raises under fp16, acc #641);
    - ``reduce(scale=)`` scales on every device (Accelerate applies it on XLA only);
    - ``GradientAccumulationPlugin(adjust_scheduler=)`` has no effect: schedulers step only on
      synchronised steps either way (Accelerate only bumps a counter torch uses for warnings);
    - prepared dataloaders resume by themselves after ``load_state`` (``skip_first_batches``
      still works and does not skip twice).

    :param mixed_precision: ``'no'``, ``'fp16'`` or ``'bf16'`` (default: the launch's
        ``mixed_precision``, else ``'no'``).
    :param gradient_accumulation_steps: micro-steps per optimizer step (default 1).
    :param cpu: train on the CPU even where a GPU is visible.
    :param device_placement: ``prepare`` moves models and batches to ``device`` (default True).
    :param split_batches: see the property of that name.
    :param even_batches: see the property of that name.
    :param gradient_accumulation_plugin: a ``GradientAccumulationPlugin`` (instead of
        ``gradient_accumulation_steps``).
    :param dataloader_config: a ``DataLoaderConfiguration``.
    :param step_scheduler_with_optimizer: a prepared scheduler steps with its optimizer (default
        True), as in Accelerate.
    :param kwargs_handlers: ``DistributedDataParallelKwargs``, ``GradScalerKwargs``,
        ``InitProcessGroupKwargs``, ``AutocastKwargs``.
    :param project_dir: the project folder (automatic checkpoint names, trackers' files).
    :param project_config: a ``ProjectConfiguration``.
    :param log_with: tracker names (``"tensorboard"``, ``"mlflow"``, ``"wandb"``, ``"trackio"``,
        ``"aim"``, ``"comet_ml"``, ``"all"``) or ``GeneralTracker`` instances.
    :param fsdp_plugin: a ``FullyShardedDataParallelPlugin``: FSDP2 instead of DDP.
    :param deepspeed_plugin: refused, as are ``deepspeed_plugins``, ``megatron_lm_plugin``,
        ``torch_tp_plugin`` and ``parallelism_config`` (training without them would not be the run
        asked for).
    :raises ValueError: a bad value or a refused plugin (the message names it and the fix), e.g.
        ``mixed_precision='fp8'``.
    :raises TypeError: a value of the wrong type.
    """

    def __init__(
        self,
        *,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        device_placement: bool = True,
        split_batches: bool = False,
        even_batches: bool = True,
        gradient_accumulation_plugin: Any = None,
        dataloader_config: Any = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[Any] | None = None,
        project_dir: str | None = None,
        project_config: Any = None,
        log_with: Any = None,
        rng_types: Any = None,
        dynamo_backend: Any = None,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        deepspeed_plugins: Any = None,
        fsdp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        torch_tp_plugin: Any = None,
        parallelism_config: Any = None,
    ) -> None:
        options = setup.check_arguments(locals())  # (every argument, by name)
        self.gradient_state = setup.gradient_state(
            gradient_accumulation_steps, gradient_accumulation_plugin
        )
        self._split_arg, self._even_arg = split_batches, even_batches
        self.dataloader_config = loaderconfig.make(dataloader_config, split_batches, even_batches)
        self.project_configuration = compat.project_configuration(project_dir, project_config)
        self._tracking = Tracking(log_with, self.logging_dir)
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self._set_up_device(cpu, mixed_precision, options, fsdp_plugin)
        self._models: list[nn.Module] = []
        self._optimizers: list[PreparedOptimizer] = []
        self._schedulers: list[PreparedScheduler] = []
        self._dataloaders: list[data.PreparedDataLoader] = []
        self._custom: list[Any] = []
        self._stops = stopping.for_this_run()  # checkpoint on interrupt, periodic, resume
        self._trigger = 0  # set_trigger() / check_trigger()

    def _set_up_device(
        self, cpu: bool, mixed_precision: str | None, options: handlers.Options, fsdp_plugin: Any
    ) -> None:
        """The device, precision and strategy (with its process group) of this rank."""
        self._placement = rankenv.placement()
        self._device = devices.choose_device(
            devices.detect(),
            cpu=cpu or rankenv.force_cpu(),
            local_rank=self._placement.local_rank,
            world_size=self._placement.world_size,
        )
        # Precision is checked before any process group exists: a bad choice fails fast.
        default, source = rankenv.default_mixed_precision()
        mode = precision.resolve(mixed_precision, default, source)
        self._precision = precision.Precision(mode, self._device, options.scaler, options.autocast)
        self._ddp_kwargs = options.ddp
        self.fsdp_plugin = fsdp_setup.plugin_for(fsdp_plugin, self._device)
        self._strategy = setup.strategy_for(
            self._device, self._placement.world_size, options, self.fsdp_plugin
        )
        self._collectives = self._strategy.collectives
        fsdp_setup.announce(self._strategy)

    @property
    def state(self) -> compat.State:
        """Accelerate's ``accelerator.state``: num_processes, device, distributed_type, ...;
        printing it gives the same summary."""
        view = self.__dict__.get("_state_view")
        if view is None:  # one view, so values a script assigns to it stay
            view = self.__dict__["_state_view"] = compat.State(self)
        return view

    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Train DDP models over ranks with different numbers of batches: ranks that finish
        early shadow DDP's collectives until all are done (torch's Join). ``even_batches``
        overrides the prepared map-style loaders' setting inside the block (see join.py).

        :param joinables: the prepared DDP models (torch ``Joinable`` objects) that train inside the
            block.
        :param even_batches: see above (None: leave the loaders' setting).
        """
        return join.join_uneven_inputs(
            joinables,
            # Accelerate's state view: a script may set its distributed_type (its tests do).
            distributed_type=self.state.distributed_type,
            world_size=self.num_processes,
            loaders=list(self._dataloaders),
            default_even_batches=self.even_batches,
            even_batches=even_batches,
        )

    def progress(
        self, iterable: Iterable[Any], total: int | None = None, desc: str | None = None
    ) -> Any:
        """``nbtrain.progress`` as a method: yield the items of ``iterable`` while this rank's bar
        in the live view advances (a text bar on stderr outside a launch).

        :param iterable: what the loop goes through, e.g. a prepared DataLoader.
        :param total: its length, by default ``len(iterable)`` when it has one.
        :param desc: the loop's name on the bar, e.g. ``"epoch 0"``.
        :raises TypeError: ``desc`` is not a string or None.
        """
        from nbtrain.rank.reporting import progress

        return progress(iterable, total=total, desc=desc)

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: Any = None) -> None:
        """Metrics of this rank to the live view, and (main process) to the run's trackers at
        ``step``, by default the run's optimizer step. ``log_kwargs``: per tracker name, options
        for its log call, e.g. ``{"wandb": {"commit": False}}``.

        :param values: metric names and numbers (one-element tensors too); text and nested values go
            to the trackers only.
        """
        from nbtrain.rank.reporting import log

        main = self.is_main_process
        self._tracking.log(values, step, log_kwargs, main=main)
        if self._tracking.chosen:  # text and nested values are for the trackers only
            values = {k: v for k, v in values.items() if not isinstance(v, (str, dict))}
            if not self._tracking.shown_outside_a_launch():
                return  # the trackers record them: no "step N: ..." line the user did not ask for
        log(values, step=step)

    # Experiment trackers (accelerator/tracking/): the run belongs to the process, so a warm
    # rank's later Accelerators log into the run an earlier cell started.

    @property
    def trackers(self) -> list[Any]:
        """The trackers of this run (``log_with``), after ``init_trackers``; empty on processes
        other than the main one."""
        return self._tracking.trackers(self.is_main_process)

    def init_trackers(
        self,
        project_name: str | None,
        config: dict[str, Any] | None = None,
        init_kwargs: Any = None,
    ) -> None:
        """Start the run of every tracker of ``log_with`` on the main process (``config``: the
        run's hyperparameters; ``init_kwargs``: per tracker name, arguments for its library).
        A launch with ``resume=True`` continues the run its checkpoint belongs to.

        :param project_name: the project (or experiment) the run belongs to, in each tracker's
            terms.
        """
        self._tracking.init(
            project_name, config, init_kwargs, main=self.is_main_process, stops=self._stops
        )

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (``unwrap``: the library's own object, e.g. the W&B
        run); processes other than the main one get a tracker that does nothing."""
        return self._tracking.get(name, unwrap, main=self.is_main_process)

    def end_training(self) -> None:
        """End of training, as in Accelerate: finishes the tracker run and releases the process
        group this Accelerator made."""
        self._tracking.end()
        self._strategy.close()

    def __repr__(self) -> str:
        return (
            f"Accelerator(distributed_type={self.distributed_type.value}, device={self.device}, "
            f"process {self.process_index}/{self.num_processes}, "
            f"mixed_precision={self.mixed_precision!r})"
        )


__all__ = [
    "Accelerator",
    "DistributedType",
    "GradientAccumulationPlugin",
    "MixedPrecision",
]
