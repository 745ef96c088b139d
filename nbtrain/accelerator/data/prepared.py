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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from nbtrain.accelerator.comm import nested
from nbtrain.accelerator.data import sharding
from nbtrain.accelerator.data.batches import (
    WORKER_SEED_SALT,
    IterableShard,
    ShardedBatchSampler,
    UnbatchedSampler,
    batches_of,
    last_batch_size,
    length_of,
    loader_options,
    mix,
    sample_count,
    seeding_for,
    uniform_batches,
)
from nbtrain.accelerator.data.sharding import ShardSpec
from nbtrain.accelerator.data.shuffling import Shuffling
from nbtrain.accelerator.training.accumulation import GradientState

_NOTHING = object()


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


@dataclass(frozen=True)
class LoaderSetup:
    """What a prepared loader is made with besides the user's DataLoader (prepare_data_loader
    gathers it once; every kind of prepared loader takes it as it is)."""

    spec: ShardSpec
    seed: int
    device: torch.device | None
    gradient_state: GradientState
    shuffling: Shuffling


class PreparedDataLoader(DataLoader):
    """A DataLoader over this rank's share, moving batches to the device, resumable."""

    def _set_up(self, loader: DataLoader, setup: LoaderSetup) -> None:
        """What every prepared loader keeps (also the dispatching one, which builds its
        DataLoader differently)."""
        self.base_dataloader = loader
        self.device = setup.device
        self.gradient_state = setup.gradient_state
        self.spec = setup.spec
        self.position = Position()
        self.stop_point: Callable[[], None] | None = None  # called as each batch is asked for
        self.end_of_dataloader = False
        self._seed = setup.seed
        self._iterable = isinstance(loader.dataset, IterableDataset)
        self._seeding = seeding_for(loader, setup.shuffling)
        # Worker seeds come from the loader's own generator when it follows the user's (as a
        # plain DataLoader draws them, before the order: same stream as one process); else from
        # a private one, seeded per epoch so a resumed pass gives its workers the same seeds.
        user = loader.generator if isinstance(loader.generator, torch.Generator) else None
        self._follows_user = user is not None and self._seeding.follow_user
        self._worker_generator: torch.Generator = (
            user if user is not None and self._follows_user else torch.Generator()
        )

    def __init__(self, loader: DataLoader, setup: LoaderSetup) -> None:
        self._set_up(loader, setup)
        dataset, seeding, spec = loader.dataset, self._seeding, setup.spec
        self._shard: ShardedBatchSampler | IterableShard
        options = loader_options(loader, self._worker_generator)
        if self._iterable:
            self._shard = IterableShard(dataset, spec, seeding)  # type: ignore[arg-type]
            unbatched = loader.batch_size is None  # items as they come, one per rank and step
            size = None if unbatched else spec.rank_batch_size
            super().__init__(self._shard, batch_size=size, **options)
        else:
            batches = batches_of(loader, seeding)
            self._shard = ShardedBatchSampler(
                batches,
                spec,
                seeding,
                last_batch_size(loader),
                uniform=uniform_batches(batches),
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
        self._describe_rank_batches(loader)

    def _describe_rank_batches(self, loader: DataLoader) -> None:
        """After DataLoader.__init__ (which forbids setting these later): this rank's batches."""
        object.__setattr__(self, "batch_size", self.spec.rank_batch_size)
        object.__setattr__(self, "drop_last", self.spec.drop_last)
        self.remainder = sharding.remainder(sample_count(loader), self.spec)

    # -- Accelerate-compatible attributes ---------------------------------------------------

    @property
    def total_batch_size(self) -> int | None:
        return self.spec.step_size

    @property
    def total_dataset_length(self) -> int | None:
        return length_of(self.base_dataloader.dataset)

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

    @property
    def nbtrain_starts_at(self) -> int:
        """Batches of this epoch the next pass skips (a resume, skip_first_batches): progress()
        counts from there, so a resumed run's bar ends full ('200/200', not '148/200')."""
        return self.position.yielded if self.position.pinned else 0

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
            self._worker_generator.manual_seed(mix(self._seed ^ WORKER_SEED_SALT, epoch))
        self.end_of_dataloader = False
        self.gradient_state.enter(self)
        try:
            batches = super().__iter__()
            handed = (
                self._counted(batches, skip, total)
                if total is not None
                else self._looking_ahead(batches, skip)
            )
            if self.stop_point is not None:  # a stop policy (accelerator/checkpoint/stopping.py)
                handed = _with_stop_points(handed, self)
            yield from handed
            self.position.finish()
        finally:
            self.end_of_dataloader = False
            self.gradient_state.leave(self)

    def _counted(self, batches: Iterator[Any], index: int, total: int) -> Iterator[Any]:
        position = self.position
        for batch in batches:
            index += 1
            position.yielded = index
            if index >= total:  # (False since the pass began; DataLoader's __setattr__ is slow)
                self.end_of_dataloader = True
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


def _with_stop_points(batches: Iterator[Any], loader: PreparedDataLoader) -> Iterator[Any]:
    """Call the loader's stop point each time the loop asks for a batch, before the batch is
    taken: the position saved there is the batch about to be handed out. Not when the pass is
    over: the code after the loop (end-of-epoch work) has not run yet, and a resume there would
    start with an empty pass; the next pass's first batch is the next stop point."""
    point = loader.stop_point
    assert point is not None
    try:
        while True:
            if not loader.end_of_dataloader:
                point()
            batch = next(batches, _NOTHING)
            if batch is _NOTHING:
                return
            yield batch
    finally:
        close = getattr(batches, "close", None)  # a loop left early: end the pass now
        if close is not None:
            close()
