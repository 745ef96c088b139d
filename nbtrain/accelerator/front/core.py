"""The Accelerator: Hugging Face Accelerate's training API, inside nbtrain's ranks.

A thin front end, assembled from parts: ``front_base`` (state and where this rank sits),
``front_training`` (backward, accumulation, clipping), ``front_processes`` (calls across ranks),
``front_state`` (checkpoints, saved models); this module holds construction and ``prepare``.
Each concern lives in its own module and is only delegated to from there:
``rankenv`` (where this rank sits), ``devices``, ``parallel`` (process group, DDP, strategy per
DistributedType), ``collectives``, ``precision``, ``accumulation``, ``optim``, ``data``,
``checkpoint``, ``splitting``, ``compat`` (Accelerate's state view, project configuration and
the arguments nbtrain has no feature for), ``tracking`` (experiment trackers); live progress and
metrics go to ``reporting``.

Collective calls (every rank must make them, in the same order): prepare() of a model or a
dataloader, gather, gather_for_metrics, reduce, broadcast, pad_across_processes,
wait_for_everyone, main_process_first, check_trigger, save_state, load_state. A rank calling
one of nbtrain's collectives alone gets an error rather than a hang (see collectives.py).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils.data import DataLoader

from nbtrain.accelerator import tracking
from nbtrain.accelerator.checkpoint import stopping
from nbtrain.accelerator.comm import collectives
from nbtrain.accelerator.data import loaderconfig, loaders
from nbtrain.accelerator.data import prepared as data
from nbtrain.accelerator.devices import choice as devices
from nbtrain.accelerator.front import compat, handlers
from nbtrain.accelerator.front.base import PREPARED_MODELS
from nbtrain.accelerator.front.processes import ProcessMethods
from nbtrain.accelerator.front.state import StateMethods
from nbtrain.accelerator.front.training import TrainingStep
from nbtrain.accelerator.fsdp import setup as fsdp_setup
from nbtrain.accelerator.training import join, parallel, precision
from nbtrain.accelerator.training.accumulation import (
    GradientAccumulationPlugin,
    GradientState,
    check_steps,
)
from nbtrain.accelerator.training.optim import PreparedOptimizer, PreparedScheduler
from nbtrain.accelerator.training.parallel import DistributedType
from nbtrain.rank import rankenv
from nbtrain.shared.options import MixedPrecision

F = TypeVar("F", bound=Callable[..., Any])


class Accelerator(StateMethods, ProcessMethods, TrainingStep):
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
        compat.check_unsupported(
            {
                "rng_types": rng_types,
                "dynamo_backend": dynamo_backend,
                "dynamo_plugin": dynamo_plugin,
                "deepspeed_plugin": deepspeed_plugin,
                "deepspeed_plugins": deepspeed_plugins,
                "megatron_lm_plugin": megatron_lm_plugin,
                "torch_tp_plugin": torch_tp_plugin,
                "parallelism_config": parallelism_config,
            }
        )
        for name, value in (
            ("cpu", cpu),
            ("device_placement", device_placement),
            ("split_batches", split_batches),
            ("even_batches", even_batches),
            ("step_scheduler_with_optimizer", step_scheduler_with_optimizer),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"Accelerator({name}={value!r}) must be True or False.")
        options = handlers.collect(kwargs_handlers)
        self.gradient_state = _gradient_state(
            gradient_accumulation_steps, gradient_accumulation_plugin
        )
        self._split_arg, self._even_arg = split_batches, even_batches
        self.dataloader_config = loaderconfig.make(dataloader_config, split_batches, even_batches)
        self.project_configuration = compat.project_configuration(project_dir, project_config)
        self._tracking = tracking.Tracking(log_with, self.logging_dir)
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
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
        self._strategy = _strategy_for(
            self._device, self._placement.world_size, options, self.fsdp_plugin
        )
        self._collectives = self._strategy.collectives
        fsdp_setup.announce(self._strategy)
        self._models: list[nn.Module] = []
        self._optimizers: list[PreparedOptimizer] = []
        self._schedulers: list[PreparedScheduler] = []
        self._dataloaders: list[data.PreparedDataLoader] = []
        self._custom: list[Any] = []
        self._stops = stopping.for_this_run()  # checkpoint on interrupt, periodic, resume
        self._trigger = 0  # set_trigger() / check_trigger()

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
        overrides the prepared map-style loaders' setting inside the block (see join.py)."""
        return join.join_uneven_inputs(
            joinables,
            # Accelerate's state view: a script may set its distributed_type (its tests do).
            distributed_type=self.state.distributed_type,
            world_size=self.num_processes,
            loaders=list(self._dataloaders),
            default_even_batches=self.even_batches,
            even_batches=even_batches,
        )

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, dataloaders and LR schedulers, in any order; they come
        back in the same order (a single object when one is given)."""
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
        self._stops.after_prepare(self)  # resume=True loads once everything is prepared
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
        ``evaluation_mode``, for a model that is only evaluated) wrap it in DDP."""
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
        follow the same sharding as without dispatching."""
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
            prepared.stop_point = functools.partial(self._stops.point, self)
            self._stops.arm()
        self._dataloaders.append(prepared)
        return prepared

    def progress(
        self, iterable: Iterable[Any], total: int | None = None, desc: str | None = None
    ) -> Any:
        from nbtrain.rank.reporting import progress

        return progress(iterable, total=total, desc=desc)

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: Any = None) -> None:
        """Metrics of this rank to the live view, and (main process) to the run's trackers at
        ``step``, by default the run's optimizer step. ``log_kwargs``: per tracker name, options
        for its log call, e.g. ``{"wandb": {"commit": False}}``."""
        from nbtrain.rank.reporting import log

        main = self.is_main_process
        self._tracking.log(values, step, log_kwargs, main=main)
        if self._tracking.chosen:  # text and nested values are for the trackers only
            values = {k: v for k, v in values.items() if not isinstance(v, (str, dict))}
        log(values, step=step)

    # Experiment trackers (accelerator/tracking/): the run belongs to the process, so a warm
    # rank's later Accelerators log into the run an earlier cell started.

    @property
    def trackers(self) -> list[Any]:
        return self._tracking.trackers(self.is_main_process)

    def init_trackers(
        self, project_name: str, config: dict[str, Any] | None = None, init_kwargs: Any = None
    ) -> None:
        """Start the run of every tracker of ``log_with`` on the main process (``config``: the
        run's hyperparameters; ``init_kwargs``: per tracker name, arguments for its library).
        A launch with ``resume=True`` continues the run its checkpoint belongs to."""
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


def _strategy_for(
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


def _gradient_state(steps: object, plugin: Any) -> GradientState:
    if plugin is None:
        return GradientState(num_steps=check_steps(steps))
    if steps != 1:
        raise ValueError(
            "Pass either gradient_accumulation_steps= or gradient_accumulation_plugin=, not both "
            f"(got gradient_accumulation_steps={steps!r} and a plugin)."
        )
    return GradientState.from_plugin(plugin)


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

__all__ = [
    "Accelerator",
    "DistributedType",
    "GradientAccumulationPlugin",
    "MixedPrecision",
]
