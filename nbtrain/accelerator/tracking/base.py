"""Accelerate's ``GeneralTracker``: the base of nbtrain's trackers and of the user's own.

A user tracker (a subclass of this class, or of ``accelerate.tracking.GeneralTracker``) is passed
as an instance in ``log_with``; it receives ``start()``, ``store_init_configuration(config)``,
every ``log(values, step=)`` and ``finish()``, on the main process only (as in Accelerate).

nbtrain's own trackers (``library.py``) add what a run needs to outlive a launch: ``identity()``
(saved with each checkpoint, so a resumed launch continues the same run) and ``where()`` (the
line the dashboard shows).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from nbtrain.rank import runtime

Method = TypeVar("Method", bound=Callable[..., Any])


class GeneralTracker:
    """Accelerate's tracker interface: ``name``, ``requires_logging_directory`` and ``tracker``
    (the library's own object, e.g. the W&B run), with ``start``, ``store_init_configuration``,
    ``log`` and ``finish``."""

    main_process_only = True
    # log(values) without step=: False gives this tracker the run's optimizer step (nbtrain's
    # default, right where the library needs a step: TensorBoard, MLflow); True gives it None,
    # as Accelerate does, so a library that counts its own steps (W&B, DVCLive) counts them.
    counts_own_steps = False

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [
            name
            for name in ("name", "requires_logging_directory", "tracker")
            if name not in dir(self)
        ]
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} is missing {', '.join(missing)}: a GeneralTracker "
                "subclass defines name (str), requires_logging_directory (bool) and a tracker "
                "property (the library's object)."
            )

    def start(self) -> None:
        """Called by ``init_trackers``: open the run."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The run's hyperparameters (``init_trackers(config=...)``)."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """One set of values at ``step``."""

    def finish(self) -> None:
        """Close the run (``end_training()``, or the end of the launch)."""


def on_main_process(function: Method) -> Method:
    """Accelerate's decorator for a tracker's methods (``__init__`` too): the method runs only
    on the main process when the tracker's ``main_process_only`` is true, and does nothing (returns
    None) on the others. Checked at each call, as in Accelerate: a tracker built outside a launch
    is on the main process.

    :param function: a tracker's method.
    """

    @functools.wraps(function)
    def on_main_only(self: Any, *args: Any, **kwargs: Any) -> Any:
        current = runtime.current()
        if getattr(self, "main_process_only", False) and current and current.info.rank != 0:
            return None
        return function(self, *args, **kwargs)

    setattr(on_main_only, "main_only", True)  # noqa: B010 (marks it: never wrapped twice)
    return on_main_only  # type: ignore[return-value]


class BlankTracker(GeneralTracker):
    """What ``get_tracker`` gives a process that does not track (not the main one), so code
    such as ``accelerator.get_tracker("wandb").log(...)`` runs on every rank, as in
    Accelerate."""

    name = "blank"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__(_blank=True)

    @property
    def tracker(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:  # any call on the blank tracker does nothing
        return lambda *args, **kwargs: None


def is_user_tracker(obj: object) -> bool:
    """An instance of a tracker class (nbtrain's or Accelerate's GeneralTracker, or any object
    with their methods), rather than a tracker's name."""
    return (
        not isinstance(obj, (str, type))
        and isinstance(getattr(obj, "name", None), str)
        and callable(getattr(obj, "log", None))
    )
