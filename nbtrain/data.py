"""Prepared data loaders: each rank's share of the batches, on its device, resumable.

``prepare_data_loader`` rebuilds the user's DataLoader around a sharded batch sampler
(``sharding.py`` has the arithmetic), keeping its dataset, collate_fn, workers and pinning.

- Every rank draws the same order of samples (``shuffling.py``): by default the order follows
  the sampler's own generator, synchronised from rank 0 at each pass, so a seeded run on N
  ranks sees what one process would; with ``use_seedable_sampler`` it is seeded per epoch.
- The loader knows its position (epoch, batches handed out). ``load_state`` restores it, and the
  next ``for batch in loader`` continues right after the last batch the checkpoint had seen,
  without loading the skipped batches.
- ``end_of_dataloader`` turns True as the last batch is handed out (from the exact length when
  known, else by looking one batch ahead), which gradient accumulation and gather_for_metrics
  read through ``GradientState``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from . import nested, sharding
from .accumulation import GradientState
from .sharding import ShardSpec
from .shuffling import Shuffling

_WORKER_SEED_SALT = 0x5EED  # keeps the worker-seed stream apart from the shuffle stream


@dataclass
class Position:
    """Where a loader is in the run: epoch number and batches handed out in it."""

    epoch: int = 0
    yielded: int = 0
    in_progress: bool = False
    pinned: bool = False  # the next pass starts exactly at (epoch, yielded): a resume

    def start(self) -> tuple[int, int]:
        if self.pinned:
            self.pinned = False
        else:
            if self.in_progress:  # the previous pass was left early (break): a new epoch
                self.epoch += 1
            self.yielded = 0
        self.in_progress = True
        return self.epoch, self.yielded

    def finish(self) -> None:
        self.epoch += 1
        self.yielded = 0
        self.in_progress = False

    def next_epoch(self) -> int:
        return self.epoch + 1 if self.in_progress and not self.pinned else self.epoch

    def pin(self, epoch: int, yielded: int) -> None:
        self.epoch, self.yielded, self.pinned, self.in_progress = epoch, yielded, True, False


def _mix(seed: int, epoch: int) -> int:
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
        batches = sharding.shard_batches(self.batch_sampler, self.spec)
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


class _OneIndexBatches:
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


class PreparedDataLoader(DataLoader):
    """A DataLoader over this rank's share, moving batches to the device, resumable."""

    def __init__(
        self,
        loader: DataLoader,
        *,
        spec: ShardSpec,
        seed: int,
        device: torch.device | None,
        gradient_state: GradientState,
        shuffling: Shuffling | None = None,
    ) -> None:
        self.base_dataloader = loader
        self.device = device
        self.gradient_state = gradient_state
        self.spec = spec
        self.position = Position()
        self.end_of_dataloader = False
        self._seed = seed
        dataset = loader.dataset
        self._iterable = isinstance(dataset, IterableDataset)
        if shuffling is None:  # one process: nothing to agree on
            shuffling = Shuffling(seed, seedable=False, follow_user=True, share=None)
        seeding = _seeding_for(loader, shuffling)
        self._seeding = seeding
        # Worker seeds come from the loader's own generator when it follows the user's (as a
        # plain DataLoader draws them, before the order: same stream as one process); else from
        # a private one, seeded per epoch so a resumed pass gives its workers the same seeds.
        user = loader.generator if isinstance(loader.generator, torch.Generator) else None
        self._follows_user = user is not None and seeding.follow_user
        self._worker_generator: torch.Generator = (
            user if user is not None and self._follows_user else torch.Generator()
        )
        self._shard: ShardedBatchSampler | IterableShard
        options = _loader_options(loader, self._worker_generator)
        if self._iterable:
            self._shard = IterableShard(dataset, spec, seeding)  # type: ignore[arg-type]
            unbatched = loader.batch_size is None  # items as they come, one per rank and step
            size = None if unbatched else spec.rank_batch_size
            super().__init__(self._shard, batch_size=size, **options)
        else:
            batches = _batches_of(loader, seeding)
            self._shard = ShardedBatchSampler(
                batches,
                spec,
                seeding,
                _last_batch_size(loader),
                uniform=type(batches) in (BatchSampler, _OneIndexBatches),
            )
            if isinstance(loader.sampler, BatchSampler) and loader.batch_sampler is None:
                # sampler=BatchSampler(...), batch_size=None: each of its batches is one
                # dataset[list] lookup; whole batches go to the ranks.
                super().__init__(dataset, sampler=self._shard, batch_size=None, **options)
            elif loader.batch_size is None and loader.batch_sampler is None:
                super().__init__(
                    dataset, sampler=UnbatchedSampler(self._shard), batch_size=None, **options
                )
            else:
                super().__init__(dataset, batch_sampler=self._shard, **options)
        # DataLoader forbids setting these after __init__; they describe this rank's batches.
        object.__setattr__(self, "batch_size", spec.rank_batch_size)
        object.__setattr__(self, "drop_last", spec.drop_last)
        self.remainder = sharding.remainder(_sample_count(loader), spec)

    # -- Accelerate-compatible attributes ---------------------------------------------------

    @property
    def total_batch_size(self) -> int | None:
        return self.spec.step_size

    @property
    def total_dataset_length(self) -> int | None:
        return _length(self.base_dataloader.dataset)

    @property
    def iteration(self) -> int:
        """Completed passes over the data (Accelerate's name for the epoch counter)."""
        return self.position.epoch

    @property
    def seed(self) -> int:
        return self._seed

    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at ``epoch`` (keeps a resume position already in that epoch)."""
        position = self.position
        if position.epoch == epoch and (position.pinned or not position.in_progress):
            return  # the next pass already starts in this epoch (maybe at a resume position)
        position.pin(epoch, 0)

    def skip_first_batches(self, num_batches: int) -> PreparedDataLoader:
        """Start the next pass at batch ``num_batches`` (absolute: replaces a resume position)."""
        if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
            raise ValueError(
                f"skip_first_batches(num_batches={num_batches!r}) must be an int >= 0."
            )
        self.position.pin(self.position.next_epoch(), num_batches)
        return self

    # -- checkpointing -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        mid_pass = self.position.in_progress or self.position.pinned
        yielded = self.position.yielded if mid_pass else 0
        state: dict[str, Any] = {
            "epoch": self.position.epoch,
            "yielded": yielded,
            "seed": self._seed,
        }
        generator = self._seeding.state(mid_pass)
        if generator is not None:  # the order this pass was (or the next will be) drawn in
            state["generator"] = generator
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._seed = int(state["seed"])
        self._seeding.seed = self._seed
        self._seeding.restore(state.get("generator"))
        self.position.pin(int(state["epoch"]), int(state["yielded"]))

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        epoch, skip = self.position.start()
        if isinstance(self._shard, IterableShard):
            self._shard.configure(epoch, skip * (self.spec.rank_batch_size or 1))
            total = None
        else:
            self._shard.configure(epoch, skip)
            total = self._shard.exact_length()
        if not self._follows_user:
            self._worker_generator.manual_seed(_mix(self._seed ^ _WORKER_SEED_SALT, epoch))
        self.end_of_dataloader = False
        self.gradient_state.enter(self)
        try:
            batches = super().__iter__()
            if total is not None:
                yield from self._counted(batches, skip, total)
            else:
                yield from self._looking_ahead(batches, skip)
            self.position.finish()
        finally:
            self.end_of_dataloader = False
            self.gradient_state.leave(self)

    def _counted(self, batches: Iterator[Any], index: int, total: int) -> Iterator[Any]:
        for batch in batches:
            index += 1
            self.position.yielded = index
            self.end_of_dataloader = index >= total
            yield self._place(batch)

    def _looking_ahead(self, batches: Iterator[Any], index: int) -> Iterator[Any]:
        iterator = iter(batches)
        current = next(iterator, _NOTHING)
        while current is not _NOTHING:
            following = next(iterator, _NOTHING)
            index += 1
            self.position.yielded = index
            if following is _NOTHING:
                self._note_last_step()
                self.end_of_dataloader = True
            yield self._place(current)
            current = following

    def _note_last_step(self) -> None:
        shard = self._shard
        if isinstance(shard, IterableShard) and self.remainder == -1 and self.num_workers == 0:
            # The shard ran in this process and counted the real items of the last step.
            real = shard.last_step_real
            if real is not None:
                self.remainder = 0 if self.spec.drop_last else real

    def _place(self, batch: Any) -> Any:
        # DataLoader batches are CPU tensors already: on the CPU there is nothing to move.
        if self.device is None or self.device.type == "cpu":
            return batch
        return nested.send_to_device(batch, self.device, non_blocking=self.pin_memory)


_NOTHING = object()


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
        drop_last=_drop_last(loader),
        batch_size=_batch_size(loader),
    )
    dispatch = dispatch_with is not None and world_size > 1
    if dispatch and loader_class is not None:
        raise ValueError(
            "dataloader_config(dispatch_batches=True) is not supported on XLA: every ordinal "
            "loads its own batches there. Drop dispatch_batches."
        )
    shuffling = Shuffling(
        seed,
        seedable=seedable,
        follow_user=follow_user,
        share=share if world_size > 1 and not dispatch else None,  # (dispatching: one reader)
    )
    if dispatch:
        from .dispatch import DispatchingDataLoader

        return DispatchingDataLoader(
            loader,
            spec=spec,
            seed=seed,
            device=device,
            gradient_state=gradient_state,
            shuffling=shuffling,
            collectives=dispatch_with,
        )
    cls = loader_class or PreparedDataLoader  # a strategy's own subclass (XLA: step marks)
    return cls(
        loader,
        spec=spec,
        seed=seed,
        device=device,
        gradient_state=gradient_state,
        shuffling=shuffling,
    )


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


def _length(dataset: Any) -> int | None:
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


def _sample_count(loader: DataLoader) -> int | None:
    """Samples one epoch draws: the sampler's count (it may differ from len(dataset))."""
    if isinstance(loader.sampler, BatchSampler) and loader.batch_sampler is None:
        return _length(loader.dataset)
    if type(loader.batch_sampler) in (BatchSampler, type(None)):
        try:
            return len(loader.sampler)  # type: ignore[arg-type]
        except TypeError:  # an IterableDataset's sampler: fall back to the dataset
            pass
    return _length(loader.dataset)


def _batch_size(loader: DataLoader) -> int | None:
    if loader.batch_size is not None:
        return loader.batch_size
    batches = _batch_sampler(loader)
    if batches is None:  # batch_size=None: every sample is its own batch
        return 1
    size = getattr(batches, "batch_size", None)
    return size if isinstance(size, int) else None


def _drop_last(loader: DataLoader) -> bool:
    batches = _batch_sampler(loader)
    if batches is not None and loader.batch_size is None:
        return bool(getattr(batches, "drop_last", False))
    return bool(loader.drop_last)


def _last_batch_size(loader: DataLoader) -> int | None:
    size = _batch_size(loader)
    batches = _batch_sampler(loader)
    if size is None or _length(loader.dataset) is None:
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


def _loader_options(loader: DataLoader, generator: torch.Generator) -> dict[str, Any]:
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


def _seeding_for(loader: DataLoader, shuffling: Shuffling) -> Shuffling:
    """The loader's shuffling, with the dataset's own hooks: ``set_epoch``, and the generator
    an IterableDataset may shuffle with (kept equal across ranks, as the samplers' one)."""
    dataset = loader.dataset
    if hasattr(dataset, "set_epoch"):
        shuffling.hooks.append(dataset)
    generator = getattr(dataset, "generator", None)
    if isinstance(dataset, IterableDataset) and isinstance(generator, torch.Generator):
        shuffling.adopt(generator)
    return shuffling


def _batches_of(loader: DataLoader, seeding: Shuffling) -> Any:
    """A copy of the loader's batch sampler whose sampler draws from the shuffling's generator.

    Copies, so the user's own loader and samplers keep their behaviour (the generator itself is
    the user's in follow mode: that is what makes manual_seed on it take effect)."""
    batch_sampler = _batch_sampler(loader)
    if batch_sampler is None:
        return _OneIndexBatches(_seeded_copy(loader.sampler, seeding))
    if type(batch_sampler) is BatchSampler:
        sampler = _seeded_copy(batch_sampler.sampler, seeding)
        return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
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
