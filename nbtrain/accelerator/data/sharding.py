"""Which samples each rank gets: pure index arithmetic, testable with explicit ranks.

Semantics follow Accelerate's documented behaviour:

- ``split_batches=False``: each batch of the original loader goes whole to one rank, round robin
  (batch i to rank i % world), so a global step covers ``world`` batches.
- ``split_batches=True``: each original batch is cut into ``world`` equal slices.
- ``even_batches=True`` (and not ``drop_last``): the last step is completed by wrapping around to
  the start of the epoch, so every rank gets as many full batches. The duplicates are the tail of
  the step in rank order, which is why ``gather_for_metrics`` keeps the first ``remainder``.
- ``drop_last``: an incomplete last step is dropped.
- a custom batch sampler whose batches vary in size: as Accelerate's BatchSamplerShard, a step
  whose last batch is short is dropped mid-epoch, and only the epoch's tail is completed.
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


def shard_batches(
    batches: Iterable[Sequence[T]], spec: ShardSpec, fresh: bool = False
) -> Iterator[list[T]]:
    """This rank's batches, from the original loader's batches (lists of indices).

    Accelerate's BatchSamplerShard semantics, including for batch samplers whose batches vary
    in size: only full batches (``len == batch_size``, or any size when the sampler has no
    ``batch_size``) are guaranteed to be handed out; see ``_whole`` and ``_split``. A single
    process gets the batches unchanged (Accelerate does not shard it either).

    ``fresh``: every batch is a new list nobody else holds (torch's BatchSampler), so batches
    are kept as they are; otherwise each is copied (a custom batch sampler may refill one list).
    """
    if spec.world_size == 1:
        return (list(batch) for batch in batches)
    if spec.split_batches:
        return _split(batches, spec)
    return _whole(batches, spec, fresh)


def _is_full(batch: Sequence[object], size: int | None) -> bool:
    return size is None or len(batch) == size


def _whole(
    batches: Iterable[Sequence[T]], spec: ShardSpec, fresh: bool = False
) -> Iterator[list[T]]:
    """Batch i goes to rank i % world. A *step* is each run of ``world`` consecutive batches; it
    is handed out when its last batch is full, and dropped otherwise (a short batch in the middle
    of an epoch, from a custom batch sampler, costs its whole step, as in Accelerate). The epoch's
    tail is then completed by wrapping around (even_batches), or handed out as it is.

    Runs once per batch of every rank: plain locals, no calls but the copy a reused list needs."""
    world, rank, size = spec.world_size, spec.rank, spec.batch_size
    last_slot = world - 1
    keep_first = not spec.drop_last  # the epoch's first `world` batches, to wrap around to
    first: list[list[T]] = []
    mine: list[T] | None = None  # this rank's batch of the current step, not handed out yet
    position = -1  # of the last batch seen in its step (0..world-1)
    batch: list[T] = []
    for batch_ in batches:
        batch = batch_ if fresh else list(batch_)  # type: ignore[assignment]
        position = position + 1 if position < last_slot else 0
        if keep_first and len(first) < world:
            first.append(batch)
        if position == rank:
            mine = batch
        if position == last_slot and (size is None or len(batch) == size):
            yield mine  # type: ignore[misc]  # set: rank <= world - 1 = position
            mine = None
    if spec.drop_last or not first:
        return
    if not spec.even_batches:
        if mine:  # (Accelerate's rule, also for a batch left over from a dropped step)
            yield mine
        return
    if mine and _is_full(mine, size):
        yield mine
    yield from _wrap_around(first, batch, position, spec)


def _wrap_around(
    first: list[list[T]], last: list[T], position: int, spec: ShardSpec
) -> Iterator[list[T]]:
    """even_batches: complete the last step (and a short last batch) from the epoch's start, so
    every rank gets a batch in it; the samples are taken in order, cycling when they run short."""
    world, rank, size = spec.world_size, spec.rank, spec.batch_size
    if size is None:  # batches of varying size: wrap around whole batches
        source_batches = itertools.cycle(first)
        for slot in range(position + 1, _next_multiple(position + 1, world)):
            batch = list(next(source_batches))
            if slot % world == rank:
                yield batch
        return
    samples = itertools.cycle(itertools.chain.from_iterable(first))
    slot, pending = position, last
    if _is_full(last, size):  # the last batch was handed out with its step: start a new slot
        slot, pending = position + 1, []
    while slot % world or pending:
        completed = pending + list(itertools.islice(samples, size - len(pending)))
        if slot % world == rank:
            yield completed
        slot, pending = slot + 1, []


def _next_multiple(value: int, world: int) -> int:
    return -(-value // world) * world


def _split(batches: Iterable[Sequence[T]], spec: ShardSpec) -> Iterator[list[T]]:
    """Each full batch is cut into ``world`` slices; short batches are skipped, except the
    epoch's last one, which is completed from the epoch's first batch (even_batches) or sliced
    as it is."""
    size = spec.batch_size
    assert size is not None
    part = size // spec.world_size
    start, end = part * spec.rank, part * (spec.rank + 1)
    first: list[T] | None = None
    last: list[T] = []
    for batch_ in batches:
        last = list(batch_)
        if first is None:
            first = last
        if len(last) == size:
            yield last[start:end]
    if first is None or len(last) >= size or spec.drop_last:
        return
    if not spec.even_batches:
        if len(last) > start:
            yield last[start:end]
        return
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
