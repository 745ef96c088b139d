"""Prepared optimizers and LR schedulers: they act only when gradients are synchronised.

Under gradient accumulation the user's loop calls ``optimizer.step()``, ``zero_grad()`` and
``scheduler.step()`` on every micro-step; these wrappers make the non-final ones no-ops (as
Accelerate does), route the fp16 grad scaler, and skip the scheduler when the scaler skipped the
optimizer step (inf/NaN gradients).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nbtrain.accelerator.training.accumulation import GradientState
from nbtrain.rank.reporting import optimizer_stepped


class PreparedOptimizer(torch.optim.Optimizer):
    """Wraps the user's optimizer; an ``Optimizer`` subclass so schedulers accept it.

    Deliberately does not call ``Optimizer.__init__``: state, param_groups and defaults are the
    wrapped optimizer's own objects, shared, not copies."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_state: GradientState,
        scaler: torch.amp.GradScaler | None,
    ) -> None:
        self.optimizer = optimizer
        self.gradient_state = gradient_state
        self.scaler = scaler
        self.step_was_skipped = False
        self._unscaled = False

    # -- the wrapped optimizer's own data ---------------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def register_step_pre_hook(self, hook: Callable[..., Any]) -> Any:
        return self.optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Callable[..., Any]) -> Any:
        return self.optimizer.register_step_post_hook(hook)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper lacks (e.g. schedule-free `train()`/`eval()`).
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"PreparedOptimizer({self.optimizer!r})"

    # -- acting only on synchronised steps ----------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if not self.gradient_state.sync_gradients:
            return None
        result = None
        if self.scaler is None:
            result = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
            self.step_was_skipped = False
        else:
            before = self.scaler.get_scale()
            result = (
                self.scaler.step(self.optimizer, closure)
                if closure
                else self.scaler.step(self.optimizer)
            )
            self.scaler.update()
            # The scaler lowers its scale exactly when it found inf/NaN and skipped the step.
            self.step_was_skipped = self.scaler.get_scale() < before
        self._unscaled = False
        if not self.step_was_skipped:
            optimizer_stepped(self)  # the live view's rate counts optimizer steps
        return result

    def unscale_gradients(self) -> None:
        """Divide the gradients by the fp16 loss scale, once per step (clipping needs it)."""
        if self.scaler is not None and not self._unscaled:
            self.scaler.unscale_(self.optimizer)
            self._unscaled = True


class PreparedScheduler:
    """Steps the wrapped LR scheduler in step with the optimizer, as Accelerate does.

    Without ``split_batches`` each rank sees 1/N of the batches, so one optimizer step covers N
    of the single-process steps a schedule is usually written for: the scheduler advances N
    times (stopping at OneCycleLR's total_steps)."""

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[PreparedOptimizer],
        gradient_state: GradientState,
        *,
        num_processes: int,
        split_batches: bool,
        step_with_optimizer: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.gradient_state = gradient_state
        self.num_processes = num_processes
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return
        if any(optimizer.step_was_skipped for optimizer in self.optimizers):
            return
        for _ in range(1 if self.split_batches else self.num_processes):
            total = getattr(self.scheduler, "total_steps", None)
            if total is not None and self.scheduler.last_epoch >= total:
                return  # OneCycleLR refuses steps beyond total_steps
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"PreparedScheduler({self.scheduler!r})"
