"""A checkpoint directory on disk: its file names, files written aside then renamed, and the
two ways a save replaces a directory atomically (state.py decides what goes in it).

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
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nbtrain.shared.checkpoints import MARKER, is_complete, read_meta

FORMAT = 2
READABLE_FORMATS = (1, 2)
IN_PLACE = ".nbtrain-partial"  # inside the target directory: an in-place save being written


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
    names = {model_name(i, safe, fmt) for i in range(meta.get("models", 0))}
    names |= {indexed("optimizer", i, "bin") for i in range(meta.get("optimizers", 0))}
    names |= {indexed("scheduler", i, "bin") for i in range(meta.get("schedulers", 0))}
    names |= {f"custom_checkpoint_{i}.pkl" for i in range(meta.get("custom_objects", 0))}
    names |= {rank_name(r, fmt) for r in range(meta.get("world_size", 0))}
    if meta.get("scaler"):
        names.add("scaler.pt")
    names |= set((meta.get("fsdp") or {}).get("entries", []))
    return names


def foreign_entries(directory: Path) -> list[str]:
    """Entries of a checkpoint directory that its save did not write (the user's own)."""
    ours = {MARKER, IN_PLACE}
    if is_complete(directory):
        ours |= written_files(read_meta(directory))
    return sorted(entry.name for entry in directory.iterdir() if entry.name not in ours)


@contextlib.contextmanager
def written_aside(path: Path) -> Iterator[Path]:
    """Yields the file to write instead of ``path``; once written (and synced), it is renamed
    to ``path``: a reader sees the old file or the whole new one, never a torn one."""
    aside = path.with_name(f".{path.name}.tmp")
    yield aside
    fsync(aside)
    os.replace(aside, path)


def fsync(path: Path) -> None:
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



def save_file(obj: Any, path: Path) -> None:
    torch.save(obj, path)
    fsync(path)



def prepare(slots: Slots) -> Path:
    """(Main process.) Finish or drop what an interrupted save left, and create the directory
    this save writes into: the swap's ``.<dir>.partial``, or ``dir/.nbtrain-partial``."""
    finish_interrupted(slots.final, discard=True)
    shutil.rmtree(slots.partial, ignore_errors=True)
    final = slots.final
    if not final.exists() or (replaceable(final) and not foreign_entries(final)):
        slots.partial.mkdir(parents=True)
        return slots.partial
    (final / IN_PLACE).mkdir()
    return final / IN_PLACE


def replaceable(directory: Path) -> bool:
    """A checkpoint directory the swap may rename away: not a symlink (the link would be
    replaced, its target left behind) nor a mount point (it cannot be renamed)."""
    return is_complete(directory) and not directory.is_symlink() and not os.path.ismount(directory)


def commit(slots: Slots, partial: Path, meta: dict[str, Any]) -> None:
    final = slots.final
    if partial == slots.partial:
        _carry_over(final, partial)
        write_marker(partial, meta)
        swap(slots)
        return
    if is_complete(final):  # files of the previous save that this one does not replace
        meta["replaces"] = sorted(written_files(read_meta(final)) - written_files(meta))
    write_marker(partial, meta)  # the commit point of an in-place save
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
    fsync(directory)
    for name in replaced:
        _remove(directory / name)
    for entry in sorted(partial.iterdir()):
        if entry.name != MARKER:
            if entry.is_dir() and (directory / entry.name).is_dir():
                shutil.rmtree(directory / entry.name)  # (a directory cannot replace one)
            os.replace(entry, directory / entry.name)
    fsync(directory)
    os.replace(partial / MARKER, directory / MARKER)
    fsync(directory)
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
    for name in foreign_entries(source):
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



def write_marker(target: Path, meta: dict[str, Any]) -> None:
    """Write aside, then rename: the marker is the commit point of an in-place save, so it is
    either absent or whole, never a torn file that would make the checkpoint unreadable."""
    with written_aside(target / MARKER) as aside:
        aside.write_text(json.dumps(meta, indent=1))
    fsync(target)


def swap(slots: Slots) -> None:
    if slots.final.exists():
        shutil.rmtree(slots.old, ignore_errors=True)
        slots.final.rename(slots.old)  # the previous checkpoint stays loadable from here
    slots.partial.rename(slots.final)
    fsync(slots.final.parent)
    shutil.rmtree(slots.old, ignore_errors=True)



def indexed(stem: str, index: int, suffix: str) -> str:
    return f"{stem}.{suffix}" if index == 0 else f"{stem}_{index}.{suffix}"


def model_name(index: int, safe: bool, fmt: object) -> str:
    if safe:
        return indexed("model", index, "safetensors")
    return indexed("model" if fmt == 1 else "pytorch_model", index, "bin")


def rank_name(rank: int, fmt: object) -> str:
    return f"rank_{rank}.pt" if fmt == 1 else f"random_states_{rank}.pkl"
