"""``prepare_data_loader``: a user's DataLoader made into the loader each rank iterates: the
prepared loader (prepared.py), a strategy's subclass of it (XLA), or the dispatching one (dispatch)
when the main process reads for every rank."""


from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from nbtrain.accelerator.data.batches import batch_size_of, drop_last_of
from nbtrain.accelerator.data.prepared import LoaderSetup, PreparedDataLoader
from nbtrain.accelerator.data.sharding import ShardSpec
from nbtrain.accelerator.data.shuffling import Shuffling
from nbtrain.accelerator.training.accumulation import GradientState


def prepare_data_loader(
    loader: DataLoader,
    *,
    world_size: int,
    rank: int,
    split_batches: bool,
    even_batches: bool,
    seed: int,
    device: torch.device | None,
    gradient_state: GradientState,
    loader_class: type[PreparedDataLoader] | None = None,
    seedable: bool = False,
    follow_user: bool = True,
    share: Any = None,
    dispatch_with: Any = None,
) -> PreparedDataLoader:
    """``dispatch_with``: the collectives through which the main process sends every rank its
    batches (dataloader_config(dispatch_batches=True), see dispatch.py)."""
    if isinstance(loader, PreparedDataLoader):
        return loader
    spec = ShardSpec(
        world_size=world_size,
        rank=rank,
        split_batches=split_batches,
        even_batches=even_batches,
        drop_last=drop_last_of(loader),
        batch_size=batch_size_of(loader),
    )
    dispatch = _dispatches(dispatch_with, world_size, loader_class)
    shuffling = Shuffling(
        seed,
        seedable=seedable,
        follow_user=follow_user,
        share=share if world_size > 1 and not dispatch else None,  # (dispatching: one reader)
    )
    setup = LoaderSetup(spec, seed, device, gradient_state, shuffling)
    if dispatch:
        from nbtrain.accelerator.data.dispatch import DispatchingDataLoader

        return DispatchingDataLoader(loader, setup, dispatch_with)
    # A strategy's own subclass (XLA: step marks), else the plain prepared loader.
    return (loader_class or PreparedDataLoader)(loader, setup)


def _dispatches(
    dispatch_with: Any, world_size: int, loader_class: type[PreparedDataLoader] | None
) -> bool:
    """Whether the main process reads for every rank (one rank reads for itself anyway)."""
    dispatch = dispatch_with is not None and world_size > 1
    if dispatch and loader_class is not None:
        raise ValueError(
            "dataloader_config(dispatch_batches=True) is not supported on XLA: every ordinal "
            "loads its own batches there. Drop dispatch_batches."
        )
    return dispatch
