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
from nbtrain.accelerator.tracking.registry import BUILT_IN, known
from nbtrain.rank import runtime

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
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"

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
            chosen += _all_installed(logging_dir)
            continue
        _check(known()[name], item, logging_dir)
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
    name = str(getattr(item, "value", item))  # Accelerate's LoggerType is a str enum
    if name.lower() in ("all", *BUILT_IN):
        return name.lower()
    if name in known():  # a class of the user's, registered (register_tracker_class)
        return name
    raise ValueError(
        f"Accelerator(log_with={log_with!r}): nbtrain has no tracker {item!r}. Use one of "
        f"{', '.join(repr(n) for n in known())}, 'all' (every installed one), an instance of "
        "your own GeneralTracker subclass (from nbtrain.tracking import GeneralTracker), or its "
        "class's name after register_tracker_class(YourClass) in this process (a spawned rank "
        "does not see a registration made in the kernel: register in the launched function)."
    )


def _all_installed(logging_dir: str | None) -> list[str]:
    """nbtrain's trackers whose library is installed; those that need a directory only with
    one, saying in one line which were left out for lack of it."""
    found = [name for name, cls in BUILT_IN.items() if installed(cls)]
    if logging_dir is None:
        left = [name for name in found if BUILT_IN[name].requires_logging_directory]
        current = runtime.current()
        if left and (current is None or current.info.rank == 0):  # one line, not one a rank
            print(
                f"nbtrain: log_with='all' leaves out {' and '.join(left)}, which write into a "
                "directory: pass project_dir=... to the Accelerator to record there too.",
                file=sys.stderr,
            )
        found = [name for name in found if name not in left]
    return found


def installed(cls: type) -> bool:
    """Found without importing it (a None in sys.modules means: no such module); a class
    with no library of its own (the user's, registered) is always there."""
    module = getattr(cls, "module", None)
    if module is None:
        return True
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def _check(cls: Any, item: Any, logging_dir: str | None) -> None:
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
