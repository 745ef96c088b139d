"""Fully sharded data parallelism with torch's FSDP2: the strategy behind
``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))``.

It implements parallel.py's ``Strategy`` protocol, plus the hooks the Accelerator looks for:
``prepare_optimizer`` (the user's optimizer, made before prepare over the full parameters, is
pointed at the sharded ones), ``trigger_sync``, ``clip_grad_norm`` (the global norm over every
rank's shards), ``full_state_dict`` and ``checkpoint_state`` (save_state/load_state through
torch.distributed.checkpoint, see fsdp/checkpoint.py).

Sharding (``wrap_model``): the layers the wrap policy picks get ``fully_shard`` first, innermost
first, then the root, so each layer's full weights exist only while it runs. ``fully_shard``
changes the module in place (its class and its parameters, now DTensor shards): the prepared
model *is* the user's module, which is what ``unwrap_model`` returns.

With one rank there is nothing to shard across: the model stays whole, and checkpoints are still
written in FSDP's layout (so a 2-rank sharded checkpoint loads into a 1-rank run).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from nbtrain.accelerator.comm.backends import LocalBackend, ProcessGroupBackend
from nbtrain.accelerator.comm.collectives import Collectives, Op
from nbtrain.accelerator.fsdp.plugin import Settings
from nbtrain.accelerator.training.parallel import DistributedType, ensure_process_group

STRATEGY_NAME = "fsdp2"
MMAP_THRESHOLD = 4 << 20  # bytes; see return_large_buffers_to_the_system()


class FsdpStrategy:
    distributed_type = DistributedType.FSDP
    name = STRATEGY_NAME

    def __init__(
        self,
        device: torch.device,
        world_size: int,
        settings: Settings,
        *,
        backend: str,
        timeout: float,
    ) -> None:
        self.device = device
        self.settings = settings
        self._owns_group = False
        self._mesh: Any = None
        if world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            self._owns_group = ensure_process_group(backend, timeout)
            self.collectives = Collectives(ProcessGroupBackend(), device, timeout)
            self._mesh = init_device_mesh(device.type, (world_size,))
            if device.type == "cpu":
                return_large_buffers_to_the_system()
        else:
            self.collectives = Collectives(LocalBackend(), device, timeout)
        # id(full parameter) -> (a weak reference to it, its shard): for prepare_optimizer.
        self._replaced: dict[int, tuple[weakref.ref[nn.Parameter], nn.Parameter]] = {}
        self.models: list[nn.Module] = []

    @property
    def sharding(self) -> bool:
        """Whether models are sharded (several ranks), not kept whole (one rank)."""
        return self._mesh is not None

    # -- Strategy protocol ----------------------------------------------------------------

    def wrap_model(self, model: nn.Module, ddp_kwargs: dict[str, Any]) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule) or not any(p.requires_grad for p in model.parameters()):
            return model  # already sharded, or nothing to train (e.g. a frozen teacher)
        self.models.append(model)
        if self._mesh is None:
            return model
        full = self._rank0_weights(model)
        before = {name: weakref.ref(p) for name, p in model.named_parameters()}
        for module in _layers_to_shard(model, self.settings):
            if self.settings.activation_checkpointing:
                from torch.distributed._composable import checkpoint

                checkpoint(module)  # recompute this layer's activations in backward
            self._shard(module)
        self._shard(model)
        if full is not None:
            self._broadcast_weights(model, full)
        for name, shard in model.named_parameters():
            old = before.get(name)
            if old is not None and old() is not None:
                self._replaced[id(old())] = (old, shard)
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model  # fully_shard changed the user's module in place

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return _gradient_sync(model, False)

    def trigger_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return _gradient_sync(model, True)

    def close(self) -> None:
        import torch.distributed as dist

        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    def forget(self) -> None:
        self._replaced.clear()
        self.models.clear()

    # -- hooks the Accelerator looks for ----------------------------------------------------

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point the optimizer at the shards of the parameters it was made with (Accelerate
        does the same): the full parameters are then freed."""
        swapped = False
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                entry = self._replaced.get(id(param))
                if entry is not None and entry[0]() is param:
                    swapped = True
                    if param in optimizer.state:
                        raise ValueError(
                            "prepare(): the optimizer already has state (it stepped) for "
                            "parameters that FSDP has now sharded. Create the optimizer fresh, "
                            "prepare it, then restore its state with accelerator.load_state()."
                        )
                    params.append(entry[1])
                else:
                    params.append(param)
            group["params"] = params
        if swapped:
            self._replaced = {k: v for k, v in self._replaced.items() if v[0]() is not None}

    def clip_grad_norm(
        self, params: list[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        """torch's clip over DTensor gradients: the norm is reduced over every rank's shards."""
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The whole model's weights on CPU on the main process ({} on the others). Every rank
        must call it: the shards are gathered."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        self.collectives.barrier(Op.GET_STATE_DICT)
        if self._mesh is None:
            return {k: v.detach().cpu() for k, v in model.state_dict().items()}
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)

    def checkpoint_state(self, state: Any) -> Any:
        """save_state/load_state: the FSDP models and their optimizers go through
        torch.distributed.checkpoint; everything else stays with checkpoint/state.py."""
        from nbtrain.accelerator.fsdp.checkpoint import split_training_state

        return split_training_state(
            state,
            self.models,
            sharded_state_dict=self.settings.sharded_state_dict,
            sharding=self.sharding,
            rank=self.collectives.rank,
        )

    # -- sharding ---------------------------------------------------------------------------

    def _shard(self, module: nn.Module) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        fully_shard(
            module,
            mesh=self._mesh,
            reshard_after_forward=self.settings.reshard_after_forward,
            mp_policy=self.settings.mp_policy or MixedPrecisionPolicy(),
        )

    def _rank0_weights(self, model: nn.Module) -> dict[str, Any] | None:
        """cpu_ram_efficient_loading: rank 0's weights (the other ranks may hold meta tensors),
        kept until they are broadcast into the shards."""
        if not self.settings.cpu_ram_efficient_loading:
            return None
        if self.collectives.rank != 0:
            return {}
        state = model.state_dict()
        if any(t.is_meta for t in state.values()):
            raise ValueError(
                "cpu_ram_efficient_loading=True: rank 0's model has weights on the meta device; "
                "rank 0 must build (or load) the real weights, the other ranks may use meta."
            )
        return state

    def _broadcast_weights(self, model: nn.Module, full: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if any(p.is_meta for p in model.parameters()) or any(b.is_meta for b in model.buffers()):
            model.to_empty(device=self.device)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, full, options=options)


def return_large_buffers_to_the_system() -> bool:
    """Make glibc give freed blocks of MMAP_THRESHOLD bytes or more back to the system.

    FSDP on CPU allocates and frees a layer's full-size all-gather and reduce-scatter buffers at
    every step. glibc's default threshold rises to the size of each large block freed (up to
    32 MiB), so from the first step on such buffers come from the heap, which fragments and
    keeps them: measured here, a 50M-parameter model's FSDP ranks then hold *more* memory than
    DDP's, all of it freed buffers (benchmarks/fsdp.py). A fixed threshold (which also turns
    the dynamic one off) keeps sharding's saving. Process-wide, so only in ranks with a process
    group of their own; a no-op off glibc. True if applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # (musl and others: no mallopt)
    m_mmap_threshold = -3
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD))


@contextlib.contextmanager
def _gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """FSDP2's switch: without sync, backward keeps the unsharded gradients and skips the
    reduce-scatter; the next synchronised backward reduce-scatters their sum."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model.set_requires_gradient_sync(enabled)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _layers_to_shard(model: nn.Module, settings: Settings) -> list[nn.Module]:
    """The modules the wrap policy picks (never the root), children before their parents."""
    if settings.wrap == "no_wrap":
        return []
    names: set[str] = set()
    if settings.wrap == "transformer_based_wrap":
        names = set(settings.layer_classes or getattr(model, "_no_split_modules", None) or ())
        if not names:
            raise ValueError(
                "auto_wrap_policy='transformer_based_wrap' needs the layer classes to shard: "
                "FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=['MyBlock']) (or a "
                "model with _no_split_modules, as Hugging Face models have)."
            )
        found = {type(m).__name__ for m in model.modules()}
        missing = sorted(names - found)
        if missing:
            raise ValueError(
                f"transformer_cls_names_to_wrap names {missing}, which the model has no module "
                f"of; its classes are {sorted(found)}."
            )
    chosen: list[nn.Module] = []
    sharded: set[int] = set()  # ids of parameters already inside a chosen module

    def visit(module: nn.Module) -> None:
        for child in module.children():
            visit(child)
        if module is model:
            return
        own = [p for p in module.parameters() if id(p) not in sharded]
        if own and _picks(module, settings, names, sum(p.numel() for p in own)):
            chosen.append(module)
            sharded.update(id(p) for p in own)

    visit(model)
    return chosen


def _picks(module: nn.Module, settings: Settings, names: set[str], unwrapped: int) -> bool:
    if settings.wrap == "transformer_based_wrap":
        return type(module).__name__ in names
    if settings.wrap == "size_based_wrap":
        return unwrapped >= settings.min_num_params
    assert settings.policy is not None
    return bool(settings.policy(module=module, recurse=False, nonwrapped_numel=unwrapped))
