"""Training state on disk: written atomically, loaded only when complete.

How a directory is written atomically (swap or in place) is dirs.py's job.

Collective calls: save_state makes 3 barriers and a broadcast, load_state 3 barriers (through
``Collectives``, so a rank calling them alone, e.g. under ``if accelerator.is_main_process:``,
gets an error instead of a hang). Every rank must call both. The directory must be on storage all
ranks share.

Layout (Accelerate's names): model[_i].safetensors (or pytorch_model[_i].bin without
safetensors), optimizer[_i].bin, scheduler[_i].bin, scaler.pt, custom_checkpoint_<i>.pkl (main
process); random_states_<r>.pkl with the RNG states, the dataloader positions and the
accumulation counter of rank r (nbtrain's own content: Accelerate reads models, optimizers,
schedulers and the scaler of it); the marker. Format 1 checkpoints (model[_i].bin, rank_<r>.pt)
still load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nbtrain.accelerator.checkpoint import dirs as files
from nbtrain.accelerator.checkpoint import rng
from nbtrain.accelerator.comm.collectives import Collectives, Op, tag_of
from nbtrain.shared.checkpoints import read_meta


@dataclass
class TrainingState:
    """What a checkpoint holds, as live objects of this rank."""

    models: list[nn.Module] = field(default_factory=list)  # unwrapped
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)
    scaler: Any = None
    accumulation_step: int = 0
    steps: int = 0  # optimizer steps taken (stop and resume count on from it)
    trackers: dict[str, Any] = field(default_factory=dict)  # the tracker runs (to continue)
    # FSDP models and optimizers, saved by every rank (fsdp_checkpoint.ShardedCheckpoint)
    sharded: Any = None

    def counts(self) -> dict[str, int]:
        return {
            "models": len(self.models),
            "optimizers": len(self.optimizers),
            "schedulers": len(self.schedulers),
            "dataloaders": len(self.dataloaders),
            "custom_objects": len(self.custom),
            "scaler": int(self.scaler is not None),
            **(self.sharded.counts() if self.sharded is not None else {}),
        }


def safetensors_available() -> bool:
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Directories


@dataclass(frozen=True)
class Loaded:
    """What load_state read besides the objects it restored in place."""

    source: Path
    accumulation_step: int
    steps: int
    rng: Any = None  # with ``later``: the RNG states to restore at the training loop's start
    custom: list[Path] = field(default_factory=list)  # with ``later``: registered objects' files


# ---------------------------------------------------------------------------------------------
# save_state / load_state


def save_state(
    directory: str | os.PathLike[str],
    state: TrainingState,
    collectives: Collectives,
    *,
    safe_serialization: bool = True,
) -> Path:
    slots = files.Slots.of(directory)
    rank, world = collectives.rank, collectives.world_size
    files.check_target(slots.final)  # every rank checks, so every rank raises alike
    # Before the first barrier: on XLA, capturing marks the step and reads the device RNG at
    # that boundary, which the barriers' own step marks would move on.
    mine = _rank_state(state)
    shared, tag = _agree_on_directory(collectives, Op.SAVE_STATE, slots.final)
    # A directory per rank (Accelerate allows it): each rank writes a whole checkpoint of its
    # own, as the main process of its directory.
    main = rank == 0 or not shared
    if shared:
        # The main process alone looks at the directory and decides (swap or in place): the
        # others write where it says, so the ranks cannot disagree about a changing directory.
        partial = Path(collectives.broadcast_object(str(files.prepare(slots)) if main else None, 0))
    else:
        partial = files.prepare(slots)
    safe = safe_serialization and safetensors_available()
    if main:
        _write_shared(partial, state, safe)
    if state.sharded is not None:  # every rank writes its own shards
        state.sharded.save(partial, safe)
    files.save_file(mine, partial / files.rank_name(rank, files.FORMAT))
    collectives.barrier(Op.SAVE_STATE, tag_of(tag, "written"))
    if main:
        files.commit(slots, partial, _meta(state, world, safe))
    collectives.barrier(Op.SAVE_STATE, tag_of(tag, "done"))
    return slots.final


def _write_shared(target: Path, state: TrainingState, safe: bool) -> None:
    for index, model in enumerate(state.models):
        write_model(model, target / files.model_name(index, safe, files.FORMAT), safe)
    for index, optimizer in enumerate(state.optimizers):
        files.save_file(optimizer.state_dict(), target / files.indexed("optimizer", index, "bin"))
    for index, scheduler in enumerate(state.schedulers):
        files.save_file(scheduler.state_dict(), target / files.indexed("scheduler", index, "bin"))
    if state.scaler is not None:
        files.save_file(state.scaler.state_dict(), target / "scaler.pt")
    for index, obj in enumerate(state.custom):
        files.save_file(obj.state_dict(), target / f"custom_checkpoint_{index}.pkl")


def _rank_state(state: TrainingState) -> dict[str, Any]:
    return {
        "rng": rng.capture(),
        "dataloaders": [loader.state_dict() for loader in state.dataloaders],
        "accumulation_step": state.accumulation_step,
    }


def _meta(state: TrainingState, world: int, safe: bool) -> dict[str, Any]:
    from nbtrain import __version__

    meta = {
        "format": files.FORMAT,
        "world_size": world,
        "safetensors": safe,
        "nbtrain": __version__,
        "torch": torch.__version__,
        "steps": state.steps,
        **state.counts(),
    }
    if state.trackers:
        meta["trackers"] = state.trackers
    if state.sharded is not None:
        meta["fsdp"] = state.sharded.meta(safe)
    return meta


def load_state(
    directory: str | os.PathLike[str],
    state: TrainingState,
    collectives: Collectives,
    device: torch.device,
    *,
    model_kwargs: dict[str, Any] | None = None,
    load_kwargs: dict[str, Any] | None = None,
    later: bool = False,
) -> Loaded:
    """Restore ``state`` in place.

    ``model_kwargs`` go to the model loading (e.g. ``strict=False``), ``load_kwargs`` to the
    ``torch.load`` of optimizer, scheduler and registered-object states (Accelerate's
    ``load_state(dir, load_kwargs=..., **load_model_func_kwargs)``). ``later`` (a resume at
    prepare(), checkpoint/resume.py): registered objects and the RNG states are not restored
    but returned, for objects registered after prepare() and for the loop's first batch."""
    source, meta, tag = _open_complete(directory, state, collectives, custom=not later)
    options = dict(load_kwargs or {})
    _read_shared(source, meta, state, device, model_kwargs, options)
    custom = [source / f"custom_checkpoint_{i}.pkl" for i in range(meta.get("custom_objects", 0))]
    if not later:
        for obj, path in zip(state.custom, custom, strict=True):
            load_custom(obj, path, options)
    steps = int(meta.get("steps", 0))
    if meta.get("world_size") != collectives.world_size:  # a resharded FSDP checkpoint
        _warn_resharded(source, meta, collectives.world_size)
        collectives.barrier(Op.LOAD_STATE, tag_of(tag, "done"))
        return Loaded(source, 0, steps, custom=custom if later else [])
    mine = _load(source / files.rank_name(collectives.rank, meta["format"]))
    for loader, position in zip(state.dataloaders, mine["dataloaders"], strict=True):
        loader.load_state_dict(position)
    collectives.barrier(Op.LOAD_STATE, tag_of(tag, "done"))
    accumulation = int(mine.get("accumulation_step", 0))
    if later:
        return Loaded(source, accumulation, steps, rng=mine["rng"], custom=custom)
    rng.restore(mine["rng"])  # last: nothing after this may draw random numbers
    return Loaded(source, accumulation, steps)


def _open_complete(
    directory: str | os.PathLike[str], state: TrainingState, collectives: Collectives, custom: bool
) -> tuple[Path, dict[str, Any], str]:
    """(the complete checkpoint every rank reads, its meta, the tag of the next barriers), once
    an interrupted in-place save is finished and the checkpoint is known to fit ``state``."""
    slots = files.Slots.of(directory)
    shared, tag = _agree_on_directory(collectives, Op.LOAD_STATE, slots.final)
    if collectives.rank == 0 or not shared:
        files.finish_interrupted(slots.final)  # an in-place save that committed but did not finish
    collectives.barrier(Op.LOAD_STATE, tag_of(tag, "ready"))
    source = files.resolve_complete(directory)  # every rank decides alike: it reads the same disk
    meta = read_meta(source)
    _check_compatible(meta, state, collectives.world_size, source, custom=custom)
    return source, meta, tag


def _read_shared(
    source: Path,
    meta: dict[str, Any],
    state: TrainingState,
    device: torch.device,
    model_kwargs: dict[str, Any] | None,
    options: dict[str, Any],
) -> None:
    """Restore what the main process wrote (``_write_shared``) and the FSDP shards, in place."""
    fmt, safe = meta["format"], bool(meta.get("safetensors"))
    for index, model in enumerate(state.models):
        read_model(model, source / files.model_name(index, safe, fmt), safe, device, model_kwargs)
    if state.sharded is not None:
        state.sharded.load(source, meta, dict(model_kwargs or {}))
    for index, optimizer in enumerate(state.optimizers):
        optimizer.load_state_dict(_load(source / files.indexed("optimizer", index, "bin"), options))
    for index, scheduler in enumerate(state.schedulers):
        path = source / files.indexed("scheduler", index, "bin")
        scheduler.load_state_dict(_load(path, options, trusted=True))
    if state.scaler is not None:
        state.scaler.load_state_dict(_load(source / "scaler.pt"))


def load_custom(obj: Any, path: Path, options: dict[str, Any] | None = None) -> None:
    """Restore one registered object (anything with load_state_dict) from its file."""
    obj.load_state_dict(_load(path, options, trusted=True))


def _warn_resharded(source: Path, meta: dict[str, Any], world_size: int) -> None:
    import warnings

    warnings.warn(
        f"load_state: {source} was written by {meta.get('world_size')} rank(s) and loaded into "
        f"{world_size}: the sharded model and optimizer states were resharded, but the per-rank "
        "RNG states and dataloader positions were not restored (they belong to the old ranks). "
        "Dataloaders start from the beginning of an epoch.",
        UserWarning,
        stacklevel=4,
    )


def _agree_on_directory(collectives: Collectives, op: Op, final: Path) -> tuple[bool, str]:
    """(whether every rank named the same directory, the tag of the next barriers). Ranks may
    name different directories: what must match (the call itself, so none waits for a call
    that never comes) is checked by the barrier; the directories are then compared."""
    collectives.barrier(op, tag_of("start"))
    if collectives.world_size == 1:
        return True, str(final)
    directories = collectives.gather_object([str(final)])
    shared = len(set(directories)) == 1
    return shared, str(final) if shared else "per-rank"


def _load(path: Path, options: dict[str, Any] | None = None, trusted: bool = False) -> Any:
    # Schedulers and registered objects may hold arbitrary Python objects: load only
    # checkpoints you trust (as with torch.load in general).
    return torch.load(
        path, **{"map_location": "cpu", "weights_only": not trusted, **(options or {})}
    )


def _check_compatible(
    meta: dict[str, Any], state: TrainingState, world_size: int, source: Path, custom: bool
) -> None:
    if meta.get("format") not in files.READABLE_FORMATS:
        raise ValueError(
            f"load_state: {source} has checkpoint format {meta.get('format')!r}; this nbtrain "
            f"reads formats {files.READABLE_FORMATS}. Load it with the nbtrain version that "
            f"wrote it ({meta.get('nbtrain')})."
        )
    resharding = bool(meta.get("fsdp")) and state.sharded is not None  # DCP reshards
    if meta.get("world_size") != world_size and not resharding:
        raise ValueError(
            f"load_state: {source} was written by {meta.get('world_size')} rank(s), but this run "
            f"has {world_size}. The checkpoint holds per-rank RNG states and data positions: "
            f"resume with num_processes={meta.get('world_size')}."
        )
    for name, count in state.counts().items():
        if name == "custom_objects" and not custom:
            continue  # registered after prepare() (a resume): checked as they are registered
        if meta.get(name, 0) != count:
            raise ValueError(
                f"load_state: {source} holds {meta.get(name, 0)} {name} but this Accelerator "
                f"has {count}. Prepare (and register_for_checkpointing) the same objects, in the "
                "same order, as the run that saved it."
            )


# ---------------------------------------------------------------------------------------------
# Model files


def write_model(model: nn.Module, path: Path, safe: bool) -> None:
    """Write ``model``'s weights to ``path`` atomically (aside, then rename)."""
    with files.written_aside(path) as aside:
        if safe and _on_xla(model):
            from nbtrain.accelerator.devices.xla_runtime import write_safetensors

            write_safetensors(model, str(aside))
        elif safe:
            from safetensors.torch import save_model

            # save_model (not save_file) handles tied weights that share storage.
            save_model(model, str(aside), metadata={"format": "pt"}, force_contiguous=True)
        else:
            torch.save(model.state_dict(), aside)


def read_model(
    model: nn.Module,
    path: Path,
    safe: bool,
    device: torch.device,
    options: dict[str, Any] | None = None,
) -> None:
    """``options``: keyword arguments of the loading function (``strict=False`` works for
    safetensors files and torch's load_state_dict alike)."""
    options = dict(options or {})
    if safe and _on_xla(model):
        from nbtrain.accelerator.devices.xla_runtime import read_safetensors

        read_safetensors(model, str(path), **options)  # strict=; loads where the model is
    elif safe:
        from safetensors.torch import load_model

        load_model(model, str(path), **{"strict": True, "device": str(device), **options})
    else:
        state = torch.load(path, map_location=device, weights_only=True)
        model.load_state_dict(state, **options)


def _on_xla(model: nn.Module) -> bool:
    return any(p.device.type == "xla" for p in model.parameters())


def save_model(
    model: nn.Module, directory: str | os.PathLike[str], *, safe_serialization: bool = True
) -> Path:
    """Weights only, as ``model.safetensors`` (or ``pytorch_model.bin`` without safetensors)."""
    path, safe = model_file(directory, safe_serialization)
    write_model(model, path, safe)
    return path


def model_file(directory: str | os.PathLike[str], safe_serialization: bool) -> tuple[Path, bool]:
    """Where save_model writes in ``directory`` (created), and whether as safetensors."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    safe = safe_serialization and safetensors_available()
    return target / ("model.safetensors" if safe else "pytorch_model.bin"), safe
