"""torch's shuffled batches, drawn a pass at a time instead of an index at a time.

A shuffled DataLoader batches ``RandomSampler``, which yields its permutation one index at a time
from a Python generator. Sharding needs the one global order, so every rank draws every rank's
indices: with 2 ranks of 32, that is 64 generator steps per training step. Those steps were most
of what the prepared loader cost over a hand-written ``DistributedSampler``, which draws its
order once per epoch (issue 21).

``PermutedBatches`` draws the same permutation from the same generator with the same calls as
``RandomSampler`` makes, at the same moments: one ``randperm`` when the pass starts, and a second,
discarded one when it ends. It hands out slices of that permutation. So the batches and the
generator's state match torch's exactly, for every rank and for a resumed pass. The installed
torch is checked once per process (``matches_torch``); a torch that draws differently keeps the
plain ``BatchSampler``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler


class PermutedBatches(BatchSampler):
    """A ``BatchSampler`` over a ``RandomSampler`` (same attributes) that slices a whole pass's
    permutation; made by ``batched`` only when the installed torch passes ``matches_torch``. A
    sampler changed since (replacement, num_samples, no generator) is batched the plain way."""

    def __iter__(self) -> Iterator[list[int]]:
        sampler = self.sampler
        if not _drawn_whole(sampler):
            return super().__iter__()
        return _sliced(sampler, self.batch_size, self.drop_last)


def batched(sampler: Any, size: int, drop_last: bool) -> BatchSampler:
    """torch's ``BatchSampler`` over ``sampler``, in its fast form for a ``RandomSampler`` (what
    shuffle=True makes)."""
    if type(sampler) is RandomSampler and matches_torch():
        return PermutedBatches(sampler, size, drop_last)
    return BatchSampler(sampler, size, drop_last)


def _drawn_whole(sampler: Any) -> bool:
    """Whether the sampler draws exactly one permutation of its data per pass from its own
    generator (the case ``_sliced`` reproduces); read per pass, as RandomSampler reads them."""
    return (
        not sampler.replacement
        and isinstance(sampler.generator, torch.Generator)
        and sampler.num_samples == len(sampler.data_source)
    )


def _sliced(sampler: Any, size: int, drop_last: bool) -> Iterator[list[int]]:
    count = len(sampler.data_source)
    generator = sampler.generator
    order = torch.randperm(count, generator=generator).tolist()
    end = count - count % size if drop_last else count
    for start in range(0, end, size):
        yield order[start : start + size]
    # RandomSampler draws a further permutation and keeps none of it when its pass runs out;
    # the generator must advance alike, or the next pass (and the user's g) would differ.
    torch.randperm(count, generator=generator)


@functools.cache
def matches_torch() -> bool:
    """Whether ``_sliced`` gives the installed torch's batches and leaves its generator in the
    same state, checked on small samplers (whole and short last batches, both drop_last)."""
    for count, size, drop_last in ((8, 4, False), (7, 3, False), (7, 3, True), (8, 4, True)):
        theirs, ours = torch.Generator(), torch.Generator()
        theirs.manual_seed(1234)
        ours.manual_seed(1234)
        torch_sampler = RandomSampler(range(count), generator=theirs)
        expected = list(BatchSampler(torch_sampler, size, drop_last))
        got = list(_sliced(RandomSampler(range(count), generator=ours), size, drop_last))
        if got != expected or not torch.equal(theirs.get_state(), ours.get_state()):
            return False
    return True
