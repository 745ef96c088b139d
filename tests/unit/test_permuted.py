"""The shuffled loader's fast path (accelerator/data/permuted.py) gives torch's batches exactly and
leaves the generator as torch leaves it: over several epochs, after a pass left early, and on
every rank of a prepared loader; and it steps aside when it cannot promise that."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from nbtrain.accelerator.data import loaders
from nbtrain.accelerator.data.permuted import PermutedBatches, batched, matches_torch
from nbtrain.accelerator.training.accumulation import GradientState


def _pair(length: int, size: int, drop_last: bool) -> tuple[BatchSampler, BatchSampler]:
    """torch's batch sampler and the fast one, over generators in the same state."""
    theirs, ours = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    return (
        BatchSampler(RandomSampler(range(length), generator=theirs), size, drop_last),
        batched(RandomSampler(range(length), generator=ours), size, drop_last),
    )


def _state(batches: BatchSampler) -> torch.Tensor:
    return batches.sampler.generator.get_state()  # type: ignore[attr-defined]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("length", "size"), [(1, 1), (5, 2), (32, 8), (33, 8), (100, 7)])
def test_the_same_batches_and_generator_state_as_torch_over_epochs(length, size, drop_last):
    torch_batches, fast = _pair(length, size, drop_last)
    assert type(fast) is PermutedBatches
    for _epoch in range(3):
        assert list(fast) == list(torch_batches)
        assert torch.equal(_state(fast), _state(torch_batches))
        # the user's code draws from the same generator between epochs
        assert torch.equal(
            torch.rand(3, generator=fast.sampler.generator),  # type: ignore[attr-defined]
            torch.rand(3, generator=torch_batches.sampler.generator),  # type: ignore[attr-defined]
        )


def test_a_pass_left_early_leaves_the_generator_as_torch_does():
    torch_batches, fast = _pair(40, 4, False)
    for taken in (0, 1, 3, 10):
        for batches in (torch_batches, fast):
            iterator = iter(batches)
            for _ in range(taken):
                next(iterator)
            del iterator
        assert torch.equal(_state(fast), _state(torch_batches)), f"after {taken} batches"
    assert list(fast) == list(torch_batches)


def test_a_sampler_changed_after_prepare_is_batched_the_plain_way():
    torch_batches, fast = _pair(20, 3, False)
    for batches in (torch_batches, fast):
        batches.sampler.replacement = True  # type: ignore[attr-defined]
    assert list(fast) == list(torch_batches)
    assert torch.equal(_state(fast), _state(torch_batches))


def test_other_samplers_keep_torchs_batch_sampler():
    class MySampler(RandomSampler):
        pass

    assert type(batched(MySampler(range(4)), 2, False)) is BatchSampler
    assert type(batched(range(4), 2, False)) is BatchSampler  # type: ignore[arg-type]


def test_a_torch_that_draws_differently_keeps_the_plain_batch_sampler(monkeypatch):
    def one_draw_only(self):  # a torch without the draw at the end of the pass
        yield from torch.randperm(len(self.data_source), generator=self.generator).tolist()

    monkeypatch.setattr(RandomSampler, "__iter__", one_draw_only)
    matches_torch.cache_clear()
    try:
        assert not matches_torch()
        assert type(batched(RandomSampler(range(4)), 2, False)) is BatchSampler
    finally:
        monkeypatch.undo()
        matches_torch.cache_clear()
    assert matches_torch()


def _shuffled(drop_last: bool) -> DataLoader:
    return DataLoader(
        range(50),  # type: ignore[arg-type]
        batch_size=4,
        shuffle=True,
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(11),
    )


def _prepared(world: int, rank: int, drop_last: bool) -> loaders.PreparedDataLoader:
    return loaders.prepare_data_loader(
        _shuffled(drop_last),
        world_size=world,
        rank=rank,
        split_batches=False,
        even_batches=True,
        seed=0,
        device=None,
        gradient_state=GradientState(),
    )


@pytest.mark.parametrize("drop_last", [False, True])
def test_prepared_ranks_take_the_fast_path_and_split_one_processs_order(drop_last):
    """Epoch after epoch, the two ranks' steps are one process's batches, in its order."""
    ranks = [_prepared(2, rank, drop_last) for rank in range(2)]
    assert all(type(r._shard.batch_sampler) is PermutedBatches for r in ranks)
    single = _shuffled(drop_last)
    for epoch in range(3):
        for r in ranks:
            r.set_epoch(epoch)
        expected = [i for batch in single for i in batch.tolist()]
        got = [i for pair in zip(*ranks, strict=True) for batch in pair for i in batch.tolist()]
        if drop_last:  # an incomplete last step is dropped
            expected = expected[: len(expected) // 8 * 8]
        assert got[: len(expected)] == expected, f"epoch {epoch}"
        assert len(got) == -(-len(expected) // 8) * 8  # even_batches pads the last step
