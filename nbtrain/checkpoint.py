"""Training state on disk: written atomically, loaded only when complete.

``save_state(dir)`` writes everything into ``.<dir>.partial`` next to ``dir``; the main process
writes the completion marker (``nbtrain_checkpoint.json``) last, then swaps the directories
(``dir`` -> ``.<dir>.old``, ``.partial`` -> ``dir``, drop ``.old``). A save killed at any point
leaves a complete checkpoint behind: ``dir`` itself, or ``.<dir>.old`` during the swap, which
``load_state`` falls back to. A directory without the marker is never taken for a checkpoint.

Collective calls: save_state makes 3 barriers and load_state 2 (through ``Collectives``, so a
rank calling them alone, e.g. under ``if accelerator.is_main_process:``, gets an error instead of
a hang). Every rank must call both. The directory must be on storage all ranks share.

Layout: model[_i].safetensors (or model[_i].bin without safetensors), optimizer[_i].bin,
scheduler[_i].bin, scaler.pt, custom_checkpoint_<i>.pkl (main process); rank_<r>.pt with the
RNG states, the dataloader positions and the accumulation counter of rank r; the marker.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import rng
from .collectives import Collectives, Op, tag_of

MARKER = "nbtrain_checkpoint.json"
FORMAT = 1


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

    def counts(self) -> dict[str, int]:
        return {
            "models": len(self.models),
            "optimizers": len(self.optimizers),
            "schedulers": len(self.schedulers),
            "dataloaders": len(self.dataloaders),
            "custom_objects": len(self.custom),
            "scaler": int(self.scaler is not None),
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
class Slots:
    final: Path
    partial: Path
    old: Path

    @classmethod
    def of(cls, directory: str | os.PathLike[str]) -> Slots:
        final = Path(os.path.abspath(os.fspath(directory)))
        return cls(
            final, final.with_name(f".{final.name}.partial"), final.with_name(f".{final.name}.old")
        )


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file()


def check_replaceable(slots: Slots) -> None:
    """Only an nbtrain checkpoint or an empty directory may be replaced by a new checkpoint."""
    final = slots.final
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(
            f"save_state(output_dir={str(final)!r}): that path is a file. Pass a directory path."
        )
    if final.is_dir() and not is_complete(final):
        others = sorted(entry.name for entry in final.iterdir())
        if others:
            shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
            raise FileExistsError(
                f"save_state(output_dir={str(final)!r}) would replace a directory that holds "
                f"other files ({shown}) and is not an nbtrain checkpoint. Pass a directory of its "
                f"own, e.g. {str(final / 'checkpoint')!r}."
            )


def resolve_complete(directory: str | os.PathLike[str]) -> Path:
    """The complete checkpoint to load for ``directory`` (itself, or the one kept while an
    interrupted save swapped directories)."""
    slots = Slots.of(directory)
    for candidate in (slots.final, slots.old):
        if is_complete(candidate):
            return candidate
    if not slots.final.exists():
        raise FileNotFoundError(
            f"load_state(input_dir={str(slots.final)!r}): there is no checkpoint at that path. "
            "Pass a directory written by accelerator.save_state(...)."
        )
    raise FileNotFoundError(
        f"load_state(input_dir={str(slots.final)!r}): the directory is not a complete nbtrain "
        f"checkpoint (no {MARKER}); it was not written by save_state(), or its save was "
        "interrupted before it completed. Load an earlier checkpoint."
    )


def _fsync(path: Path) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _save(obj: Any, path: Path) -> None:
    torch.save(obj, path)
    _fsync(path)


# ---------------------------------------------------------------------------------------------
# save_state / load_state


def save_state(
    directory: str | os.PathLike[str],
    state: TrainingState,
    collectives: Collectives,
    *,
    safe_serialization: bool = True,
) -> Path:
    slots = Slots.of(directory)
    rank, world = collectives.rank, collectives.world_size
    main = rank == 0
    check_replaceable(slots)  # every rank checks, so every rank raises alike
    if main:
        shutil.rmtree(slots.partial, ignore_errors=True)
        slots.partial.mkdir(parents=True)
    collectives.barrier(Op.SAVE_STATE, tag_of(str(slots.final), "start"))
    safe = safe_serialization and safetensors_available()
    if main:
        _write_shared(slots.partial, state, safe)
    _save(_rank_state(state), slots.partial / f"rank_{rank}.pt")
    collectives.barrier(Op.SAVE_STATE, tag_of(str(slots.final), "written"))
    if main:
        _write_marker(slots.partial, state, world, safe)
        _swap(slots)
    collectives.barrier(Op.SAVE_STATE, tag_of(str(slots.final), "done"))
    return slots.final


def _write_shared(target: Path, state: TrainingState, safe: bool) -> None:
    for index, model in enumerate(state.models):
        write_model(model, target / _model_name(index, safe), safe)
    for index, optimizer in enumerate(state.optimizers):
        _save(optimizer.state_dict(), target / _indexed("optimizer", index, "bin"))
    for index, scheduler in enumerate(state.schedulers):
        _save(scheduler.state_dict(), target / _indexed("scheduler", index, "bin"))
    if state.scaler is not None:
        _save(state.scaler.state_dict(), target / "scaler.pt")
    for index, obj in enumerate(state.custom):
        _save(obj.state_dict(), target / f"custom_checkpoint_{index}.pkl")


def _rank_state(state: TrainingState) -> dict[str, Any]:
    return {
        "rng": rng.capture(),
        "dataloaders": [loader.state_dict() for loader in state.dataloaders],
        "accumulation_step": state.accumulation_step,
    }


def _write_marker(target: Path, state: TrainingState, world: int, safe: bool) -> None:
    from . import __version__

    meta = {
        "format": FORMAT,
        "world_size": world,
        "safetensors": safe,
        "nbtrain": __version__,
        "torch": torch.__version__,
        **state.counts(),
    }
    path = target / MARKER
    path.write_text(json.dumps(meta, indent=1))
    _fsync(path)
    _fsync(target)


def _swap(slots: Slots) -> None:
    if slots.final.exists():
        shutil.rmtree(slots.old, ignore_errors=True)
        slots.final.rename(slots.old)  # the previous checkpoint stays loadable from here
    slots.partial.rename(slots.final)
    _fsync(slots.final.parent)
    shutil.rmtree(slots.old, ignore_errors=True)


def load_state(
    directory: str | os.PathLike[str],
    state: TrainingState,
    collectives: Collectives,
    device: torch.device,
) -> tuple[Path, int]:
    """Restore ``state`` in place; returns (directory read, accumulation counter)."""
    slots = Slots.of(directory)
    source = resolve_complete(directory)
    collectives.barrier(Op.LOAD_STATE, tag_of(str(slots.final), "start"))
    meta = json.loads((source / MARKER).read_text())
    _check_compatible(meta, state, collectives.world_size, source)
    safe = bool(meta.get("safetensors"))
    for index, model in enumerate(state.models):
        read_model(model, source / _model_name(index, safe), safe, device)
    for index, optimizer in enumerate(state.optimizers):
        optimizer.load_state_dict(_load(source / _indexed("optimizer", index, "bin")))
    for index, scheduler in enumerate(state.schedulers):
        scheduler.load_state_dict(_load(source / _indexed("scheduler", index, "bin"), trusted=True))
    if state.scaler is not None:
        state.scaler.load_state_dict(_load(source / "scaler.pt"))
    for index, obj in enumerate(state.custom):
        obj.load_state_dict(_load(source / f"custom_checkpoint_{index}.pkl", trusted=True))
    mine = _load(source / f"rank_{collectives.rank}.pt")
    for loader, position in zip(state.dataloaders, mine["dataloaders"], strict=True):
        loader.load_state_dict(position)
    collectives.barrier(Op.LOAD_STATE, tag_of(str(slots.final), "done"))
    rng.restore(mine["rng"])  # last: nothing after this may draw random numbers
    return source, int(mine.get("accumulation_step", 0))


def _load(path: Path, trusted: bool = False) -> Any:
    # Schedulers and registered objects may hold arbitrary Python objects: load only
    # checkpoints you trust (as with torch.load in general).
    return torch.load(path, map_location="cpu", weights_only=not trusted)


def _check_compatible(
    meta: dict[str, Any], state: TrainingState, world_size: int, source: Path
) -> None:
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"load_state: {source} has checkpoint format {meta.get('format')!r}; this nbtrain "
            f"reads format {FORMAT}. Load it with the nbtrain version that wrote it "
            f"({meta.get('nbtrain')})."
        )
    if meta.get("world_size") != world_size:
        raise ValueError(
            f"load_state: {source} was written by {meta.get('world_size')} rank(s), but this run "
            f"has {world_size}. The checkpoint holds per-rank RNG states and data positions: "
            f"resume with num_processes={meta.get('world_size')}."
        )
    for name, count in state.counts().items():
        if meta.get(name, 0) != count:
            raise ValueError(
                f"load_state: {source} holds {meta.get(name, 0)} {name} but this Accelerator "
                f"has {count}. Prepare (and register_for_checkpointing) the same objects, in the "
                "same order, as the run that saved it."
            )


def _indexed(stem: str, index: int, suffix: str) -> str:
    return f"{stem}.{suffix}" if index == 0 else f"{stem}_{index}.{suffix}"


def _model_name(index: int, safe: bool) -> str:
    return _indexed("model", index, "safetensors" if safe else "bin")


# ---------------------------------------------------------------------------------------------
# Model files


def write_model(model: nn.Module, path: Path, safe: bool) -> None:
    """Write ``model``'s weights to ``path`` atomically (aside, then rename)."""
    aside = path.with_name(f".{path.name}.tmp")
    if safe and _on_xla(model):
        from .xla_accel import write_safetensors  # XLA tensors expose no storage to read

        write_safetensors(model, str(aside))
    elif safe:
        from safetensors.torch import save_model

        # save_model (not save_file) handles tied weights that share storage.
        save_model(model, str(aside), metadata={"format": "pt"}, force_contiguous=True)
    else:
        torch.save(model.state_dict(), aside)
    _fsync(aside)
    os.replace(aside, path)


def read_model(model: nn.Module, path: Path, safe: bool, device: torch.device) -> None:
    if safe and _on_xla(model):
        from .xla_accel import read_safetensors

        read_safetensors(model, str(path))
    elif safe:
        from safetensors.torch import load_model

        load_model(model, str(path), strict=True, device=str(device))
    else:
        model.load_state_dict(torch.load(path, map_location=device, weights_only=True))


def _on_xla(model: nn.Module) -> bool:
    return any(p.device.type == "xla" for p in model.parameters())


def save_model(
    model: nn.Module, directory: str | os.PathLike[str], *, safe_serialization: bool = True
) -> Path:
    """Weights only, as ``model.safetensors`` (or ``pytorch_model.bin`` without safetensors)."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    safe = safe_serialization and safetensors_available()
    path = target / ("model.safetensors" if safe else "pytorch_model.bin")
    write_model(model, path, safe)
    return path
