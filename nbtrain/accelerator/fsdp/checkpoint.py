"""The FSDP part of save_state / load_state: sharded models and their optimizers.

checkpoint/ keeps doing everything else (atomic directories, the completion marker, schedulers,
RNG states, dataloader positions); it calls ``save`` / ``load`` here on every rank, inside the
directory it is writing or has verified complete, so an FSDP checkpoint is exactly as atomic as
any other.

Two layouts, by the plugin's ``state_dict_type`` (Accelerate's names):

- SHARDED_STATE_DICT: ``pytorch_model_fsdp_<i>/`` and ``optimizer_<i>/``, directories written by
  ``torch.distributed.checkpoint`` with each rank's own shards. DCP reshards on load, so they load
  into another number of ranks too (then the per-rank RNG states and dataloader positions, which
  have no meaning in the new layout, are not restored, with a warning).
- FULL_STATE_DICT: ``pytorch_model_fsdp_<i>.safetensors`` (or ``.bin``) and
  ``optimizer_<i>.bin``, gathered and written by the main process, broadcast from it on load.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nbtrain.accelerator.checkpoint import dirs as checkpoint_dirs
from nbtrain.accelerator.checkpoint import state as checkpoint

SHARDED, FULL = "SHARDED_STATE_DICT", "FULL_STATE_DICT"


def split_training_state(
    state: checkpoint.TrainingState,
    fsdp_models: list[nn.Module],
    *,
    sharded_state_dict: bool,
    sharding: Any,
    rank: int,
) -> Any:
    """``state`` with the FSDP models (``fsdp_models``: those the strategy wrapped) and every
    optimizer (their parameters are those models') handed to a ShardedCheckpoint; other models
    (evaluation only, frozen) stay as they are. ``sharding``, ``rank``: the strategy's."""
    fsdp_ids = {id(model) for model in fsdp_models}
    models = [m for m in state.models if id(m) in fsdp_ids]
    if not models:
        return state
    sharded = ShardedCheckpoint(
        models,
        list(state.optimizers),
        SHARDED if sharded_state_dict else FULL,
        distributed=sharding,
        rank=rank,
    )
    return dataclasses.replace(
        state,
        models=[m for m in state.models if id(m) not in fsdp_ids],
        optimizers=[],
        sharded=sharded,
    )


@dataclasses.dataclass
class ShardedCheckpoint:
    models: list[nn.Module]
    optimizers: list[Any]  # PreparedOptimizer (or plain optimizers)
    kind: str
    distributed: bool
    rank: int

    def counts(self) -> dict[str, int]:
        return {"fsdp_models": len(self.models), "fsdp_optimizers": len(self.optimizers)}

    def meta(self, safe: bool) -> dict[str, Any]:
        return {"state_dict_type": self.kind, "entries": self.entries(self.kind, safe)}

    def entries(self, kind: str, safe: bool) -> list[str]:
        if kind == SHARDED:
            models = [f"pytorch_model_fsdp_{i}" for i in range(len(self.models))]
            return models + [f"optimizer_{i}" for i in range(len(self.optimizers))]
        suffix = "safetensors" if safe else "bin"
        models = [f"pytorch_model_fsdp_{i}.{suffix}" for i in range(len(self.models))]
        return models + [f"optimizer_{i}.bin" for i in range(len(self.optimizers))]

    # -- saving (every rank) ------------------------------------------------------------------

    def save(self, target: Path, safe: bool) -> None:
        names = self.entries(self.kind, safe)
        count = len(self.models)
        if self.kind == SHARDED:
            import torch.distributed.checkpoint as dcp

            for name, model in zip(names, self.models, strict=False):
                state = {"model": _model_state(model)}
                dcp.save(state, checkpoint_id=str(target / name), no_dist=not self.distributed)
            for name, optimizer in zip(names[count:], self.optimizers, strict=True):
                state = _optimizer_state(self._root(), _inner(optimizer))
                dcp.save(
                    {"optimizer": state},
                    checkpoint_id=str(target / name),
                    no_dist=not self.distributed,
                )
            return
        full = _full_options(self.distributed, save=True)
        for name, model in zip(names, self.models, strict=False):
            weights = _model_state(model, full)
            if self.rank == 0:
                write_state_dict(weights, target / name, safe)
        for name, optimizer in zip(names[count:], self.optimizers, strict=True):
            state = _optimizer_state(self._root(), _inner(optimizer), full)
            if self.rank == 0:
                torch.save(state, target / name)
                checkpoint_dirs.fsync(target / name)

    # -- loading (every rank) -----------------------------------------------------------------

    def load(self, source: Path, meta: dict[str, Any], model_kwargs: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        written = meta.get("fsdp") or {}
        kind = written.get("state_dict_type", SHARDED)
        names = list(written.get("entries") or self.entries(kind, bool(meta.get("safetensors"))))
        count = len(self.models)
        strict = bool(model_kwargs.get("strict", True))
        if kind == SHARDED:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import StateDictOptions

            for name, model in zip(names, self.models, strict=False):
                state = {"model": _model_state(model)}
                dcp.load(state, checkpoint_id=str(source / name), no_dist=not self.distributed)
                set_model_state_dict(model, state["model"], options=StateDictOptions(strict=strict))
            for name, optimizer in zip(names[count:], self.optimizers, strict=True):
                root, inner = self._root(), _inner(optimizer)
                ostate: dict[str, Any] = {"optimizer": _optimizer_state(root, inner)}
                dcp.load(ostate, checkpoint_id=str(source / name), no_dist=not self.distributed)
                set_optimizer_state_dict(root, inner, ostate["optimizer"])
            return
        options = dataclasses.replace(_full_options(self.distributed, save=False), strict=strict)
        for name, model in zip(names, self.models, strict=False):
            weights = read_state_dict(source / name) if self.rank == 0 else {}
            set_model_state_dict(model, weights, options=options)
        for name, optimizer in zip(names[count:], self.optimizers, strict=True):
            saved: Any = {}
            if self.rank == 0 or not self.distributed:
                saved = torch.load(source / name, map_location="cpu", weights_only=True)
            set_optimizer_state_dict(self._root(), _inner(optimizer), saved, options=options)

    def _root(self) -> nn.Module:
        """The module an optimizer's parameters are named from (all FSDP models together)."""
        return self.models[0] if len(self.models) == 1 else nn.ModuleList(self.models)


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)


def _full_options(distributed: bool, *, save: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if save:
        return StateDictOptions(full_state_dict=True, cpu_offload=True)
    return StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)


def _model_state(model: nn.Module, options: Any = None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=options)


def _optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, options: Any = None
) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=options)


def write_state_dict(state: dict[str, torch.Tensor], path: Path, safe: bool) -> None:
    """A full state dict to ``path`` atomically (safetensors needs tensors that share no
    memory: tied weights are written as copies, and load back into a tied model alike)."""
    seen: set[int] = set()
    tensors = {}
    for key, value in state.items():
        value = value.detach().cpu().contiguous()
        pointer = value.untyped_storage().data_ptr()
        tensors[key] = value.clone() if pointer in seen else value
        seen.add(pointer)
    with checkpoint_dirs.written_aside(path) as aside:
        if safe:
            from safetensors.torch import save_file

            save_file(tensors, str(aside), metadata={"format": "pt"})
        else:
            torch.save(tensors, aside)


def read_state_dict(path: Path) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    loaded: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return loaded
