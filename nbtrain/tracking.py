"""``from accelerate.tracking import X`` becomes ``from nbtrain.tracking import X``: the names of
Accelerate's ``accelerate.tracking`` that nbtrain supports, re-exported from
``nbtrain.accelerator.tracking`` (nothing is defined here):

- ``GeneralTracker`` and ``on_main_process``, to write a tracker of your own and pass an instance
  in ``Accelerator(log_with=...)``;
- the trackers of the libraries nbtrain records to, under Accelerate's class names, built with
  Accelerate's arguments;
- ``register_tracker_class``, to name your own class in ``log_with``.

``log_with``'s names as an enum: ``nbtrain.utils.LoggerType`` (Accelerate's
``accelerate.utils.LoggerType``).
"""

from __future__ import annotations

from nbtrain.accelerator import tracking as _package
from nbtrain.accelerator.tracking import *  # noqa: F403 (its __all__: the names listed above)

__all__ = [*_package.__all__]


def __getattr__(name: str) -> object:
    raise AttributeError(
        f"module 'nbtrain.tracking' has no attribute {name!r} (nbtrain has these of "
        f"accelerate.tracking: {', '.join(__all__)}; a library nbtrain has no tracker for can "
        "be recorded to with a GeneralTracker subclass of your own)"
    )
