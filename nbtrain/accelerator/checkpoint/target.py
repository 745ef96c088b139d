"""What the checkpoint layer needs of an Accelerator, handed to it by the Accelerator
(front/state.py: ``_checkpoint_target``), so that checkpoint/ reads none of the Accelerator's
own attributes and imports nothing of the front end, not even for types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from nbtrain.accelerator.checkpoint.state import TrainingState
    from nbtrain.accelerator.comm.collectives import Collectives
    from nbtrain.accelerator.training.accumulation import GradientState


@dataclass(frozen=True)
class CheckpointTarget:
    """One Accelerator as its checkpoints see it."""

    training_state: Callable[[], TrainingState]  # what a checkpoint would hold, now
    collectives: Collectives
    device: torch.device
    gradient_state: GradientState  # its accumulation step is saved and restored
    is_main_process: bool


__all__ = ["CheckpointTarget"]
