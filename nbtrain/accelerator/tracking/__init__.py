"""Experiment trackers for the Accelerator (Accelerate's ``log_with`` / ``init_trackers`` /
``log`` / ``get_tracker`` / ``end_training``), with the real libraries, on the main process.

- ``base``: ``GeneralTracker``, the interface of every tracker (the user's own too);
- ``library``: TensorBoard, MLflow, W&B, trackio, Aim and Comet, each calling its library;
- ``choose``: ``log_with`` checked when the Accelerator is built;
- ``runs``: the process's run (one per launch, spanning warm cells, continued on resume);
- ``front``: what the Accelerator delegates to (``Tracking``).

``__all__`` is what users import, from ``nbtrain.tracking`` (Accelerate's ``accelerate.tracking``),
which re-exports exactly these names.
"""

from nbtrain.accelerator.tracking.base import GeneralTracker, on_main_process
from nbtrain.accelerator.tracking.library import (
    AimTracker,
    CometMLTracker,
    MLflowTracker,
    TensorBoardTracker,
    TrackioTracker,
    WandBTracker,
)

__all__ = [
    "AimTracker",
    "CometMLTracker",
    "GeneralTracker",
    "MLflowTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "on_main_process",
]
