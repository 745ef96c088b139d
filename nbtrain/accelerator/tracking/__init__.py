"""Experiment trackers for the Accelerator (Accelerate's ``log_with`` / ``init_trackers`` /
``log`` / ``get_tracker`` / ``end_training``), with the real libraries, on the main process.

- ``base``: ``GeneralTracker``, the interface of every tracker (the user's own too);
- ``library``: the base of nbtrain's trackers, and TensorBoard, W&B, trackio, Aim and Comet;
- ``mlflow_run``, ``clearml_task``, ``dvclive_live``, ``swanlab_run``: MLflow, ClearML, DVCLive
  and SwanLab, each built as Accelerate builds it;
- ``registry``: the names ``log_with`` takes (``register_tracker_class`` adds the user's);
- ``choose``: ``log_with`` checked when the Accelerator is built;
- ``runs``: the process's run (one per launch, spanning warm cells, continued on resume);
- ``front``: what the Accelerator delegates to (``Tracking``).

``__all__`` is what users import, from ``nbtrain.tracking`` (Accelerate's ``accelerate.tracking``),
which re-exports exactly these names.
"""

from nbtrain.accelerator.tracking.base import GeneralTracker, on_main_process
from nbtrain.accelerator.tracking.clearml_task import ClearMLTracker
from nbtrain.accelerator.tracking.dvclive_live import DVCLiveTracker
from nbtrain.accelerator.tracking.library import (
    AimTracker,
    CometMLTracker,
    TensorBoardTracker,
    TrackioTracker,
    WandBTracker,
)
from nbtrain.accelerator.tracking.mlflow_run import MLflowTracker
from nbtrain.accelerator.tracking.registry import register_tracker_class
from nbtrain.accelerator.tracking.swanlab_run import SwanLabTracker

__all__ = [
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "on_main_process",
    "register_tracker_class",
]
