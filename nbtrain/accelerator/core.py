"""The Accelerator: Hugging Face Accelerate's training API, inside nbtrain's ranks.

A thin front end. Each concern lives in its own module and is only delegated to from here:
``rankenv`` (where this rank sits), ``devices``, ``parallel`` (process group, DDP, strategy per
DistributedType), ``collectives``, ``precision``, ``accumulation``, ``optim``, ``data``,
``checkpoint``, ``splitting``, ``compat`` (Accelerate's state view, project configuration and
the arguments nbtrain has no feature for); live progress and metrics go to ``reporting``.

Collective calls (every rank must make them, in the same order): prepare() of a model or a
dataloader, gather, gather_for_metrics, reduce, broadcast, pad_across_processes,
wait_for_everyone, main_process_first, check_trigger, save_state, load_state. A rank calling
one of nbtrain's collectives alone gets an error rather than a hang (see collectives.py).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import gc
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils.data import DataLoader

from nbtrain.accelerator import (
    batches,
    checkpoint,
    collectives,
    compat,
    data,
    devices,
    fsdp_setup,
    handlers,
    join,
    loaderconfig,
    loaders,
    nested,
    parallel,
    precision,
)
from nbtrain.accelerator.accumulation import GradientAccumulationPlugin, GradientState, check_steps
from nbtrain.accelerator.collectives import Op
from nbtrain.accelerator.optim import PreparedOptimizer, PreparedScheduler
from nbtrain.accelerator.parallel import DistributedType
from nbtrain.accelerator.splitting import share
from nbtrain.rank import rankenv
from nbtrain.shared.options import MixedPrecision

# Models any Accelerator of this process prepared: as in Accelerate (whose state is one per
# process), a later Accelerator() works with what an earlier one prepared, e.g. in a later cell
# of warm ranks (kernel/session.py).
_PREPARED_MODELS: weakref.WeakSet[nn.Module] = weakref.WeakSet()

F = TypeVar("F", bound=Callable[..., Any])


class Accelerator:
    """Device placement, distributed training, mixed precision and checkpoints for one rank.

    Accelerate's constructor arguments are accepted. Implemented: those below up to
    ``kwargs_handlers`` (``dataloader_config``: split_batches, even_batches, data_seed,
    use_seedable_sampler, dispatch_batches), ``project_dir`` / ``project_config`` (automatic
    checkpoint naming). Accepted with a one-time warning saying what nbtrain does instead:
    ``log_with`` (no trackers: ``log()`` feeds the live view), ``rng_types``,
    ``dynamo_backend`` / ``dynamo_plugin``; ``fsdp_plugin`` (FSDP2, see
    accelerator/fsdp_plugin.py; also turned on by ACCELERATE_USE_FSDP=true, as
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
                "log_with": log_with,
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
        self._trigger = 0  # set_trigger() / check_trigger()

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
    def state(self) -> compat.State:
        """Accelerate's ``accelerator.state``: num_processes, device, distributed_type, ...;
        printing it gives the same summary."""
        view = self.__dict__.get("_state_view")
        if view is None:  # one view, so values a script assigns to it stay
            view = self.__dict__["_state_view"] = compat.State(self)
        return view

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
        _PREPARED_MODELS.add(wrapped)
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
        xla = self.distributed_type is DistributedType.XLA  # ordinals share the user's objects
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
        self._dataloaders.append(prepared)
        return prepared

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

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` divided by the accumulation steps and scaled for fp16."""
        if not self._models and not self._optimizers and not _PREPARED_MODELS:
            raise RuntimeError(
                "accelerator.backward() was called before accelerator.prepare(): prepare the "
                "model and optimizer first (model, optimizer, loader = accelerator.prepare(model, "
                "optimizer, loader)), so gradients are synchronised across ranks and scaled for "
                "mixed precision."
            )
        if self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        scaler = self._precision.scaler
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    @contextlib.contextmanager
    def accumulate(self, *models: nn.Module) -> Iterator[None]:
        """One micro-step: gradients sync (and optimizers step) only on the last of each
        ``gradient_accumulation_steps``, and on the last batch of the dataloader."""
        sync = self.gradient_state.begin_micro_step() or self.gradient_state.sync_each_batch
        with contextlib.ExitStack() as stack:
            if not sync:
                for model in models:
                    stack.enter_context(self._strategy.no_sync(model))
            yield

    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Train DDP models over ranks with different numbers of batches: ranks that finish
        early shadow DDP's collectives until all are done (torch's Join). ``even_batches``
        overrides the prepared map-style loaders' setting inside the block (see join.py)."""
        return join.join_uneven_inputs(
            joinables,
            distributed_type=self.state.distributed_type,
            world_size=self.num_processes,
            loaders=list(self._dataloaders),
            default_even_batches=self.even_batches,
            even_batches=even_batches,
        )

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Skip the gradient all-reduce for forward/backward passes inside the block."""
        with self._strategy.no_sync(model):
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        """Make the next backward inside the block all-reduce the gradients, although the
        forward ran under ``no_sync`` (several forwards, one synchronising backward)."""
        trigger = getattr(self._strategy, "trigger_sync", None)
        with trigger(model) if trigger is not None else contextlib.nullcontext():
            yield

    def set_trigger(self) -> None:
        """Raise this rank's flag; ``check_trigger()`` on every rank then returns True (e.g. to
        stop training everywhere when one rank decides to)."""
        self._trigger = 1

    def check_trigger(self) -> bool:
        """True on every rank when any rank called ``set_trigger()`` since the last True (the
        flags are then lowered). A collective: every rank must call it."""
        raised = self.reduce(torch.tensor([self._trigger], device=self._device), "sum")
        if int(raised.item()) >= 1:
            self._trigger = 0
            return True
        return False

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager[Any]:
        return self._precision.autocast(autocast_handler)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Undo the fp16 loss scale on the gradients (once per step; clipping does it for you)."""
        chosen: list[Any] | tuple[Any, ...]
        if optimizer is None:
            chosen = self._optimizers
        else:
            chosen = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        for item in chosen:
            if isinstance(item, PreparedOptimizer):
                item.unscale_gradients()

    def clip_grad_norm_(
        self,
        parameters: Iterable[torch.Tensor] | torch.Tensor,
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Clip the full gradient: only when gradients are synchronised (acc #641).

        On a non-final accumulation micro-step the partial gradients are left alone (clipping
        them, or unscaling them for fp16, would be wrong) and their current norm is returned.
        Intentional difference: Accelerate 1.15 clips on every call (the partial gradients; and
        under fp16 its second unscale raises), so its docs wrap the call in
        ``if accelerator.sync_gradients:``, which gives the same result here."""
        params = _parameter_list(parameters)
        if not self.sync_gradients:
            return self._gradient_norm(params, norm_type)
        self.unscale_gradients()
        self._average_gradients(params)
        clip = getattr(self._strategy, "clip_grad_norm", None)  # FSDP: the norm over all shards
        if clip is not None:
            return clip(params, max_norm, norm_type)
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)

    def clip_grad_value_(
        self, parameters: Iterable[torch.Tensor] | torch.Tensor, clip_value: float
    ) -> None:
        """Clamp gradients to [-clip_value, clip_value], when gradients are synchronised (not
        on non-final accumulation micro-steps, unlike Accelerate 1.15: see clip_grad_norm_)."""
        if not self.sync_gradients:
            return
        self.unscale_gradients()
        params = _parameter_list(parameters)
        self._average_gradients(params)
        torch.nn.utils.clip_grad_value_(params, clip_value)

    def _average_gradients(self, params: list[torch.Tensor]) -> None:
        """Clipping acts on the gradient every rank steps with: DDP has averaged it in backward,
        but XLA averages at the optimizer step, so its strategy averages these ones first."""
        average = getattr(self._strategy, "reduce_gradients", None)
        if average is not None:
            average(params)

    def _gradient_norm(self, params: list[torch.Tensor], norm_type: float) -> torch.Tensor:
        grads = [p.grad.detach() for p in params if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self._device)
        norms = torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads])
        norm = torch.linalg.vector_norm(norms, norm_type)
        scaler = self._precision.scaler
        return norm / scaler.get_scale() if scaler is not None else norm

    # ---------------------------------------------------------------------------------------
    # Collectives

    def gather(self, tensor: Any) -> Any:
        """Every rank's tensors concatenated along dim 0 (nested lists/tuples/dicts too)."""
        return self._collectives.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Like gather(), minus the samples repeated to even out the last batch, so a metric
        over a prepared dataloader sees exactly ``len(dataset)`` samples.

        Non-tensor data (e.g. lists of strings), or any data with ``use_gather_object=True``,
        is gathered as objects, as Accelerate does: one flat list of every rank's items (a
        tensor's rows), from which the duplicates are dropped alike."""
        leaves = nested.leaves(input_data)
        as_objects = use_gather_object or not all(isinstance(x, torch.Tensor) for x in leaves)
        if as_objects:
            gathered = self._collectives.gather_object(input_data)
        else:
            gathered = self._collectives.gather(input_data)
        state = self.gradient_state
        if state.end_of_dataloader and state.remainder > 0:
            return collectives.truncate_for_metrics(gathered, state.remainder, as_objects)
        return gathered

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum ("sum"), average ("mean"), "max" or "min" over the ranks, then multiply by
        ``scale`` (on every device; Accelerate applies ``scale`` on XLA only)."""
        return self._collectives.reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        return self._collectives.pad_across_processes(tensor, dim, pad_index, pad_first)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        return self._collectives.broadcast(tensor, from_process)

    def wait_for_everyone(self) -> None:
        """A barrier. Every rank must call it (not only the main process)."""
        self._collectives.barrier(Op.WAIT_FOR_EVERYONE)

    # ---------------------------------------------------------------------------------------
    # Main-process helpers

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print() on the local main process only."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first (e.g. to download or cache), then the others."""
        with self._goes_first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        with self._goes_first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _goes_first(self, first: bool) -> Iterator[None]:
        if not first:
            self._collectives.barrier(Op.MAIN_PROCESS_FIRST)
        yield
        if first:
            self._collectives.barrier(Op.MAIN_PROCESS_FIRST)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This rank's contiguous share of a list, tuple, tensor or dict of them."""
        yield share(inputs, self.num_processes, self.process_index, apply_padding)

    def on_main_process(self, function: F | None = None) -> Any:
        """Decorator: run ``function`` on the main process only (None elsewhere)."""
        return self._on(lambda: self.is_main_process, function, "on_main_process")

    def on_local_main_process(self, function: F | None = None) -> Any:
        return self._on(lambda: self.is_local_main_process, function, "on_local_main_process")

    def on_last_process(self, function: F | None = None) -> Any:
        return self._on(lambda: self.is_last_process, function, "on_last_process")

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        if process_index is None:
            raise TypeError(
                "on_process() needs process_index=, e.g. @accelerator.on_process(process_index=1)."
            )
        return self._on(lambda: self.process_index == process_index, function, "on_process")

    def _on(self, condition: Callable[[], bool], function: Any, name: str) -> Any:
        def decorate(fn: F) -> F:
            if not callable(fn):
                raise TypeError(f"@accelerator.{name} decorates a function; got {fn!r}.")

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                return fn(*args, **kwargs) if condition() else None

            return run  # type: ignore[return-value]

        return decorate if function is None else decorate(function)

    # ---------------------------------------------------------------------------------------
    # Checkpoints and saving

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Also save/load these objects (anything with state_dict() and load_state_dict())."""
        invalid = [
            f"#{index} ({type(obj).__name__})"
            for index, obj in enumerate(objects)
            if not (
                callable(getattr(obj, "state_dict", None))
                and callable(getattr(obj, "load_state_dict", None))
            )
        ]
        if invalid:
            raise TypeError(
                f"register_for_checkpointing() needs objects with state_dict() and "
                f"load_state_dict() methods; these have not: {', '.join(invalid)}."
            )
        self._custom.extend(objects)

    def save_state(
        self,
        output_dir: str | None = None,
        safe_serialization: bool = True,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, grad scaler, registered objects, every rank's RNG
        states and dataloader positions, atomically. Every rank must call it.

        ``output_dir`` may hold other files (a tokenizer, save_model output): they are kept.
        Without ``output_dir``, the project configuration's automatic naming picks
        ``<project_dir>/checkpoints/checkpoint_<n>``. ``save_model_func_kwargs`` (options for
        DeepSpeed's saving in Accelerate) are accepted and unused.

        On XLA saving marks steps (its barriers sync), and every mark moves the device's random
        seed on: a run that saves and continues draws other device random numbers afterwards
        than one that never saved; a run resumed from the checkpoint matches the one that never
        saved."""
        automatic = output_dir is None
        target = self._automatic_checkpoint() if output_dir is None else output_dir
        path = checkpoint.save_state(
            target,
            self._training_state(),
            self._collectives,
            safe_serialization=safe_serialization,
        )
        if automatic:
            config = self.project_configuration
            config.iteration += 1
            if config.total_limit is not None and self.is_main_process:
                checkpoint.prune_automatic(
                    self.project_dir or ".", int(config.total_limit), Path(path)
                )
        return str(path)

    def _automatic_checkpoint(self) -> Path:
        config = self.project_configuration
        if not config.automatic_checkpoint_naming:
            raise ValueError(
                "save_state() needs output_dir=, e.g. accelerator.save_state("
                "'checkpoints/step_100'), or Accelerator(project_config=ProjectConfiguration("
                "project_dir=..., automatic_checkpoint_naming=True)) to name checkpoints itself."
            )
        return checkpoint.automatic_directory(config.project_dir, self.save_iteration)

    def load_state(
        self,
        input_dir: str | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> str:
        """Restore what save_state wrote; prepared dataloaders continue after the last batch the
        checkpoint had seen. Every rank must call it, with the objects prepared as when saving.

        As in Accelerate: ``load_model_func_kwargs`` go to the model loading (e.g.
        ``strict=False``; ``map_location=`` picks the device the weights load to),
        ``load_kwargs`` to the ``torch.load`` of the other states. Without ``input_dir``, the
        newest automatically named checkpoint is loaded."""
        if input_dir is None:
            if not self.project_configuration.automatic_checkpoint_naming:
                raise ValueError(
                    "load_state() needs input_dir=, the directory save_state() wrote (or "
                    "automatic checkpoint naming in the Accelerator's project_config)."
                )
            input_dir = str(checkpoint.latest_automatic(self.project_dir or "."))
        options = dict(load_model_func_kwargs)
        location = options.pop("map_location", None)
        device = self._device if location in (None, "on_device") else torch.device(location)
        source, step = checkpoint.load_state(
            input_dir,
            self._training_state(),
            self._collectives,
            device,
            model_kwargs=options,
            load_kwargs=load_kwargs,
        )
        self.gradient_state.step = step
        return str(source)

    def _training_state(self) -> checkpoint.TrainingState:
        state = checkpoint.TrainingState(
            models=[self.unwrap_model(model) for model in self._models],
            optimizers=list(self._optimizers),
            schedulers=list(self._schedulers),
            dataloaders=list(self._dataloaders),
            custom=list(self._custom),
            scaler=self._precision.scaler,
            accumulation_step=self.gradient_state.step,
        )
        split = getattr(self._strategy, "checkpoint_state", None)  # FSDP: sharded via DCP
        return split(state) if split is not None else state

    def save_model(
        self,
        model: nn.Module,
        save_directory: str,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the model's weights (model.safetensors, or pytorch_model.bin without
        safetensors) from the main process; not a collective. ``max_shard_size`` is accepted for
        compatibility: nbtrain writes a single file. Under FSDP every rank must call it (the
        shards are gathered), as in Accelerate."""
        if fsdp_setup.sharded(self._strategy, model):
            state = self.get_state_dict(model)
            if self.is_main_process:
                fsdp_setup.save_full(state, save_directory, safe_serialization)
            return
        if self.is_main_process:
            checkpoint.save_model(
                self.unwrap_model(model), save_directory, safe_serialization=safe_serialization
            )

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """torch.save (or safetensors) from the main process only; not a collective."""
        if not self.is_main_process:
            return
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(obj, f, metadata={"format": "pt"})
        else:
            torch.save(obj, f)

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's weights. Under FSDP: the whole model gathered to CPU on the main process
        ({} on the others); every rank must call it then."""
        if fsdp_setup.sharded(self._strategy, model):
            return self._strategy.full_state_dict(model)  # type: ignore[attr-defined]
        return (self.unwrap_model(model) if unwrap else model).state_dict()

    def free_memory(self, *objects: Any) -> list[Any]:
        """Forget every prepared object (between two trainings in one process) and free what
        they held; returns a None for each object given, to rebind your names to:
        ``model, optimizer = accelerator.free_memory(model, optimizer)``."""
        self._models, self._optimizers, self._schedulers, self._dataloaders = [], [], [], []
        forget = getattr(self._strategy, "forget", None)  # XLA: its hooks on the parameters
        if forget is not None:
            forget()
        self.gradient_state.step = 0
        released = [None for _ in objects]
        del objects
        gc.collect()
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
        return released

    def clear(self, *objects: Any) -> list[Any]:
        """Accelerate's alias of free_memory()."""
        return self.free_memory(*objects)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """Start the next pass of ``dataloader`` at batch ``num_batches``.

        Rarely needed: after load_state a prepared dataloader already continues where the
        checkpoint stopped. For a prepared dataloader the position is absolute, so code written
        for Accelerate that calls both does not skip twice."""
        if isinstance(dataloader, data.PreparedDataLoader):
            return dataloader.skip_first_batches(num_batches)
        return batches.SkippedLoader(dataloader, num_batches)

    # ---------------------------------------------------------------------------------------
    # Live view (kernel side), delegated to nbtrain.rank.reporting

    def progress(
        self, iterable: Iterable[Any], total: int | None = None, desc: str | None = None
    ) -> Any:
        from nbtrain.rank.reporting import progress

        return progress(iterable, total=total, desc=desc)

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: Any = None) -> None:
        """Metrics of this rank to the live view (``log_kwargs``, options for Accelerate's
        experiment trackers, has nothing to configure here)."""
        from nbtrain.rank.reporting import log

        log(values, step=step)

    # Experiment trackers: nbtrain has none (metrics go to the live view through log()), which is
    # what Accelerate does without log_with=: init_trackers makes none, end_training ends none.

    @property
    def trackers(self) -> list[Any]:
        return []

    def init_trackers(
        self, project_name: str, config: dict[str, Any] | None = None, init_kwargs: Any = None
    ) -> None:
        """Kept for scripts written for Accelerate: there are no trackers to start."""

    def end_training(self) -> None:
        """End of training, as in Accelerate: releases the process group this Accelerator made."""
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


def _parameter_list(parameters: Iterable[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    return list(parameters)


__all__ = [
    "Accelerator",
    "DistributedType",
    "GradientAccumulationPlugin",
    "MixedPrecision",
]
