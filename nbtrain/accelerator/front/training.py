"""The Accelerator's training step: backward, accumulation and sync control, precision,
gradient clipping."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch import nn

from nbtrain.accelerator.front.base import PREPARED_MODELS, AcceleratorBase
from nbtrain.accelerator.training.accumulation import GradientState
from nbtrain.accelerator.training.optim import PreparedOptimizer

F = TypeVar("F", bound=Callable[..., Any])



class TrainingStep(AcceleratorBase):
    """backward, accumulate, no_sync, join_uneven_inputs, autocast, clip_grad_*."""

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` divided by the accumulation steps and scaled for fp16."""
        if not self._models and not self._optimizers and not PREPARED_MODELS:
            raise RuntimeError(
                "accelerator.backward() was called before accelerator.prepare(): prepare the "
                "model and optimizer first (model, optimizer, loader = accelerator.prepare(model, "
                "optimizer, loader)), so gradients are synchronised across ranks and scaled for "
                "mixed precision."
            )
        if self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        scaler = self._precision.scaler
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def accumulate(self, *models: nn.Module) -> contextlib.AbstractContextManager[None]:
        """One micro-step: gradients sync (and optimizers step) only on the last of each
        ``gradient_accumulation_steps``, and on the last batch of the dataloader."""
        return MicroStep(self.gradient_state, self._strategy, models)

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Skip the gradient all-reduce for forward/backward passes inside the block.

        :param model: a prepared model.
        """
        with self._strategy.no_sync(model):
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        """Make the next backward inside the block all-reduce the gradients, although the
        forward ran under ``no_sync`` (several forwards, one synchronising backward).

        :param model: a prepared model.
        """
        trigger = getattr(self._strategy, "trigger_sync", None)
        with trigger(model) if trigger is not None else contextlib.nullcontext():
            yield

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager[Any]:
        """Context manager: the block runs under autocast to this Accelerator's mixed precision (a
        no-op with ``mixed_precision='no'``). Prepared models do it for their forward already; use
        it for computations outside them.

        :param autocast_handler: an ``AutocastKwargs`` with autocast's options (e.g.
            ``cache_enabled``).
        """
        return self._precision.autocast(autocast_handler)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Undo the fp16 loss scale on the gradients (once per step; clipping does it for you).

        :param optimizer: a prepared optimizer, or a list of them (default: every prepared
            optimizer).
        """
        chosen: list[Any] | tuple[Any, ...]
        if optimizer is None:
            chosen = self._optimizers
        else:
            chosen = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        for item in chosen:
            if isinstance(item, PreparedOptimizer):
                item.unscale_gradients()

    def clip_grad_norm_(
        self,
        parameters: Iterable[torch.Tensor] | torch.Tensor,
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor:
        """Clip the full gradient: only when gradients are synchronised (acc #641).

        On a non-final accumulation micro-step the partial gradients are left alone (clipping
        them, or unscaling them for fp16, would be wrong) and their current norm is returned.
        Intentional difference: Accelerate 1.15 clips on every call (the partial gradients; and
        under fp16 its second unscale raises), so its docs wrap the call in
        ``if accelerator.sync_gradients:``, which gives the same result here.

        :param parameters: the model's parameters (``model.parameters()``), or one tensor.
        :param max_norm: the largest total norm allowed.
        :param norm_type: the norm's order (2: Euclidean; ``inf``: the largest value).
        :returns: the total norm of the gradients before clipping.
        """
        params = _parameter_list(parameters)
        if not self.sync_gradients:
            return self._gradient_norm(params, norm_type)
        self.unscale_gradients()
        self._average_gradients(params)
        clip = getattr(self._strategy, "clip_grad_norm", None)  # FSDP: the norm over all shards
        if clip is not None:
            return clip(params, max_norm, norm_type)
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)

    def clip_grad_value_(
        self, parameters: Iterable[torch.Tensor] | torch.Tensor, clip_value: float
    ) -> None:
        """Clamp gradients to [-clip_value, clip_value], when gradients are synchronised (not
        on non-final accumulation micro-steps, unlike Accelerate 1.15: see clip_grad_norm_).

        :param parameters: the model's parameters (``model.parameters()``), or one tensor.
        :param clip_value: the largest absolute value allowed.
        """
        if not self.sync_gradients:
            return
        self.unscale_gradients()
        params = _parameter_list(parameters)
        self._average_gradients(params)
        torch.nn.utils.clip_grad_value_(params, clip_value)

    def _average_gradients(self, params: list[torch.Tensor]) -> None:
        """Clipping acts on the gradient every rank steps with: DDP has averaged it in backward,
        but XLA averages at the optimizer step, so its strategy averages these ones first."""
        average = getattr(self._strategy, "reduce_gradients", None)
        if average is not None:
            average(params)

    def _gradient_norm(self, params: list[torch.Tensor], norm_type: float) -> torch.Tensor:
        grads = [p.grad.detach() for p in params if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self._device)
        norms = torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads])
        norm = torch.linalg.vector_norm(norms, norm_type)
        scaler = self._precision.scaler
        return norm / scaler.get_scale() if scaler is not None else norm

    # ---------------------------------------------------------------------------------------
    # Collectives


class MicroStep(contextlib.ContextDecorator):
    """One ``accumulate()`` block. A small class rather than a generator context manager: it
    runs every step, and a synchronising step (the usual one) only decides the flag."""

    __slots__ = ("_models", "_stack", "_state", "_strategy")

    def __init__(self, state: GradientState, strategy: Any, models: tuple[nn.Module, ...]) -> None:
        self._state = state
        self._strategy = strategy
        self._models = models
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> None:
        state = self._state
        if state.begin_micro_step() or state.sync_each_batch or not self._models:
            return
        with contextlib.ExitStack() as stack:  # (a no_sync that fails leaves the others)
            for model in self._models:
                stack.enter_context(self._strategy.no_sync(model))
            self._stack = stack.pop_all()

    def __exit__(self, *exc_info: Any) -> bool:
        stack, self._stack = self._stack, None
        return bool(stack.__exit__(*exc_info)) if stack is not None else False


def _parameter_list(parameters: Iterable[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    return list(parameters)


