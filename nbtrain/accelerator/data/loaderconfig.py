"""``Accelerator(dataloader_config=...)``: how prepared dataloaders shard, shuffle and dispatch.

Accelerate's DataLoaderConfiguration objects are accepted as they are (read field by field at
each ``prepare()``, so ``accelerator.dataloader_config = ...`` afterwards takes effect, as in
Accelerate); nbtrain's own class below has the same fields for code without Accelerate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from nbtrain.accelerator.comm.collectives import Collectives
from nbtrain.accelerator.data import batches


@dataclass
class DataLoaderConfiguration:
    """Accelerate's fields. ``dispatch_batches=True``: the main process loads every batch and
    sends each rank its share (for streams that must be read once); ``use_seedable_sampler``:
    each epoch's order is drawn from ``data_seed + epoch``. ``non_blocking`` and
    ``use_stateful_dataloader`` need nothing: prepared loaders are always resumable.

    :param split_batches: split each batch across the ranks instead of each rank loading whole
        batches.
    :param even_batches: complete the last batches so that every rank gets as many (default True).
    :param dispatch_batches: see above.
    :param use_seedable_sampler: see above.
    :param data_seed: the seed of the seedable sampler.
    :param non_blocking: accepted (above).
    :param use_stateful_dataloader: accepted (above).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass(frozen=True)
class LoaderOptions:
    split_batches: bool
    even_batches: bool
    dispatch_batches: bool
    seedable: bool
    data_seed: int | None


def make(config: Any, split_batches: bool, even_batches: bool) -> Any:
    """The configuration to keep: the user's object, else one from the plain arguments."""
    if config is None:
        return DataLoaderConfiguration(split_batches=split_batches, even_batches=even_batches)
    options(config, False, True)  # bad fields fail in the constructor, not at prepare()
    return config


def options(config: Any, split_arg: bool, even_arg: bool) -> LoaderOptions:
    """The fields in force; a constructor argument that differs from its default wins."""
    seed = getattr(config, "data_seed", None)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"DataLoaderConfiguration(data_seed={seed!r}) must be an int or None.")
    return LoaderOptions(
        split_batches=split_arg or bool(getattr(config, "split_batches", False)),
        even_batches=even_arg and bool(getattr(config, "even_batches", True)),
        dispatch_batches=bool(getattr(config, "dispatch_batches", None)),
        seedable=bool(getattr(config, "use_seedable_sampler", False)),
        data_seed=seed,
    )


def agree_on_seed(loader: DataLoader, opts: LoaderOptions, collectives: Collectives) -> int:
    """The seed of a loader's private generator (used when its sampler has none, or in seedable
    mode), the same on every rank: ``data_seed``; else in seedable mode rank 0's
    ``torch.initial_seed()`` (Accelerate's SeedableRandomSampler default); else rank 0's draw.
    Every rank draws, so every rank's RNG advances alike whichever value wins."""
    drawn = batches.draw_seed(batches.seed_source(loader))
    initial, drawn = collectives.broadcast_object((torch.initial_seed(), drawn), 0)
    if opts.data_seed is not None:
        return int(opts.data_seed)
    return int(initial) if opts.seedable else int(drawn)
