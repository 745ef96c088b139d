"""How the batches of a user's DataLoader are found, seeded and sharded: its samplers, batch
sampler and generator, as nbtrain reads them, and the samplers that hand each rank its share.

Shared by the prepared loader (prepared.py) and the dispatching one (dispatch.py).
"""


from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from nbtrain.accelerator.data import sharding
from nbtrain.accelerator.data.permuted import PermutedBatches, batched
from nbtrain.accelerator.data.sharding import ShardSpec
from nbtrain.accelerator.data.shuffling import Shuffling

WORKER_SEED_SALT = 0x5EED  # keeps the worker-seed stream apart from the shuffle stream


TORCH_BATCHES = (BatchSampler, PermutedBatches)  # batches torch makes: full but the last, new lists


def uniform_batches(batches: Any) -> bool:
    """Whether every batch but the last is full (torch's batches, or single indices): only then
    is a sharded length exact (see ShardedBatchSampler.uniform)."""
    return type(batches) in (*TORCH_BATCHES, OneIndexBatches)


def mix(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) % (2**63 - 1)


class ShardedBatchSampler(Sampler[list[int]]):
    """This rank's batches of the original batch sampler, for one epoch at a time."""

    def __init__(
        self,
        batch_sampler: Any,
        spec: ShardSpec,
        seeding: Shuffling,
        last_batch_size: int | None,
        uniform: bool = True,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.spec = spec
        self.seeding = seeding
        self.last_batch_size = last_batch_size
        # Whether every batch but the last is full (torch's BatchSampler). A custom batch
        # sampler may yield short batches mid-epoch, which cost their step (sharding._whole):
        # its length is then only an estimate, so the end of the epoch is found by looking ahead.
        self.uniform = uniform
        self.epoch = 0
        self.skip = 0

    @property
    def even_batches(self) -> bool:
        """Accelerate's BatchSamplerShard attribute (join_uneven_inputs overrides it)."""
        return self.spec.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.spec = dataclasses.replace(self.spec, even_batches=bool(value))

    def configure(self, epoch: int, skip: int) -> None:
        self.epoch, self.skip = epoch, skip

    def __iter__(self) -> Iterator[list[int]]:
        self.seeding.apply(self.epoch)
        # torch's BatchSampler makes a new list per batch: nothing to copy.
        fresh = type(self.batch_sampler) in TORCH_BATCHES
        batches = sharding.shard_batches(self.batch_sampler, self.spec, fresh)
        return itertools.islice(batches, self.skip, None) if self.skip else batches

    def exact_length(self) -> int | None:
        if not self.uniform and self.spec.world_size > 1:
            return None
        try:
            count = len(self.batch_sampler)
        except TypeError:
            return None
        length, exact = sharding.sharded_length(count, self.spec, self.last_batch_size)
        return length if exact else None

    def __len__(self) -> int:
        return sharding.sharded_length(len(self.batch_sampler), self.spec, self.last_batch_size)[0]


class UnbatchedSampler(Sampler[int]):
    """For DataLoader(batch_size=None): shard single indices as batches of one."""

    def __init__(self, sharded: ShardedBatchSampler) -> None:
        self.sharded = sharded

    def __iter__(self) -> Iterator[int]:
        return (batch[0] for batch in self.sharded)

    def __len__(self) -> int:
        return len(self.sharded)


class OneIndexBatches:
    """A sampler's indices as batches of one (the input of ShardedBatchSampler)."""

    batch_size = 1

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        return ([index] for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class IterableShard(IterableDataset):
    """Rank's share of an IterableDataset: from every step's worth of items, its slice."""

    def __init__(self, dataset: IterableDataset, spec: ShardSpec, seeding: Shuffling) -> None:
        self.dataset = dataset
        self.spec = spec
        self.seeding = seeding
        self.epoch = 0
        self.skip_items = 0
        self.last_step_real: int | None = None

    def configure(self, epoch: int, skip_items: int) -> None:
        self.epoch, self.skip_items = epoch, skip_items

    def __len__(self) -> int:
        """Items this rank gets per epoch (the wrapped dataset must have a length)."""
        spec = self.spec
        size, step = spec.rank_batch_size or 1, spec.step_size or 1
        full, rest = divmod(len(self.dataset), step)  # type: ignore[arg-type]
        count = full * size
        if rest and not spec.drop_last:
            count += size if spec.evens_out else min(max(rest - size * spec.rank, 0), size)
        return count

    def __iter__(self) -> Iterator[Any]:
        self.seeding.apply(self.epoch)
        self.last_step_real = None
        items = self._items()
        return itertools.islice(items, self.skip_items, None) if self.skip_items else items

    def _items(self) -> Iterator[Any]:
        spec = self.spec
        size, step = spec.rank_batch_size, spec.step_size
        assert size is not None and step is not None
        start = size * spec.rank
        first: list[Any] | None = None
        buffer: list[Any] = []
        for item in self.dataset:
            buffer.append(item)
            if len(buffer) == step:
                first = first or buffer
                yield from buffer[start : start + size]
                buffer = []
        self.last_step_real = len(buffer)
        if not buffer or spec.drop_last:
            return
        if spec.evens_out:
            source = itertools.cycle(first or list(buffer))
            buffer += list(itertools.islice(source, step - len(buffer)))
        yield from buffer[start : start + size]


def seed_source(loader: DataLoader) -> torch.Generator | None:
    """The generator whose draw seeds this loader's shuffling (the user's, else the global one)."""
    sampler = getattr(loader, "sampler", None)
    generator = getattr(sampler, "generator", None)
    if isinstance(generator, torch.Generator):
        return generator
    return loader.generator if isinstance(loader.generator, torch.Generator) else None


def draw_seed(generator: torch.Generator | None) -> int:
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


# ---------------------------------------------------------------------------------------------


def length_of(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def _batch_sampler(loader: DataLoader) -> Any:
    """The loader's batch sampler: ``batch_sampler=``, or ``sampler=`` when that is a
    BatchSampler used with ``batch_size=None`` (each of its batches one dataset lookup)."""
    if loader.batch_sampler is None and isinstance(loader.sampler, BatchSampler):
        return loader.sampler
    return loader.batch_sampler


def sample_count(loader: DataLoader) -> int | None:
    """Samples one epoch draws: the sampler's count (it may differ from len(dataset))."""
    if isinstance(loader.sampler, BatchSampler) and loader.batch_sampler is None:
        return length_of(loader.dataset)
    if type(loader.batch_sampler) in (BatchSampler, type(None)):
        try:
            return len(loader.sampler)  # type: ignore[arg-type]
        except TypeError:  # an IterableDataset's sampler: fall back to the dataset
            pass
    return length_of(loader.dataset)


def batch_size_of(loader: DataLoader) -> int | None:
    if loader.batch_size is not None:
        return loader.batch_size
    batches = _batch_sampler(loader)
    if batches is None:  # batch_size=None: every sample is its own batch
        return 1
    size = getattr(batches, "batch_size", None)
    return size if isinstance(size, int) else None


def drop_last_of(loader: DataLoader) -> bool:
    batches = _batch_sampler(loader)
    if batches is not None and loader.batch_size is None:
        return bool(getattr(batches, "drop_last", False))
    return bool(loader.drop_last)


def last_batch_size(loader: DataLoader) -> int | None:
    size = batch_size_of(loader)
    batches = _batch_sampler(loader)
    if size is None or length_of(loader.dataset) is None:
        return None
    sampler = loader.sampler
    if batches is not None:
        if type(batches) is not BatchSampler:
            return None
        sampler = batches.sampler
    try:
        samples = len(sampler)  # type: ignore[arg-type]  # a sampler may draw more or fewer than len(dataset)
    except TypeError:
        return None
    return samples % size or size


def loader_options(loader: DataLoader, generator: torch.Generator) -> dict[str, Any]:
    options: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": _worker_context(loader),
        "generator": generator,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        options["prefetch_factor"] = loader.prefetch_factor
    if getattr(loader, "pin_memory_device", ""):
        options["pin_memory_device"] = loader.pin_memory_device
    if hasattr(loader, "in_order"):
        options["in_order"] = loader.in_order
    return options


def _worker_context(loader: DataLoader) -> Any:
    """Workers start the way a plain Linux script starts them: by fork.

    A rank started by spawn or forkserver inherits that start method as its default, so its
    DataLoader workers would have to pickle the dataset by reference, and a Dataset class defined
    in a notebook cannot be found that way ("Can't get attribute ..."). Fork needs no pickling.
    The user's own choice (multiprocessing_context=...) is kept; macOS keeps its spawn default.
    """
    chosen = loader.multiprocessing_context
    if chosen is not None or loader.num_workers == 0 or not sys.platform.startswith("linux"):
        return chosen
    return "fork"


def seeding_for(loader: DataLoader, shuffling: Shuffling) -> Shuffling:
    """The loader's shuffling, with the dataset's own hooks: ``set_epoch``, and the generator
    an IterableDataset may shuffle with (kept equal across ranks, as the samplers' one)."""
    dataset = loader.dataset
    if hasattr(dataset, "set_epoch"):
        shuffling.hooks.append(dataset)
    generator = getattr(dataset, "generator", None)
    if isinstance(dataset, IterableDataset) and isinstance(generator, torch.Generator):
        shuffling.adopt(generator)
    return shuffling


def batches_of(loader: DataLoader, seeding: Shuffling) -> Any:
    """A copy of the loader's batch sampler whose sampler draws from the shuffling's generator.

    Copies, so the user's own loader and samplers keep their behaviour (the generator itself is
    the user's in follow mode: that is what makes manual_seed on it take effect)."""
    batch_sampler = _batch_sampler(loader)
    if batch_sampler is None:
        return OneIndexBatches(_seeded_copy(loader.sampler, seeding))
    if type(batch_sampler) is BatchSampler:
        sampler = _seeded_copy(batch_sampler.sampler, seeding)
        return batched(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    custom: Any = copy.copy(batch_sampler)
    inner = getattr(custom, "sampler", None)
    if inner is not None:
        with contextlib.suppress(AttributeError):  # read-only: keep the user's sampler
            custom.sampler = _seeded_copy(inner, seeding)
    if hasattr(custom, "set_epoch"):
        seeding.hooks.append(custom)
    return custom


def _seeded_copy(sampler: Any, seeding: Shuffling) -> Any:
    """A sampler with a ``generator`` (RandomSampler, SubsetRandomSampler, WeightedRandomSampler,
    ...) draws from the shuffling's; one with ``set_epoch`` is told the epoch."""
    seeded = copy.copy(sampler)
    if hasattr(seeded, "generator"):
        seeded.generator = seeding.adopt(seeded.generator)
    if hasattr(seeded, "set_epoch"):
        seeding.hooks.append(seeded)
    return seeded


class SkippedLoader:
    """A plain (unprepared) loader whose iteration starts at batch ``skip``."""

    def __init__(self, loader: Any, skip: int) -> None:
        if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
            raise ValueError(f"skip_first_batches(num_batches={skip!r}) must be an int >= 0.")
        self.loader = loader
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.loader), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.loader) - self.skip, 0)
