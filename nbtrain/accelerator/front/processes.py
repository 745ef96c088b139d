"""The Accelerator's calls across ranks: gather, reduce, broadcast, padding, barriers,
running on (or first on) some processes."""

from __future__ import annotations

import builtins
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from nbtrain.accelerator.comm import collectives, nested
from nbtrain.accelerator.comm.collectives import Op
from nbtrain.accelerator.data.splitting import share
from nbtrain.accelerator.front.base import AcceleratorBase

F = TypeVar("F", bound=Callable[..., Any])



class ProcessMethods(AcceleratorBase):
    """gather, gather_for_metrics, reduce, pad, broadcast, wait_for_everyone, on_*."""

    def set_trigger(self) -> None:
        """Raise this rank's flag; ``check_trigger()`` on every rank then returns True (e.g. to
        stop training everywhere when one rank decides to)."""
        self._trigger = 1

    def check_trigger(self) -> bool:
        """True on every rank when any rank called ``set_trigger()`` since the last True (the
        flags are then lowered). A collective: every rank must call it."""
        raised = self.reduce(torch.tensor([self._trigger], device=self._device), "sum")
        if int(raised.item()) >= 1:
            self._trigger = 0
            return True
        return False

    def gather(self, tensor: Any) -> Any:
        """Every rank's tensors concatenated along dim 0 (nested lists/tuples/dicts too).

        :param tensor: a tensor, or a nest of them, the same shape on every rank but for dim 0.
        :raises DistributedOperationException: a rank calls it alone, or with tensors that do not
            match the other ranks' (instead of a hang).
        """
        return self._collectives.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Like gather(), minus the samples repeated to even out the last batch, so a metric
        over a prepared dataloader sees exactly ``len(dataset)`` samples.

        Non-tensor data (e.g. lists of strings), or any data with ``use_gather_object=True``,
        is gathered as objects, as Accelerate does: one flat list of every rank's items (a
        tensor's rows), from which the duplicates are dropped alike.

        :param input_data: this rank's predictions, labels or any batch-shaped data.
        :param use_gather_object: gather as objects even for tensors.
        :raises DistributedOperationException: a rank calls it alone, or with tensors that do not
            match the other ranks' (instead of a hang).
        """
        leaves = nested.leaves(input_data)
        as_objects = use_gather_object or not all(isinstance(x, torch.Tensor) for x in leaves)
        if as_objects:
            gathered = self._collectives.gather_object(input_data)
        else:
            gathered = self._collectives.gather(input_data)
        state = self.gradient_state
        if state.end_of_dataloader and state.remainder > 0:
            return collectives.truncate_for_metrics(gathered, state.remainder, as_objects)
        return gathered

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum ("sum"), average ("mean"), "max" or "min" over the ranks, then multiply by
        ``scale`` (on every device; Accelerate applies ``scale`` on XLA only).

        :param tensor: a tensor, or a nest of them, of the same shape on every rank.
        :param reduction: "sum" (default), "mean", "max" or "min".
        :param scale: a factor applied after the reduction.
        :raises DistributedOperationException: a rank calls it alone, or with tensors that do not
            match the other ranks' (instead of a hang).
        """
        return self._collectives.reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        """Pad ``tensor`` (or a nest of tensors) along ``dim`` to the largest size any rank has, so
        that it can be gathered. Every rank must call it.

        :param tensor: a tensor, or a list, tuple or dict of them.
        :param dim: the dimension to pad.
        :param pad_index: the value padded with.
        :param pad_first: pad at the start instead of the end.
        :raises DistributedOperationException: a rank calls it alone, or with tensors of different
            numbers of dimensions.
        """
        return self._collectives.pad_across_processes(tensor, dim, pad_index, pad_first)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        """Rank ``from_process``'s ``tensor`` (or nest of tensors), on every rank. Every rank must
        call it with a tensor of the same shape.

        :param tensor: a tensor, or a list, tuple or dict of them.
        :param from_process: the rank whose values every rank gets.
        :raises DistributedOperationException: a rank calls it alone, or shapes differ.
        """
        return self._collectives.broadcast(tensor, from_process)

    def wait_for_everyone(self) -> None:
        """A barrier. Every rank must call it (not only the main process)."""
        self._collectives.barrier(Op.WAIT_FOR_EVERYONE)

    # ---------------------------------------------------------------------------------------
    # Main-process helpers

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print() on the local main process only."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first (e.g. to download or cache), then the others."""
        with self._goes_first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Context manager: the first rank of each machine runs the block first (e.g. to download to
        a disk of that machine), then the others of that machine."""
        with self._goes_first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _goes_first(self, first: bool) -> Iterator[None]:
        if not first:
            self._collectives.barrier(Op.MAIN_PROCESS_FIRST)
        yield
        if first:
            self._collectives.barrier(Op.MAIN_PROCESS_FIRST)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This rank's contiguous share of a list, tuple, tensor or dict of them.

        :param inputs: a list, tuple, tensor, or dict of them.
        :param apply_padding: repeat the last item so that every rank gets as many (then gather and
            drop the extras).
        """
        yield share(inputs, self.num_processes, self.process_index, apply_padding)

    def on_main_process(self, function: F | None = None) -> Any:
        """Decorator: run ``function`` on the main process only (None elsewhere)."""
        return self._on(lambda: self.is_main_process, function, "on_main_process")

    def on_local_main_process(self, function: F | None = None) -> Any:
        """Decorator: run ``function`` on the first rank of each machine only (None elsewhere).

        :param function: the function to decorate.
        """
        return self._on(lambda: self.is_local_main_process, function, "on_local_main_process")

    def on_last_process(self, function: F | None = None) -> Any:
        """Decorator: run ``function`` on the last rank only (None elsewhere).

        :param function: the function to decorate.
        """
        return self._on(lambda: self.is_last_process, function, "on_last_process")

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on rank ``process_index`` only (None elsewhere), e.g.
        ``@accelerator.on_process(process_index=1)``.

        :param function: the function to decorate.
        :param process_index: the rank that runs it.
        :raises TypeError: without ``process_index``.
        """
        if process_index is None:
            raise TypeError(
                "on_process() needs process_index=, e.g. @accelerator.on_process(process_index=1)."
            )
        return self._on(lambda: self.process_index == process_index, function, "on_process")

    def _on(self, condition: Callable[[], bool], function: Any, name: str) -> Any:
        def decorate(fn: F) -> F:
            if not callable(fn):
                raise TypeError(f"@accelerator.{name} decorates a function; got {fn!r}.")

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                return fn(*args, **kwargs) if condition() else None

            return run  # type: ignore[return-value]

        return decorate if function is None else decorate(function)

    # ---------------------------------------------------------------------------------------
    # Checkpoints and saving

