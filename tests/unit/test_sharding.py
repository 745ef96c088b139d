"""Sharding arithmetic with explicit ranks: which indices each rank gets, how many batches, and
how many of the last step's samples are real. Accelerate's BatchSamplerShard is the oracle for
the documented semantics (it is a dev dependency); our own invariants are checked directly too."""

from __future__ import annotations

import copy
import itertools
import random

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

from nbtrain.accelerator.data import sharding
from nbtrain.accelerator.data.sharding import ShardSpec
from nbtrain.accelerator.data.splitting import share

CASES = [
    (length, batch, world, drop_last)
    for length in (1, 2, 3, 5, 7, 8, 9, 10, 13, 16, 17)
    for batch in (1, 2, 3, 4)
    for world in (1, 2, 3)
    for drop_last in (False, True)
]


def batches(length: int, batch: int, drop_last: bool) -> BatchSampler:
    return BatchSampler(SequentialSampler(range(length)), batch, drop_last)


def ours(length, batch, world, drop_last, split, even) -> list[list[list[int]]]:
    return [
        list(
            sharding.shard_batches(
                batches(length, batch, drop_last),
                ShardSpec(world, rank, split, even, drop_last, batch),
            )
        )
        for rank in range(world)
    ]


def accelerates(length, batch, world, drop_last, split, even) -> list[list[list[int]]]:
    from accelerate.data_loader import BatchSamplerShard

    return [
        list(BatchSamplerShard(batches(length, batch, drop_last), world, rank, split, even))
        for rank in range(world)
    ]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("even", [True, False])
def test_batches_match_accelerate(split, even):
    for length, batch, world, drop_last in CASES:
        if world == 1:
            continue  # Accelerate does not shard a single process; see the test below
        size = batch * world if split else batch  # split needs a multiple of the world size
        case = (length, size, world, drop_last, split, even)
        assert ours(*case) == accelerates(*case), case


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("even", [True, False])
def test_length_is_exact(split, even):
    for length, batch, world, drop_last in CASES:
        size = batch * world if split else batch
        per_rank = ours(length, size, world, drop_last, split, even)
        count = len(batches(length, size, drop_last))
        last = length % size or size
        for rank, got in enumerate(per_rank):
            spec = ShardSpec(world, rank, split, even, drop_last, size)
            assert sharding.sharded_length(count, spec, last) == (len(got), True), (spec, length)


@pytest.mark.parametrize("split", [False, True])
def test_even_batches_cover_every_sample_and_remainder_marks_the_duplicates(split):
    for length, batch, world, drop_last in CASES:
        if drop_last:
            continue
        size = batch * world if split else batch
        per_rank = ours(length, size, world, False, split, True)
        steps = {len(got) for got in per_rank}
        assert len(steps) == 1, "even_batches: every rank gets as many batches"
        # What gather() returns at each step: the ranks' batches concatenated in rank order.
        gathered = [
            list(itertools.chain.from_iterable(got[step] for got in per_rank))
            for step in range(steps.pop())
        ]
        remainder = sharding.remainder(length, ShardSpec(world, 0, split, True, False, size))
        if remainder:
            gathered[-1] = gathered[-1][:remainder]
        flat = [index for step in gathered for index in step]
        assert flat == list(range(length)), (length, size, world)


def test_one_rank_keeps_its_short_last_batch():
    spec = ShardSpec(1, 0, batch_size=3)
    assert list(sharding.shard_batches(batches(10, 3, False), spec)) == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
        [9],
    ]
    assert sharding.remainder(10, spec) == 1


def test_fewer_samples_than_ranks_wraps_around():
    per_rank = ours(1, 2, 3, False, False, True)
    assert per_rank == [[[0, 0]], [[0, 0]], [[0, 0]]]
    assert sharding.remainder(1, ShardSpec(3, 0, batch_size=2)) == 1


def test_varying_batch_sizes_wrap_whole_batches():
    uneven = [[0, 1, 2], [3], [4, 5]]
    got = [list(sharding.shard_batches(uneven, ShardSpec(2, r))) for r in range(2)]
    assert got == [[[0, 1, 2], [4, 5]], [[3], [0, 1, 2]]]
    assert sharding.remainder(6, ShardSpec(2, 0)) == -1, "unknown batch size: unknown remainder"


class SizedBatches:
    """A custom batch sampler yielding batches of the given sizes (consecutive indices)."""

    def __init__(self, sizes: list[int], batch_size: int | None, drop_last: bool = False) -> None:
        self.sizes = sizes
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        start = 0
        for size in self.sizes:
            yield list(range(start, start + size))
            start += size

    def __len__(self) -> int:
        return len(self.sizes)


def test_custom_batch_samplers_with_short_batches_match_accelerate():
    """Short batches anywhere in the epoch (bucketing samplers, the last batch of each bucket):
    every rank gets what Accelerate's BatchSamplerShard gives it, for 2000 seeded cases."""
    from accelerate.data_loader import BatchSamplerShard

    rng = random.Random(3)
    for _ in range(2000):
        world, split = rng.choice([2, 3]), rng.random() < 0.3
        size = rng.choice([1, 2, 3, 4]) * (world if split else 1)
        sizes = [rng.choice([size, size, rng.randint(1, size)]) for _ in range(rng.randint(1, 8))]
        declared = None if not split and rng.random() < 0.2 else size  # no batch_size attribute
        even, drop_last = rng.random() < 0.5, rng.random() < 0.2
        for rank in range(world):
            spec = ShardSpec(world, rank, split, even, drop_last, declared)
            got = list(sharding.shard_batches(SizedBatches(sizes, declared, drop_last), spec))
            sampler = SizedBatches(sizes, declared, drop_last)
            want = list(BatchSamplerShard(sampler, world, rank, split, even))
            assert got == want, (sizes, spec)
    # One process: the batches as they come (Accelerate does not shard a single process).
    spec = ShardSpec(1, 0, batch_size=2)
    assert list(sharding.shard_batches(SizedBatches([2, 1, 2], 2), spec)) == [[0, 1], [2], [3, 4]]


def test_a_short_batch_mid_epoch_still_ends_the_epoch_on_every_rank():
    """World 2, batches [0,1] [2] [3,4] [5,6] [7,8]: the step holding the short batch is dropped
    (as in Accelerate), every later step is handed out, and the last batch of each rank is
    flagged as the end of the dataloader (the final accumulation sync, gather_for_metrics)."""
    from nbtrain.accelerator.data import loaders
    from nbtrain.accelerator.training.accumulation import GradientState

    dataset = TensorDataset(torch.arange(9))
    seen = []
    for rank in range(2):
        loader = loaders.prepare_data_loader(
            DataLoader(dataset, batch_sampler=SizedBatches([2, 1, 2, 2, 2], 2)),
            world_size=2,
            rank=rank,
            split_batches=False,
            even_batches=True,
            seed=0,
            device=None,
            gradient_state=GradientState(),
        )
        seen.append([(x.tolist(), loader.end_of_dataloader) for (x,) in loader])
    assert seen == [[([3, 4], False), ([7, 8], True)], [([5, 6], False), ([0, 1], True)]]


def test_skipping_is_slicing():
    spec = ShardSpec(2, 1, batch_size=2)
    full = list(sharding.shard_batches(batches(11, 2, False), spec))
    skipped = list(itertools.islice(sharding.shard_batches(batches(11, 2, False), spec), 2, None))
    assert skipped == full[2:]


def test_bad_specs_are_explained():
    with pytest.raises(ValueError, match="multiple of 3"):
        ShardSpec(3, 0, split_batches=True, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        ShardSpec(2, 0, split_batches=True, batch_size=None)
    with pytest.raises(ValueError, match="rank=2"):
        ShardSpec(2, 2)


# -- split_between_processes ------------------------------------------------------------------


def test_split_between_processes_lists():
    for length, world in itertools.product(range(9), (1, 2, 3, 4)):
        items = list(range(length))
        parts = [share(items, world, rank) for rank in range(world)]
        assert list(itertools.chain.from_iterable(parts)) == items
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        assert [len(p) for p in parts] == sorted((len(p) for p in parts), reverse=True)
        padded = [share(items, world, rank, apply_padding=True) for rank in range(world)]
        if length:
            assert len({len(p) for p in padded}) == 1
            assert all(p[: len(q)] == q for p, q in zip(padded, parts, strict=True))


def accelerates_split(inputs, world: int, rank: int, apply_padding: bool):
    """Accelerate's PartialState.split_between_processes for an explicit rank (its generator,
    called with a stand-in for the state: it reads only these three attributes)."""
    from types import SimpleNamespace

    from accelerate.state import PartialState

    state = SimpleNamespace(num_processes=world, process_index=rank, device=torch.device("cpu"))
    return next(PartialState.split_between_processes.__wrapped__(state, inputs, apply_padding))


def test_split_between_processes_matches_accelerate():
    for length, world, pad in itertools.product(range(1, 9), (1, 2, 3, 4), (False, True)):
        for rank in range(world):
            items = [f"x{i}" for i in range(length)]
            assert share(items, world, rank, pad) == accelerates_split(items, world, rank, pad)
            both = {"a": list(range(length)), "b": items}
            want = accelerates_split(copy.deepcopy(both), world, rank, pad)  # (it edits it)
            assert share(both, world, rank, pad) == want, (length, world, rank, pad)
            # Nested dicts are split value by value too (Accelerate recurses into them, but its
            # length check counts a nested dict's keys, so it refuses most of them).
            assert share({"n": both}, world, rank, pad) == {"n": want}
            # Tensors: Accelerate pads them across processes (a collective, which one test
            # process cannot run); its padding value is the input's last row, as for lists.
            rows = torch.arange(length * 2).reshape(length, 2)
            picked = accelerates_split(list(range(length)), world, rank, pad)
            assert torch.equal(share(rows, world, rank, pad), rows[picked])


def test_split_between_processes_tensors_tuples_and_dicts():
    t = torch.arange(10).reshape(5, 2)
    assert torch.equal(share(t, 2, 1), t[3:])
    assert torch.equal(share(t, 2, 1, apply_padding=True), torch.cat([t[3:], t[4:]]))
    # Padding repeats the input's last item, also on a rank whose share is not the last.
    assert torch.equal(share(t[:4], 3, 1, apply_padding=True), torch.stack([t[2], t[3]]))
    assert share([1, 2, 3, 4], 3, 1, apply_padding=True) == [3, 4]
    assert share((1, 2, 3), 2, 0) == (1, 2)
    assert share((1, 2, 3), 2, 1, apply_padding=True) == (3, 3)
    got = share({"a": [1, 2, 3], "b": torch.tensor([4, 5, 6]), "c": "kept"}, 3, 2)
    assert got["a"] == [3] and torch.equal(got["b"], torch.tensor([6])) and got["c"] == "kept"
    with pytest.raises(ValueError, match="same length"):
        share({"a": [1, 2], "b": [1]}, 2, 0)
    with pytest.raises(TypeError, match="set"):
        share({1, 2}, 2, 0)


class RefillingBatches:
    """A hand-written batch sampler that refills one list (it clears it after each yield)."""

    batch_size = 2

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):  # type: ignore[no-untyped-def]
        batch: list[int] = []
        for index in range(self.length):
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch.clear()
        if batch:
            yield batch


@pytest.mark.parametrize("length", [4, 5, 7, 8])
@pytest.mark.parametrize("even_batches", [True, False])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_batch_sampler_that_refills_its_list_shards_like_fresh_lists(
    length: int, even_batches: bool, rank: int
) -> None:
    spec = ShardSpec(world_size=2, rank=rank, even_batches=even_batches, batch_size=2)
    expected = list(sharding.shard_batches(list(batches(length, 2, False)), spec))
    assert list(sharding.shard_batches(RefillingBatches(length), spec)) == expected


@pytest.mark.parametrize(("length", "batch", "world", "drop_last"), CASES)
def test_fresh_batches_shard_as_copied_ones(
    length: int, batch: int, world: int, drop_last: bool
) -> None:
    for rank in range(world):
        for even in (True, False):
            spec = ShardSpec(world, rank, even_batches=even, drop_last=drop_last, batch_size=batch)
            copied = list(sharding.shard_batches(batches(length, batch, drop_last), spec))
            fresh = list(sharding.shard_batches(batches(length, batch, drop_last), spec, True))
            assert fresh == copied
