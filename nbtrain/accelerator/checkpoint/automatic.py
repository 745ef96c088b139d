"""Automatic checkpoint naming (Accelerate's ``ProjectConfiguration(automatic_checkpoint_naming=
True)``): ``<project_dir>/checkpoints/checkpoint_<n>``, the newest one, and pruning to
``total_limit``. The names themselves are shared/checkpoints.py's (the kernel reads them too).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nbtrain.shared.checkpoints import automatic_checkpoints, automatic_name


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
