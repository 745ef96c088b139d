"""Checkpoint directories as both sides see them: the completion marker, its metadata and
Accelerate's automatic naming (``<project_dir>/checkpoints/checkpoint_<n>``).

The kernel reads them before a launch (resume checks); the Accelerator writes and loads them
(accelerator/checkpoint/state.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

MARKER = "nbtrain_checkpoint.json"  # written last: a directory without it is never loaded
_AUTOMATIC = re.compile(r"checkpoint_(\d+)")


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file()


def read_meta(directory: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((directory / MARKER).read_text())
    return meta


def automatic_parent(project_dir: str | os.PathLike[str]) -> Path:
    return Path(project_dir, "checkpoints")


def automatic_name(project_dir: str | os.PathLike[str], number: int) -> Path:
    return (automatic_parent(project_dir) / f"checkpoint_{number}").absolute()


def numbered(project_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The automatically named checkpoint directories with their numbers, lowest first."""
    parent = automatic_parent(project_dir)
    if not parent.is_dir():
        return []
    found = [
        (int(match.group(1)), entry)
        for entry in parent.iterdir()
        if (match := _AUTOMATIC.fullmatch(entry.name)) and entry.is_dir()
    ]
    return sorted(found)


def automatic_checkpoints(project_dir: str | os.PathLike[str]) -> list[Path]:
    """The automatically named checkpoint directories, oldest (lowest number) first."""
    return [entry for _, entry in numbered(project_dir)]


def latest_complete(project_dir: str | os.PathLike[str]) -> Path | None:
    """The newest automatically named checkpoint that is complete (a save cut short is not)."""
    for entry in reversed(automatic_checkpoints(project_dir)):
        if is_complete(entry):
            return entry
    return None


def next_number(project_dir: str | os.PathLike[str]) -> int:
    found = numbered(project_dir)
    return found[-1][0] + 1 if found else 0
