"""``dispatch_batches=True``: the main process loads every batch and sends each rank its share.

For data that must be read once (a stream, a generator, a file cursor) or that only the main
process can reach. Each rank receives exactly what it would have loaded itself with
``dispatch_batches=False``: the same sharding (``sharding.shard_batches``: batch i of a step to
rank i % world, or each batch cut in ``world`` slices with split_batches; even_batches' padding
from the epoch's start), applied on the main process to the *rows* of the loaded batches. Batches
must be (nested lists / tuples / dicts of) tensors sharing their first dimension.

Per step, the main process broadcasts one small header (every rank's batch structure, shapes
and dtypes; whether the step is the epoch's last) through nbtrain's checked collectives, then
sends each rank its tensors point to point (torch.distributed isend/recv). A rank without a
batch in the last step (even_batches=False) stops there, as it would without dispatching.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from nbtrain.accelerator.comm import nested
from nbtrain.accelerator.comm.collectives import Collectives
from nbtrain.accelerator.data import prepared as data
from nbtrain.accelerator.data import sharding
from nbtrain.accelerator.data.batches import (
    batches_of,
    last_batch_size,
    loader_options,
    uniform_batches,
)
from nbtrain.accelerator.data.sharding import ShardSpec
from nbtrain.accelerator.data.shuffling import Shuffling

Row = tuple[int, int]  # (batch number in the epoch, row in that batch)


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype


class EpochBatches(Sampler[list[int]]):
    """The loader's own batches (unsharded), with the shuffling applied before each pass."""

    def __init__(self, batches: Any, seeding: Shuffling) -> None:
        self.batches = batches
        self.seeding = seeding
        self.epoch = 0

    def __iter__(self) -> Iterator[list[int]]:
        self.seeding.apply(self.epoch)
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class Dispatched(IterableDataset):
    """This rank's batches, loaded by the main process (the ``_shard`` of a dispatching
    PreparedDataLoader: ``configure`` and ``exact_length`` as ShardedBatchSampler's)."""

    def __init__(
        self,
        source: DataLoader,
        spec: ShardSpec,
        collectives: Collectives,
        epoch_batches: EpochBatches | None,
        seeding: Shuffling,
        uniform: bool,
    ) -> None:
        self.source = source  # the loader the main process reads
        self.spec = spec
        self.collectives = collectives
        self.epoch_batches = epoch_batches
        self.seeding = seeding
        self.uniform = uniform
        self.epoch = 0
        self.skip = 0
        self.remainder: int | None = None  # real samples in the last step, once known
        self.last_batch_size: int | None = None  # of the loader (split_batches' lengths)

    def configure(self, epoch: int, skip: int) -> None:
        self.epoch, self.skip = epoch, skip

    def exact_length(self) -> int | None:
        if not self.uniform:
            return None
        try:
            count = len(self.source)
        except TypeError:
            return None
        length, exact = sharding.sharded_length(count, self.spec, self.last_batch_size)
        return length if exact else None

    def __len__(self) -> int:
        return sharding.sharded_length(len(self.source), self.spec, self.last_batch_size)[0]

    def __iter__(self) -> Iterator[Any]:
        rank = self.spec.rank
        steps = self._steps() if rank == 0 else None
        for index in itertools.count():
            header = steps and next(steps, None)
            header = self.collectives.broadcast_object(header, 0)
            if header is None:
                return
            metas, last, remainder = header
            batch = self._exchange(metas)
            if batch is None:  # no batch for this rank in the last step
                return
            if index >= self.skip:
                yield batch
            if last:
                self.remainder = remainder
                return

    # -- main process ---------------------------------------------------------------------------

    def _steps(self) -> Iterator[tuple[list[Any], bool, int]]:
        """(every rank's batch or TensorMeta structure, last step?, real samples of the epoch's
        last step); the rank batches of a step are kept in ``self._outgoing``."""
        if self.epoch_batches is not None:
            self.epoch_batches.epoch = self.epoch
        else:
            self.seeding.apply(self.epoch)  # (an IterableDataset's set_epoch)
        loaded = _Loaded(iter(self.source))
        world = self.spec.world_size
        shares = [
            sharding.shard_batches(stream, _spec_for(self.spec, rank))
            for rank, stream in enumerate(itertools.tee(loaded.rows(), world))
        ]
        current = _next_step(shares, loaded)
        while current is not None:
            following = _next_step(shares, loaded)
            self._outgoing = current
            metas = [None if b is None else _meta(b) for b in current]
            last = following is None
            yield metas, last, self._remainder(loaded.samples) if last else -1
            current = following

    def _remainder(self, samples: int) -> int:
        if self.spec.drop_last or self.spec.step_size is None:
            return 0
        return samples % self.spec.step_size

    # -- every rank -----------------------------------------------------------------------------

    def _exchange(self, metas: list[Any]) -> Any:
        """Main: send each rank its tensors; others: receive theirs."""
        import torch.distributed as dist

        device = self.collectives.device
        if self.spec.rank == 0:
            pending = []
            for rank, batch in enumerate(self._outgoing[1:], start=1):
                if batch is not None:
                    for leaf in nested.leaves(batch):
                        pending.append(dist.isend(leaf.to(device).contiguous(), dst=rank))
            for work in pending:
                if work is not None:
                    work.wait()
            return self._outgoing[0]
        mine = metas[self.spec.rank]
        if mine is None:
            return None
        received = []
        for meta in nested.leaves(mine):
            buffer = torch.empty(meta.shape, dtype=meta.dtype, device=device)
            dist.recv(buffer, src=0)
            received.append(buffer)
        return nested.rebuild(mine, received)


class _Loaded:
    """The main process's loaded batches, kept while a step may still take rows from them (the
    epoch's first batches, for even_batches' padding, stay until the epoch ends)."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self.batches = batches
        self.cache: dict[int, tuple[Any, list[torch.Tensor]]] = {}
        self.samples = 0

    def rows(self) -> Iterator[list[Row]]:
        for number, batch in enumerate(self.batches):
            leaves = _tensor_leaves(batch)
            size = leaves[0].shape[0]
            self.cache[number] = (batch, leaves)
            self.samples += size
            yield [(number, row) for row in range(size)]

    def gather(self, rows: list[Row]) -> Any:
        """A rank's batch: these rows of the loaded batches, concatenated."""
        structure, first = self.cache[rows[0][0]]
        parts: list[list[torch.Tensor]] = [[] for _ in first]
        for number, start, length in _runs(rows):
            for index, leaf in enumerate(self.cache[number][1]):
                parts[index].append(leaf[start : start + length])
        return nested.rebuild(structure, [torch.cat(p) if len(p) > 1 else p[0] for p in parts])

    def forget_before(self, number: int, keep: int) -> None:
        for key in [k for k in self.cache if keep <= k < number]:
            del self.cache[key]


def _runs(rows: list[Row]) -> Iterator[tuple[int, int, int]]:
    """(batch, first row, length) of each run of consecutive rows of one batch."""
    start = 0
    while start < len(rows):
        number, first = rows[start]
        end = start + 1
        while end < len(rows) and rows[end] == (number, first + end - start):
            end += 1
        yield number, first, end - start
        start = end


def _next_step(shares: list[Iterator[list[Row]]], loaded: _Loaded) -> list[Any] | None:
    """Every rank's batch of the next step (None for a rank without one), or None at the end."""
    step = [next(share, None) for share in shares]
    if all(rows is None for rows in step):
        return None
    batches = [None if rows is None else loaded.gather(rows) for rows in step]
    newest = max(rows[-1][0] for rows in step if rows)
    loaded.forget_before(newest, keep=len(shares))  # (the first `world` batches: padding)
    return batches


def _spec_for(spec: ShardSpec, rank: int) -> ShardSpec:
    import dataclasses

    return dataclasses.replace(spec, rank=rank)


def _tensor_leaves(batch: Any) -> list[torch.Tensor]:
    leaves = nested.leaves(batch)
    if not leaves or not all(isinstance(x, torch.Tensor) and x.ndim >= 1 for x in leaves):
        kinds = sorted({type(x).__name__ for x in leaves})
        raise TypeError(
            "dataloader_config(dispatch_batches=True) sends batches of tensors (nested lists, "
            f"tuples, dicts of tensors with a batch dimension); this loader's batches hold "
            f"{', '.join(kinds) or 'nothing'}. Collate them into tensors, or use "
            "dispatch_batches=False (every rank loads its own batches)."
        )
    sizes = {leaf.shape[0] for leaf in leaves}
    if len(sizes) > 1:
        raise ValueError(
            f"dispatch_batches=True cuts batches along their first dimension, but this batch's "
            f"tensors have first dimensions {sorted(sizes)}. Make them agree, or use "
            "dispatch_batches=False."
        )
    return leaves


def _meta(batch: Any) -> Any:
    return nested.rebuild(
        batch, [TensorMeta(tuple(leaf.shape), leaf.dtype) for leaf in nested.leaves(batch)]
    )


def main_loader(
    loader: DataLoader, epoch_batches: EpochBatches | None, options: dict[str, Any]
) -> DataLoader:
    """What the main process reads: an IterableDataset's loader as it is; a map-style dataset
    through the loader's (copied, seeded) batch sampler, unsharded."""
    if epoch_batches is None:
        return loader
    if isinstance(loader.sampler, BatchSampler) and loader.batch_sampler is None:
        return DataLoader(loader.dataset, sampler=epoch_batches, batch_size=None, **options)
    return DataLoader(loader.dataset, batch_sampler=epoch_batches, **options)


class DispatchingDataLoader(data.PreparedDataLoader):
    """A prepared loader whose batches the main process loads (positions, epochs, resuming,
    end_of_dataloader and gather_for_metrics' remainder as any prepared loader's)."""

    def __init__(
        self, loader: DataLoader, setup: data.LoaderSetup, collectives: Collectives
    ) -> None:
        # Not PreparedDataLoader.__init__: its DataLoader reads a sharded sampler on every rank.
        self._set_up(loader, setup)
        if loader.batch_size is None and not isinstance(loader.sampler, BatchSampler):
            raise ValueError(
                "dataloader_config(dispatch_batches=True) cuts batches into rows, but this "
                "DataLoader has batch_size=None (single samples). Give it a batch_size, or use "
                "dispatch_batches=False."
            )
        epoch_batches = None
        uniform = True
        if not self._iterable:
            batches = batches_of(loader, self._seeding)
            uniform = uniform_batches(batches)
            epoch_batches = EpochBatches(batches, self._seeding)
        options = loader_options(loader, self._worker_generator)
        source = main_loader(loader, epoch_batches, options)
        dispatched = Dispatched(
            source, setup.spec, collectives, epoch_batches, self._seeding, uniform
        )
        dispatched.last_batch_size = last_batch_size(loader)
        self._shard = dispatched  # type: ignore[assignment]  # (duck-typed: configure, length)
        DataLoader.__init__(self, dispatched, batch_size=None)
        self._describe_rank_batches(loader)

    def __len__(self) -> int:
        return len(self._shard)  # (DataLoader's own would divide by batch_size once more)

    def _note_last_step(self) -> None:
        known = getattr(self._shard, "remainder", None)
        if known is not None:
            self.remainder = known
