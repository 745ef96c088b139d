"""Sharding arithmetic with explicit ranks: which indices each rank gets, how many batches, and
how many of the last step's samples are real. Accelerate's BatchSamplerShard is the oracle for
the documented semantics (it is a dev dependency); our own invariants are checked directly too."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

from nbtrain import sharding
from nbtrain.sharding import ShardSpec
from nbtrain.splitting import share

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


def test_split_between_processes_tensors_tuples_and_dicts():
    t = torch.arange(10).reshape(5, 2)
    assert torch.equal(share(t, 2, 1), t[3:])
    assert torch.equal(share(t, 2, 1, apply_padding=True), torch.cat([t[3:], t[4:]]))
    assert share((1, 2, 3), 2, 0) == (1, 2)
    assert share((1, 2, 3), 2, 1, apply_padding=True) == (3, 3)
    got = share({"a": [1, 2, 3], "b": torch.tensor([4, 5, 6]), "c": "kept"}, 3, 2)
    assert got["a"] == [3] and torch.equal(got["b"], torch.tensor([6])) and got["c"] == "kept"
    with pytest.raises(ValueError, match="same length"):
        share({"a": [1, 2], "b": [1]}, 2, 0)
    with pytest.raises(TypeError, match="set"):
        share({1, 2}, 2, 0)
