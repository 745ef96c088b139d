"""Which samples each rank gets: pure index arithmetic, testable with explicit ranks.

Semantics follow Accelerate's documented behaviour:

- ``split_batches=False``: each batch of the original loader goes whole to one rank, round robin
  (batch i to rank i % world), so a global step covers ``world`` batches.
- ``split_batches=True``: each original batch is cut into ``world`` equal slices.
- ``even_batches=True`` (and not ``drop_last``): the last step is completed by wrapping around to
  the start of the epoch, so every rank gets as many full batches. The duplicates are the tail of
  the step in rank order, which is why ``gather_for_metrics`` keeps the first ``remainder``.
- ``drop_last``: an incomplete last step is dropped.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ShardSpec:
    world_size: int
    rank: int
    split_batches: bool = False
    even_batches: bool = True
    drop_last: bool = False
    batch_size: int | None = None  # of the original loader (the global batch when split)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} must be in 0..{self.world_size - 1}.")
        if self.split_batches:
            if self.batch_size is None:
                raise ValueError(
                    "split_batches=True needs a DataLoader with a batch_size (or a batch_sampler "
                    "with a batch_size attribute) to split."
                )
            if self.batch_size % self.world_size:
                raise ValueError(
                    f"split_batches=True cuts each batch of {self.batch_size} samples into "
                    f"{self.world_size} equal parts, which is impossible: use a batch_size that "
                    f"is a multiple of {self.world_size}, or split_batches=False."
                )

    @property
    def evens_out(self) -> bool:
        """Whether a short last step is completed by wrapping around (never for one rank: a
        single process keeps its short last batch, as Accelerate does)."""
        return self.even_batches and not self.drop_last and self.world_size > 1

    @property
    def rank_batch_size(self) -> int | None:
        """Samples per batch each rank receives."""
        if self.batch_size is None:
            return None
        return self.batch_size // self.world_size if self.split_batches else self.batch_size

    @property
    def step_size(self) -> int | None:
        """Samples one global step covers over all ranks."""
        if self.batch_size is None:
            return None
        return self.batch_size if self.split_batches else self.batch_size * self.world_size


def shard_batches(batches: Iterable[Sequence[T]], spec: ShardSpec) -> Iterator[list[T]]:
    """This rank's batches, from the original loader's batches (lists of indices)."""
    if spec.split_batches:
        return _split(batches, spec)
    return _whole(batches, spec)


def _whole(batches: Iterable[Sequence[T]], spec: ShardSpec) -> Iterator[list[T]]:
    world, rank, size = spec.world_size, spec.rank, spec.batch_size
    wrap = spec.evens_out
    first: list[list[T]] = []  # the first batches, to wrap around to at the end
    group: list[list[T]] = []
    for batch in batches:
        batch = list(batch)
        if wrap and len(first) < world:
            first.append(batch)
        group.append(batch)
        if len(group) == world and (size is None or len(batch) == size):
            yield group[rank]
            group = []
    if not group:
        return
    if spec.drop_last:
        return
    if not spec.evens_out:
        if rank < len(group):
            yield group[rank]
        return
    yield _complete_group(group, first, spec)[rank]


def _complete_group(group: list[list[T]], first: list[list[T]], spec: ShardSpec) -> list[list[T]]:
    """Fill a last, incomplete step from the start of the epoch (cycling if it is short)."""
    world, size = spec.world_size, spec.batch_size
    if size is None:  # batches of varying size: wrap around whole batches
        cycle_batches = itertools.cycle(first)
        return group + [list(next(cycle_batches)) for _ in range(world - len(group))]
    source = itertools.cycle(itertools.chain.from_iterable(first))
    completed = [*group[:-1], group[-1] + list(itertools.islice(source, size - len(group[-1])))]
    while len(completed) < world:
        completed.append(list(itertools.islice(source, size)))
    return completed


def _split(batches: Iterable[Sequence[T]], spec: ShardSpec) -> Iterator[list[T]]:
    size = spec.batch_size
    assert size is not None
    part = size // spec.world_size
    start, end = part * spec.rank, part * (spec.rank + 1)
    first: list[T] | None = None
    last: list[T] = []
    for batch in batches:
        batch = list(batch)
        if first is None:
            first = batch
        if len(batch) == size:
            yield batch[start:end]
        else:
            last = batch  # only the final batch can be short
    if not last or spec.drop_last:
        return
    if not spec.evens_out:
        if len(last) > start:
            yield last[start:end]
        return
    assert first is not None
    source = itertools.cycle(first)
    yield (last + list(itertools.islice(source, size - len(last))))[start:end]


def sharded_length(
    num_batches: int, spec: ShardSpec, last_batch_size: int | None = None
) -> tuple[int, bool]:
    """(batches this rank gets per epoch, whether that number is exact).

    ``last_batch_size`` is the size of the original loader's last batch when known; it only
    matters for split_batches without even_batches."""
    if spec.world_size == 1:
        return num_batches, True
    if spec.split_batches:
        if spec.evens_out or spec.drop_last or num_batches == 0:
            return num_batches, True
        if last_batch_size is None:
            return num_batches, False
        part = (spec.batch_size or 0) // spec.world_size
        short = last_batch_size < (spec.batch_size or 0)
        gets_last = not short or last_batch_size > part * spec.rank
        return num_batches - 1 + int(gets_last), True
    full, extra = divmod(num_batches, spec.world_size)
    if extra == 0 or spec.drop_last:
        return full, True
    if spec.evens_out:
        return full + 1, True
    return full + int(spec.rank < extra), True


def remainder(dataset_length: int | None, spec: ShardSpec) -> int:
    """Real samples in the last global step, or -1 when unknown; 0 means no duplicates."""
    if spec.drop_last:
        return 0
    if dataset_length is None or spec.step_size is None:
        return -1
    return dataset_length % spec.step_size


def process_slice(length: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of this rank's contiguous share; the first ``length % world`` ranks get one
    more (split_between_processes)."""
    base, extra = divmod(length, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + int(rank < extra)


def padded_share(length: int, world_size: int) -> int:
    """The share size every rank reaches with apply_padding=True."""
    return math.ceil(length / world_size) if length else 0
