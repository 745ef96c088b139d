"""Training state on disk: written atomically, loaded only when complete.

A directory is a checkpoint once it holds the completion marker (``nbtrain_checkpoint.json``),
which the main process writes after every other file; a directory without it is never loaded.
``save_state(dir)`` writes in one of two ways, whichever leaves ``dir``'s other contents alone:

- *swap* (``dir`` is new, or holds nbtrain's checkpoint files only): everything is written into
  ``.<dir>.partial`` next to ``dir``, the marker last, then the directories are swapped
  (``dir`` -> ``.<dir>.old``, ``.partial`` -> ``dir``, drop ``.old``). A save killed at any point
  leaves a complete checkpoint: ``dir``, or ``.<dir>.old`` mid-swap, which ``load_state`` falls
  back to. Entries that appeared in ``dir`` meanwhile are hard-linked (else copied) across.
- *in place* (``dir`` holds anything nbtrain did not write: a tokenizer, save_model output,
  logs, ...): everything is written into ``dir/.nbtrain-partial``; writing the marker there
  commits the save. Then the previous checkpoint's marker goes, nbtrain's files replace their
  old versions one by one, files the previous save wrote and this one did not are removed, and
  the marker comes last. A save killed before the commit leaves the previous checkpoint (or no
  checkpoint) as it was; one killed after it is finished by the next load_state or save_state
  (the partial directory holds what is left to move). Other entries are never touched.

Either way ``dir`` is never seen complete with a mix of two saves, and a save that returned is
never lost. Do not write into ``dir`` while save_state runs.

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

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nbtrain.accelerator import rng
from nbtrain.accelerator.collectives import Collectives, Op, tag_of
from nbtrain.shared.checkpoints import (
    MARKER,
    automatic_checkpoints,
    automatic_name,
    is_complete,
    read_meta,
)

FORMAT = 2
READABLE_FORMATS = (1, 2)
IN_PLACE = ".nbtrain-partial"  # inside the target directory: an in-place save being written


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


def check_target(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(
            f"save_state(output_dir={str(directory)!r}): that path is a file. Pass a directory "
            "path."
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


def written_files(meta: dict[str, Any]) -> set[str]:
    """The names of the files the save described by ``meta`` wrote (the marker aside)."""
    fmt, safe = meta.get("format"), bool(meta.get("safetensors"))
    names = {_model_name(i, safe, fmt) for i in range(meta.get("models", 0))}
    names |= {_indexed("optimizer", i, "bin") for i in range(meta.get("optimizers", 0))}
    names |= {_indexed("scheduler", i, "bin") for i in range(meta.get("schedulers", 0))}
    names |= {f"custom_checkpoint_{i}.pkl" for i in range(meta.get("custom_objects", 0))}
    names |= {_rank_name(r, fmt) for r in range(meta.get("world_size", 0))}
    if meta.get("scaler"):
        names.add("scaler.pt")
    names |= set((meta.get("fsdp") or {}).get("entries", []))
    return names


def _foreign_entries(directory: Path) -> list[str]:
    """Entries of a checkpoint directory that its save did not write (the user's own)."""
    ours = {MARKER, IN_PLACE}
    if is_complete(directory):
        ours |= written_files(read_meta(directory))
    return sorted(entry.name for entry in directory.iterdir() if entry.name not in ours)


@contextlib.contextmanager
def _written_aside(path: Path) -> Iterator[Path]:
    """Yields the file to write instead of ``path``; once written (and synced), it is renamed
    to ``path``: a reader sees the old file or the whole new one, never a torn one."""
    aside = path.with_name(f".{path.name}.tmp")
    yield aside
    _fsync(aside)
    os.replace(aside, path)


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
    check_target(slots.final)  # every rank checks, so every rank raises alike
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
        partial = Path(collectives.broadcast_object(str(_prepare(slots)) if main else None, 0))
    else:
        partial = _prepare(slots)
    safe = safe_serialization and safetensors_available()
    if main:
        _write_shared(partial, state, safe)
    if state.sharded is not None:  # every rank writes its own shards
        state.sharded.save(partial, safe)
    _save(mine, partial / _rank_name(rank, FORMAT))
    collectives.barrier(Op.SAVE_STATE, tag_of(tag, "written"))
    if main:
        _commit(slots, partial, _meta(state, world, safe))
    collectives.barrier(Op.SAVE_STATE, tag_of(tag, "done"))
    return slots.final


def _prepare(slots: Slots) -> Path:
    """(Main process.) Finish or drop what an interrupted save left, and create the directory
    this save writes into: the swap's ``.<dir>.partial``, or ``dir/.nbtrain-partial``."""
    finish_interrupted(slots.final, discard=True)
    shutil.rmtree(slots.partial, ignore_errors=True)
    final = slots.final
    if not final.exists() or (_replaceable(final) and not _foreign_entries(final)):
        slots.partial.mkdir(parents=True)
        return slots.partial
    (final / IN_PLACE).mkdir()
    return final / IN_PLACE


def _replaceable(directory: Path) -> bool:
    """A checkpoint directory the swap may rename away: not a symlink (the link would be
    replaced, its target left behind) nor a mount point (it cannot be renamed)."""
    return is_complete(directory) and not directory.is_symlink() and not os.path.ismount(directory)


def _commit(slots: Slots, partial: Path, meta: dict[str, Any]) -> None:
    final = slots.final
    if partial == slots.partial:
        _carry_over(final, partial)
        _write_marker(partial, meta)
        _swap(slots)
        return
    if is_complete(final):  # files of the previous save that this one does not replace
        meta["replaces"] = sorted(written_files(read_meta(final)) - written_files(meta))
    _write_marker(partial, meta)  # the commit point of an in-place save
    finish_interrupted(final)
    shutil.rmtree(slots.old, ignore_errors=True)  # (left by an earlier swap, if any)


def finish_interrupted(directory: Path, discard: bool = False) -> None:
    """(Main process.) Complete an in-place save that committed but did not finish moving its
    files into ``directory``; with ``discard``, also drop one that did not commit."""
    partial = directory / IN_PLACE
    if not partial.is_dir():
        return
    if not is_complete(partial):
        if discard:
            shutil.rmtree(partial)
        return
    replaced = read_meta(partial).get("replaces", [])
    (directory / MARKER).unlink(missing_ok=True)  # from here on, only the partial one counts
    _fsync(directory)
    for name in replaced:
        _remove(directory / name)
    for entry in sorted(partial.iterdir()):
        if entry.name != MARKER:
            if entry.is_dir() and (directory / entry.name).is_dir():
                shutil.rmtree(directory / entry.name)  # (a directory cannot replace one)
            os.replace(entry, directory / entry.name)
    _fsync(directory)
    os.replace(partial / MARKER, directory / MARKER)
    _fsync(directory)
    shutil.rmtree(partial, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _carry_over(source: Path, target: Path) -> None:
    """Entries of the checkpoint being replaced that its save did not write go into the new
    one: hard links where the filesystem allows them (no copy, open files stay shared), else
    copies; directories recursively. ``source`` may be no checkpoint at all (a directory that
    appeared while the save ran): then all of it is carried over, and nothing is lost."""
    if not source.is_dir():
        return
    for name in _foreign_entries(source):
        entry, destination = source / name, target / name
        if destination.exists():
            continue  # this save wrote a file of that name
        if entry.is_symlink():
            os.symlink(os.readlink(entry), destination)
        elif entry.is_dir():
            shutil.copytree(entry, destination, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, destination)


def _link_or_copy(source: str | os.PathLike[str], destination: str | os.PathLike[str]) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(source, destination)


def _write_shared(target: Path, state: TrainingState, safe: bool) -> None:
    for index, model in enumerate(state.models):
        write_model(model, target / _model_name(index, safe, FORMAT), safe)
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


def _meta(state: TrainingState, world: int, safe: bool) -> dict[str, Any]:
    from nbtrain import __version__

    meta = {
        "format": FORMAT,
        "world_size": world,
        "safetensors": safe,
        "nbtrain": __version__,
        "torch": torch.__version__,
        "steps": state.steps,
        **state.counts(),
    }
    if state.sharded is not None:
        meta["fsdp"] = state.sharded.meta(safe)
    return meta


def _write_marker(target: Path, meta: dict[str, Any]) -> None:
    """Write aside, then rename: the marker is the commit point of an in-place save, so it is
    either absent or whole, never a torn file that would make the checkpoint unreadable."""
    with _written_aside(target / MARKER) as aside:
        aside.write_text(json.dumps(meta, indent=1))
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
    *,
    model_kwargs: dict[str, Any] | None = None,
    load_kwargs: dict[str, Any] | None = None,
    later: bool = False,
) -> Loaded:
    """Restore ``state`` in place.

    ``model_kwargs`` go to the model loading (e.g. ``strict=False``), ``load_kwargs`` to the
    ``torch.load`` of optimizer, scheduler and registered-object states (Accelerate's
    ``load_state(dir, load_kwargs=..., **load_model_func_kwargs)``). ``later`` (a resume at
    prepare(), accelerator/resume.py): registered objects and the RNG states are not restored
    but returned, for objects registered after prepare() and for the loop's first batch."""
    slots = Slots.of(directory)
    shared, tag = _agree_on_directory(collectives, Op.LOAD_STATE, slots.final)
    if collectives.rank == 0 or not shared:
        finish_interrupted(slots.final)  # an in-place save that committed but did not finish
    collectives.barrier(Op.LOAD_STATE, tag_of(tag, "ready"))
    source = resolve_complete(directory)  # every rank decides alike: it reads the same disk
    meta = read_meta(source)
    _check_compatible(meta, state, collectives.world_size, source, custom=not later)
    fmt, safe = meta["format"], bool(meta.get("safetensors"))
    extra = dict(load_kwargs or {})
    for index, model in enumerate(state.models):
        read_model(model, source / _model_name(index, safe, fmt), safe, device, model_kwargs)
    if state.sharded is not None:
        state.sharded.load(source, meta, dict(model_kwargs or {}))
    for index, optimizer in enumerate(state.optimizers):
        optimizer.load_state_dict(_load(source / _indexed("optimizer", index, "bin"), extra))
    for index, scheduler in enumerate(state.schedulers):
        path = source / _indexed("scheduler", index, "bin")
        scheduler.load_state_dict(_load(path, extra, trusted=True))
    if state.scaler is not None:
        state.scaler.load_state_dict(_load(source / "scaler.pt"))
    custom = [source / f"custom_checkpoint_{i}.pkl" for i in range(meta.get("custom_objects", 0))]
    if not later:
        for obj, path in zip(state.custom, custom, strict=True):
            load_custom(obj, path, extra)
    steps = int(meta.get("steps", 0))
    if meta.get("world_size") != collectives.world_size:  # a resharded FSDP checkpoint
        _warn_resharded(source, meta, collectives.world_size)
        collectives.barrier(Op.LOAD_STATE, tag_of(tag, "done"))
        return Loaded(source, 0, steps, custom=custom if later else [])
    mine = _load(source / _rank_name(collectives.rank, fmt))
    for loader, position in zip(state.dataloaders, mine["dataloaders"], strict=True):
        loader.load_state_dict(position)
    collectives.barrier(Op.LOAD_STATE, tag_of(tag, "done"))
    accumulation = int(mine.get("accumulation_step", 0))
    if later:
        return Loaded(source, accumulation, steps, rng=mine["rng"], custom=custom)
    rng.restore(mine["rng"])  # last: nothing after this may draw random numbers
    return Loaded(source, accumulation, steps)


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
    if meta.get("format") not in READABLE_FORMATS:
        raise ValueError(
            f"load_state: {source} has checkpoint format {meta.get('format')!r}; this nbtrain "
            f"reads formats {READABLE_FORMATS}. Load it with the nbtrain version that wrote it "
            f"({meta.get('nbtrain')})."
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


def _indexed(stem: str, index: int, suffix: str) -> str:
    return f"{stem}.{suffix}" if index == 0 else f"{stem}_{index}.{suffix}"


def _model_name(index: int, safe: bool, fmt: object) -> str:
    if safe:
        return _indexed("model", index, "safetensors")
    return _indexed("model" if fmt == 1 else "pytorch_model", index, "bin")


def _rank_name(rank: int, fmt: object) -> str:
    return f"rank_{rank}.pt" if fmt == 1 else f"random_states_{rank}.pkl"


# ---------------------------------------------------------------------------------------------
# Automatic checkpoint naming (Accelerate's ProjectConfiguration(automatic_checkpoint_naming=True))

def automatic_directory(project_dir: str | os.PathLike[str], iteration: int) -> Path:
    """``<project_dir>/checkpoints/checkpoint_<iteration>``, which must not exist yet."""
    target = automatic_name(project_dir, iteration)
    if target.exists():
        raise FileExistsError(
            f"save_state(): the automatic checkpoint directory {str(target)!r} exists already. "
            "Continue the numbering after it: accelerator.project_configuration.iteration = "
            f"{iteration + 1} (or higher)."
        )
    return target


def latest_automatic(project_dir: str | os.PathLike[str]) -> Path:
    found = automatic_checkpoints(project_dir)
    if not found:
        raise FileNotFoundError(
            f"load_state(): there is no automatically named checkpoint in "
            f"{str(Path(project_dir, 'checkpoints'))!r} yet. Pass input_dir= explicitly."
        )
    return found[-1]


def prune_automatic(project_dir: str | os.PathLike[str], keep: int, saved: Path) -> None:
    """(Main process, after the save of ``saved`` completed.) Keep ``saved`` and the newest
    others, ``keep`` in all (at least ``saved``: Accelerate's total_limit=0 keeps the new one).
    ``saved`` is never deleted, even when a fresh Accelerator restarted the numbering below
    older checkpoints."""
    saved = saved.resolve()
    others = [entry for entry in automatic_checkpoints(project_dir) if entry.resolve() != saved]
    for old in others[: max(0, len(others) - max(0, keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Model files


def write_model(model: nn.Module, path: Path, safe: bool) -> None:
    """Write ``model``'s weights to ``path`` atomically (aside, then rename)."""
    with _written_aside(path) as aside:
        if safe and _on_xla(model):
            from nbtrain.accelerator.xla import write_safetensors

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
        from nbtrain.accelerator.xla import read_safetensors

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
