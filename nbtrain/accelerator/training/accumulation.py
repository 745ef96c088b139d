"""Gradient accumulation: when gradients are synchronised and the optimizer really steps.

Accelerate's documented rules, kept in one place:

- each ``accumulate()`` block is one micro-step; gradients sync (and the optimizer steps) on
  every ``num_steps``-th one;
- with ``sync_with_dataloader`` (the default) they also sync on the last batch of the active
  prepared dataloader, and the count restarts: an epoch's tail never leaks into the next epoch.
  This means a last, shorter group also steps (the documented behaviour behind acc #1847);
  pass GradientAccumulationPlugin(sync_with_dataloader=False) to count across epochs instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class GradientAccumulationPlugin:
    """Same fields as Accelerate's plugin (whose objects are accepted too).

    ``adjust_scheduler`` has no effect (intentional): prepared schedulers step only on
    synchronised steps either way; in Accelerate 1.15 it only advances a counter torch's
    schedulers use for warnings, not the learning rate.

    :param num_steps: micro-steps per optimizer step.
    :param adjust_scheduler: accepted; no effect (above).
    :param sync_with_dataloader: the last batch of a prepared loader always synchronises, even
        mid-accumulation (default True).
    :param sync_each_batch: synchronise gradients on every micro-step (less memory, more
        communication).
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


class ActiveLoader(Protocol):
    end_of_dataloader: bool
    remainder: int


@dataclass
class GradientState:
    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
    sync_gradients: bool = True
    step: int = 0  # micro-steps since the last sync
    _loaders: list[ActiveLoader] = field(default_factory=list)

    @classmethod
    def from_plugin(cls, plugin: Any) -> GradientState:
        values = {}
        for name in ("num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch"):
            if hasattr(plugin, name):
                values[name] = getattr(plugin, name)
        state = cls(**values)
        check_steps(state.num_steps, "gradient_accumulation_plugin.num_steps")
        return state

    def begin_micro_step(self) -> bool:
        """Called as an ``accumulate()`` block opens: decides ``sync_gradients`` for it."""
        if self.sync_with_dataloader and self.end_of_dataloader:
            self.step = 0
            self.sync_gradients = True
        else:
            self.step += 1
            self.sync_gradients = self.step % self.num_steps == 0
        return self.sync_gradients

    # -- the active prepared dataloader (a stack: an eval loop may run inside a train loop) --

    def enter(self, loader: ActiveLoader) -> None:
        self._loaders.append(loader)

    def leave(self, loader: ActiveLoader) -> None:
        for index in range(len(self._loaders) - 1, -1, -1):
            if self._loaders[index] is loader:
                del self._loaders[index]
                return

    @property
    def active_dataloader(self) -> ActiveLoader | None:
        return self._loaders[-1] if self._loaders else None

    @property
    def in_dataloader(self) -> bool:
        return bool(self._loaders)

    @property
    def end_of_dataloader(self) -> bool:
        loader = self.active_dataloader
        return bool(loader is not None and loader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        loader = self.active_dataloader
        return loader.remainder if loader is not None else -1


def check_steps(value: object, name: str = "gradient_accumulation_steps") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be a whole number >= 1.")
    if value < 1:
        raise ValueError(f"{name}={value!r} must be >= 1 (1 means no accumulation).")
    return value
