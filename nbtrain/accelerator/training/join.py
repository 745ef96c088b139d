"""``accelerator.join_uneven_inputs``: DDP training over ranks that run out of batches at
different steps (``even_batches=False``, or loaders of different lengths).

torch's ``Join`` context lets the ranks that finished early shadow the collective calls of DDP
(gradient all-reduce, buffer broadcast) until every rank is done, so the others do not hang.
Inside the block the prepared map-style loaders may switch ``even_batches`` (restored on exit),
as Accelerate documents. nbtrain joins on CPU (gloo) ranks too (Accelerate only on GPUs); XLA
has no Join: there the block runs as it is, with a warning.

Only DDP's own collectives are shadowed: a gather or a barrier inside the block must still be
reached by every rank (nbtrain's collectives name the missing call rather than hang).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from nbtrain.accelerator.training.parallel import DistributedType

_DDP_TYPES = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


@contextlib.contextmanager
def join_uneven_inputs(
    joinables: list[Any],
    *,
    distributed_type: DistributedType,
    world_size: int,
    loaders: list[Any],
    default_even_batches: bool,
    even_batches: bool | None = None,
) -> Iterator[None]:
    if not isinstance(joinables, (list, tuple)):
        raise TypeError(
            f"join_uneven_inputs(joinables={joinables!r}) takes a list of prepared models, e.g. "
            "accelerator.join_uneven_inputs([model])."
        )
    if even_batches is not None and not isinstance(even_batches, bool):
        raise TypeError(f"join_uneven_inputs(even_batches={even_batches!r}) must be a bool.")
    if world_size == 1 or distributed_type not in _DDP_TYPES:
        if world_size > 1:
            warnings.warn(
                f"Joining uneven inputs is only supported for multi-GPU and multi-CPU training "
                f"(DistributedDataParallel), not {distributed_type.value}: join_uneven_inputs() "
                "runs the block without joining.",
                UserWarning,
                stacklevel=3,
            )
        yield
        return
    from torch.distributed.algorithms.join import Join

    with _overridden_even_batches(loaders, even_batches):
        even = default_even_batches if even_batches is None else even_batches
        # Every rank has as many batches with even_batches: nothing to join (Accelerate's rule).
        with Join(list(joinables), enable=not even, throw_on_early_termination=False):
            yield


@contextlib.contextmanager
def _overridden_even_batches(loaders: list[Any], even_batches: bool | None) -> Iterator[None]:
    saved: list[tuple[Any, bool]] = []
    if even_batches is not None:
        samplers = [getattr(loader, "batch_sampler", None) for loader in loaders]
        for sampler in samplers:
            if sampler is not None and hasattr(sampler, "even_batches"):
                saved.append((sampler, sampler.even_batches))
                sampler.even_batches = even_batches
        if len(saved) < len(loaders):
            warnings.warn(
                "Overriding even_batches is only supported for map-style datasets, yet some "
                "dataloaders given were iterable: those keep their even_batches.",
                UserWarning,
                stacklevel=4,
            )
    try:
        yield
    finally:
        for sampler, value in saved:
            sampler.even_batches = value
