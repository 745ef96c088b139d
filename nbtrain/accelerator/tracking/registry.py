"""The trackers ``log_with`` can name: nbtrain's, and the user's classes registered with
``register_tracker_class`` (Accelerate's documented way to use a custom tracker by name).

A registration lives in the process that made it: a rank started by fork inherits the kernel's,
a spawned rank (or a Ray actor) sees only those its own code makes, so register in the launched
function or in a module it imports."""

from __future__ import annotations

import sys
import warnings
from typing import Any

from nbtrain.accelerator.tracking.base import GeneralTracker
from nbtrain.accelerator.tracking.clearml_task import ClearMLTracker
from nbtrain.accelerator.tracking.dvclive_live import DVCLiveTracker
from nbtrain.accelerator.tracking.library import (
    AimTracker,
    CometMLTracker,
    LibraryTracker,
    TensorBoardTracker,
    TrackioTracker,
    WandBTracker,
)
from nbtrain.accelerator.tracking.mlflow_run import MLflowTracker
from nbtrain.accelerator.tracking.swanlab_run import SwanLabTracker

# nbtrain's own, in the order "all" starts them
BUILT_IN: dict[str, type[LibraryTracker]] = {
    cls.name: cls
    for cls in (
        TensorBoardTracker,
        WandBTracker,
        TrackioTracker,
        CometMLTracker,
        AimTracker,
        MLflowTracker,
        ClearMLTracker,
        DVCLiveTracker,
        SwanLabTracker,
    )
}
_registered: dict[str, type] = {}


def known() -> dict[str, type]:
    """Every name ``log_with`` takes; a registered class shadows nbtrain's of its name."""
    return {**BUILT_IN, **_registered}


def register_tracker_class(tracker_class: type) -> None:
    """Let ``Accelerator(log_with="<tracker_class.name>")`` use your ``GeneralTracker``
    subclass (nbtrain's or Accelerate's), as Accelerate's ``register_tracker_class`` does.
    ``init_trackers`` builds it as ``tracker_class(project_name, **init_kwargs[name])``, with the
    logging directory as second argument when its ``requires_logging_directory`` is true."""
    if not (isinstance(tracker_class, type) and _is_tracker_class(tracker_class)):
        raise ValueError(
            f"register_tracker_class({tracker_class!r}) takes a class: a subclass of "
            "GeneralTracker (from nbtrain.tracking import GeneralTracker), not an instance or "
            "another object. An instance goes straight into Accelerator(log_with=...)."
        )
    name = getattr(tracker_class, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"register_tracker_class({tracker_class.__name__}): the class needs a non-empty "
            f"name (name = 'my_tracker' in its body), the name log_with uses; it has {name!r}."
        )
    if not isinstance(getattr(tracker_class, "requires_logging_directory", None), bool):
        raise ValueError(
            f"register_tracker_class({tracker_class.__name__}): the class needs "
            "requires_logging_directory = True or False in its body (True: it is built with the "
            "Accelerator's logging directory as second argument)."
        )
    if name in known():
        warnings.warn(
            f"register_tracker_class({tracker_class.__name__}): log_with={name!r} now builds "
            f"{tracker_class.__name__} instead of {known()[name].__name__}.",
            UserWarning,
            stacklevel=2,
        )
    _registered[name] = tracker_class


def _is_tracker_class(cls: type) -> bool:
    if issubclass(cls, GeneralTracker):
        return True
    theirs = sys.modules.get("accelerate.tracking")  # imported if the class is built on it
    return theirs is not None and issubclass(cls, theirs.GeneralTracker)


def build(name: str, project_name: Any, logging_dir: str | None, kwargs: dict[str, Any]) -> Any:
    """The tracker ``log_with=name`` makes in ``init_trackers``."""
    cls: Any = known()[name]
    if issubclass(cls, LibraryTracker):
        return cls.by_name(project_name, logging_dir, kwargs)
    if cls.requires_logging_directory:
        return cls(project_name, logging_dir, **kwargs)
    return cls(project_name, **kwargs)
