"""Stop and resume: the policy a launch gives its ranks, and the signal that asks for a stop.

``on_interrupt="checkpoint"`` turns the first interrupt into a request: the kernel sends
``STOP_SIGNAL`` to every rank, the ranks agree on one optimizer step, save a checkpoint there and
end. Periodic checkpoints (``checkpoint_every``) and ``resume`` use the same folder and naming:
``<project_dir>/checkpoints/checkpoint_<n>`` (Accelerate's automatic naming), ``n`` counting on
from the highest number already there, so the newest checkpoint is always the highest number.

The kernel decides the policy (kernel/options/stopping.py); the Accelerator in each rank carries
it out (accelerator/checkpoint/stopping.py, accelerator/checkpoint/resume.py).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

STOP_SIGNAL: int | None = getattr(signal, "SIGUSR2", None)  # None on Windows: no graceful stop


@dataclass(frozen=True)
class StopPolicy:
    """What a launch asked for; every field decided in the kernel."""

    project_dir: str  # absolute: checkpoints go to <project_dir>/checkpoints/checkpoint_<n>
    next_number: int  # n of this launch's first checkpoint
    on_interrupt: bool = False  # the first interrupt saves a checkpoint, then stops
    every_steps: int | None = None  # a periodic checkpoint every this many optimizer steps
    every_seconds: float | None = None  # ... or this often (the ranks agree on the step)
    total_limit: int | None = None  # keep this many of the newest checkpoints (None: all)
    resume_from: str | None = None  # a complete checkpoint to load at prepare()
    resumed_steps: int = 0  # the optimizer steps the resumed checkpoint had taken

    @property
    def agrees(self) -> bool:
        """The ranks must agree on a step at run time (an interrupt or a clock decides)."""
        return self.on_interrupt or self.every_seconds is not None


class TrainingStopped(KeyboardInterrupt):
    """Raised in a rank's training loop once the checkpoint of a graceful stop is saved: it
    leaves the user's function like the interrupt it stands for (``except Exception`` does not
    catch it; ``finally`` blocks run), and the rank reports where it stopped."""

    def __init__(self, step: int, path: str) -> None:
        super().__init__(f"stopped at step {step}; checkpoint saved in {path}")
        self.step, self.path = step, path
