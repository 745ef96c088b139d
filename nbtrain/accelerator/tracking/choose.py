"""``Accelerator(log_with=...)``: which trackers a launch records to, checked when the
Accelerator is built (a name nbtrain has no tracker for, a library that is not installed, a
tracker that writes files without a directory), so a mistake fails before training starts."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from enum import Enum
from typing import Any

from nbtrain.accelerator.tracking.base import is_user_tracker
from nbtrain.accelerator.tracking.library import TRACKERS, LibraryTracker

Choice = Any  # a tracker's name (str) or the user's tracker instance


class LoggerType(str, Enum):
    """Accelerate's ``accelerate.utils.LoggerType``: ``log_with``'s names, for those nbtrain
    records to (``nbtrain.utils.LoggerType``)."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"

    def __str__(self) -> str:  # as Accelerate's: the tracker's name
        return self.value


def choose(log_with: Any, logging_dir: str | None) -> list[Choice]:
    """The names and user trackers ``log_with`` asks for, in order, without repeats."""
    if log_with is None:
        return []
    items = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    chosen: list[Choice] = []
    for item in items:
        if is_user_tracker(item):
            chosen.append(item)
            continue
        name = _name_of(item, log_with)
        if name == "all":
            chosen += [n for n, cls in TRACKERS.items() if _usable(cls, logging_dir)]
            continue
        _check(TRACKERS[name], item, logging_dir)
        chosen.append(name)
    if not chosen:
        warnings.warn(
            f"Accelerator(log_with={log_with!r}): none of nbtrain's trackers is installed "
            "(with a logging directory where one is needed); nothing is recorded. "
            "pip install 'nbtrain[trackers]' installs them all.",
            UserWarning,
            stacklevel=4,
        )
    unique: list[Choice] = []
    for choice in chosen:
        if not any(choice is other or choice == other for other in unique):
            unique.append(choice)
    return unique


def _name_of(item: Any, log_with: Any) -> str:
    name = str(getattr(item, "value", item)).lower()  # Accelerate's LoggerType is a str enum
    if name in ("all", *TRACKERS):
        return name
    raise ValueError(
        f"Accelerator(log_with={log_with!r}): nbtrain has no tracker {item!r}. Use one of "
        f"{', '.join(repr(n) for n in TRACKERS)}, 'all' (every installed one), or an instance of "
        "your own GeneralTracker subclass (from nbtrain.tracking import GeneralTracker)."
    )


def installed(cls: type[LibraryTracker]) -> bool:
    """Found without importing it (a None in sys.modules means: no such module)."""
    if cls.module in sys.modules:
        return sys.modules[cls.module] is not None
    return importlib.util.find_spec(cls.module) is not None


def _usable(cls: type[LibraryTracker], logging_dir: str | None) -> bool:
    return installed(cls) and (logging_dir is not None or not cls.requires_logging_directory)


def _check(cls: type[LibraryTracker], item: Any, logging_dir: str | None) -> None:
    if not installed(cls):
        raise ImportError(
            f"Accelerator(log_with={item!r}) needs the {cls.module} package, which is not "
            f"installed: pip install {cls.pip} (or pip install 'nbtrain[trackers]' for every "
            "tracker)."
        )
    if cls.requires_logging_directory and logging_dir is None:
        raise ValueError(
            f"Accelerator(log_with={item!r}) writes its files into a directory: pass "
            f"project_dir=... (or project_config=ProjectConfiguration(logging_dir=...)) to the "
            "Accelerator."
        )
