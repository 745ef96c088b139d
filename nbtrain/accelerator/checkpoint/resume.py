"""``resume=True``: the launch's checkpoint is loaded by ``prepare()``, with no code in the
training function.

The load happens in the ``prepare()`` call after which the Accelerator holds as many models,
optimizers, schedulers and DataLoaders as the checkpoint (so ``prepare(model, opt)`` then
``prepare(loader)`` works). Two things wait for later, because the function has not reached them
yet: registered objects (``register_for_checkpointing`` usually comes after ``prepare``) get their
state as they are registered, and the RNG states are restored when the training loop asks its
prepared loader for the first batch, so whatever the function draws between ``prepare()`` and the
loop does not shift the resumed run (the checkpoint's RNG states are those of that very moment).

An explicit ``load_state()`` in the function cancels all of it: code that resumes itself keeps
working as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtrain.accelerator.checkpoint import rng
from nbtrain.accelerator.checkpoint import state as checkpoint
from nbtrain.rank import reporting
from nbtrain.shared.checkpoints import read_meta

if TYPE_CHECKING:
    from nbtrain.accelerator.checkpoint.target import CheckpointTarget

_COUNTED = ("models", "optimizers", "schedulers", "dataloaders")


class Resume:
    def __init__(self, source: str) -> None:
        self.source = Path(source)
        self._meta = read_meta(self.source)
        self._loaded: checkpoint.Loaded | None = None
        self.done = False  # loaded and started, or cancelled

    def after_prepare(self, accelerator: CheckpointTarget) -> int | None:
        """Load once the Accelerator holds what the checkpoint holds: the optimizer steps the
        checkpoint had made (None: nothing loaded now)."""
        if self.done or self._loaded is not None:
            return None
        state = accelerator.training_state()
        counts = state.counts()
        if any(counts[name] != self._meta.get(name, 0) for name in _COUNTED):
            return None
        self._loaded = checkpoint.load_state(
            self.source,
            state,
            accelerator.collectives,
            accelerator.device,
            later=True,
        )
        accelerator.gradient_state.step = self._loaded.accumulation_step
        # Say so (the cell keeps it), and chart on from the loop steps the checkpoint holds.
        steps, per_step = self._loaded.steps, accelerator.gradient_state.num_steps
        # Batches so far: those of the optimizer steps, and any of an unfinished accumulation
        # (its counter runs on through an epoch).
        reporting.resumed_at(steps * per_step + self._loaded.accumulation_step % per_step)
        if accelerator.is_main_process:  # in the dashboard's header (a line outside a launch)
            reporting.resumed_from(self.source.name, steps)
        return steps

    def registered(self, objects: list[Any], first: int) -> None:
        """Objects registered for checkpointing at indexes ``first``...: give them their state."""
        if self.done or self._loaded is None:
            return
        files = self._loaded.custom
        for index, obj in enumerate(objects, start=first):
            if index < len(files):
                checkpoint.load_custom(obj, files[index])

    def at_loop_start(self, accelerator: CheckpointTarget) -> None:
        """The loop asks for its first batch: everything must be in place now."""
        if self.done:
            return
        self.done = True
        if self._loaded is None:
            raise ValueError(self._mismatch(accelerator, "prepared"))
        if len(accelerator.training_state().custom) != len(self._loaded.custom):
            raise ValueError(self._mismatch(accelerator, "registered"))
        if self._loaded.rng is not None:  # (None: a resharded FSDP checkpoint)
            rng.restore(self._loaded.rng)

    def tracker_runs(self) -> tuple[dict[str, Any], int]:
        """The tracker runs the checkpoint belongs to, and its step: a resumed launch goes on
        logging into them (tracking/runs.py)."""
        return dict(self._meta.get("trackers") or {}), int(self._meta.get("steps", 0))

    def cancel(self) -> None:
        self.done = True

    def _mismatch(self, accelerator: CheckpointTarget, verb: str) -> str:
        counts = accelerator.training_state().counts()
        names = (*_COUNTED, "custom_objects")
        have = ", ".join(f"{counts[name]} {name}" for name in names)
        want = ", ".join(f"{self._meta.get(name, 0)} {name}" for name in names)
        return (
            f"resume: the checkpoint {self.source} holds {want}, but when the training loop "
            f"started this run had {have}. Prepare (and register_for_checkpointing) the same "
            f"objects as the run that saved it, before the loop; nothing was {verb} to match."
        )
