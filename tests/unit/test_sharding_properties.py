"""Every prepared loader, on every rank, hands out each sample exactly once per epoch (plus
even_batches' documented padding from the epoch's start), in the order the loader's own
generator gives one process: pure logic, the ranks given explicitly (no process group).

The configurations are a fixed pseudo-random sample of dataset sizes, batch sizes, world
sizes, samplers, split_batches, even_batches and drop_last (the same sample every run)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from nbtrain.accelerator.data import loaders
from nbtrain.accelerator.data.prepared import PreparedDataLoader
from nbtrain.accelerator.training.accumulation import GradientState

SAMPLERS = [
    "sequential",
    "shuffle",  # DataLoader(shuffle=True, generator=g)
    "shuffle_unseeded",  # shuffle=True without a generator: nbtrain makes one
    "batch_sampler",  # batch_sampler=BatchSampler(RandomSampler(generator=g))
    "sampler_is_batch_sampler",  # sampler=BatchSampler(...), batch_size=None
    "unbatched",  # batch_size=None over a RandomSampler
    "subset",  # SubsetRandomSampler(generator=g)
    "weighted",  # WeightedRandomSampler(replacement=False, generator=g)
]


class Indices(Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        return list(index) if isinstance(index, list) else index


@dataclass(frozen=True)
class Case:
    length: int
    batch: int
    world: int
    sampler: str
    split: bool
    even: bool
    drop_last: bool
    seedable: bool = False  # use_seedable_sampler: nbtrain's generator, seeded per epoch

    def loader(self, generator: torch.Generator | None) -> DataLoader:
        ds = Indices(self.length)
        kind, size, drop = self.sampler, self.batch, self.drop_last
        if kind == "sequential":
            return DataLoader(ds, batch_size=size, drop_last=drop)
        if kind in ("shuffle", "shuffle_unseeded"):
            return DataLoader(
                ds, batch_size=size, shuffle=True, drop_last=drop, generator=generator
            )
        if kind == "batch_sampler":
            batches = BatchSampler(RandomSampler(ds, generator=generator), size, drop)
            return DataLoader(ds, batch_sampler=batches)
        if kind == "sampler_is_batch_sampler":
            batches = BatchSampler(RandomSampler(ds, generator=generator), size, drop)
            return DataLoader(ds, sampler=batches, batch_size=None, collate_fn=_as_list)
        if kind == "unbatched":
            return DataLoader(ds, sampler=RandomSampler(ds, generator=generator), batch_size=None)
        if kind == "subset":
            sampler = SubsetRandomSampler(range(self.length), generator=generator)
            return DataLoader(ds, batch_size=size, sampler=sampler, drop_last=drop)
        weights = torch.ones(max(self.length, 1))[: self.length]
        sampler = WeightedRandomSampler(
            weights, self.length, replacement=False, generator=generator
        )
        return DataLoader(ds, batch_size=size, sampler=sampler, drop_last=drop)

    @property
    def loader_batch(self) -> int:
        return 1 if self.sampler == "unbatched" else self.batch


def _as_list(batch):
    return list(batch)


def _flat(batch) -> list[int]:
    if isinstance(batch, torch.Tensor):
        return batch.reshape(-1).tolist()
    if isinstance(batch, list):
        return [int(x) for x in batch]
    return [int(batch)]


def _chain(lists: list[list[int]]) -> list[int]:
    return [x for part in lists for x in part]


def cases(count: int = 700) -> list[Case]:
    draw = random.Random(18)
    found: list[Case] = []
    while len(found) < count:
        world = draw.choice([1, 2, 2, 3, 4])
        sampler = draw.choice(SAMPLERS)
        split = draw.random() < 0.35 and sampler != "unbatched"
        batch = draw.randint(1, 4) * (world if split else 1)
        if split and batch == 1:
            continue
        length = draw.choice([0, 1, 2, 3, draw.randint(4, 40)])
        drop_last = draw.random() < 0.3 and sampler != "unbatched"  # (no batches to drop)
        if length == 0 and sampler not in ("sequential", "subset"):
            continue  # torch's random samplers refuse an empty dataset
        found.append(Case(length, batch, world, sampler, split, draw.random() < 0.6, drop_last))
    return found


def run(case: Case, seed: int = 7) -> tuple[list[list[int]], list[list[list[int]]]]:
    """(one process's batches, each rank's batches), all from generators in the same state."""

    def generator() -> torch.Generator | None:
        return None if case.sampler == "shuffle_unseeded" else torch.Generator().manual_seed(seed)

    def prepared(world: int, rank: int) -> PreparedDataLoader:
        return loaders.prepare_data_loader(
            case.loader(generator()),
            world_size=world,
            rank=rank,
            split_batches=case.split and world > 1,
            even_batches=case.even,
            seed=seed,
            device=None,
            gradient_state=GradientState(),
            seedable=case.seedable,
        )

    if case.seedable:  # the order of one process with the same seed and epoch
        reference = [_flat(b) for b in prepared(1, 0)]
    else:  # the order of the raw loader
        reference = [_flat(b) for b in case.loader(generator())]
    ranks = []
    for rank in range(case.world):
        loader = prepared(case.world, rank)
        batches = [_flat(b) for b in loader]
        assert len(batches) == len(loader), f"rank {rank}: len() is not the batch count"
        ranks.append(batches)
    return reference, ranks


def interleave(case: Case, ranks: list[list[list[int]]]) -> list[list[int]]:
    """The global steps: rank 0's batch, rank 1's, ... (split: one original batch per step)."""
    steps = max((len(r) for r in ranks), default=0)
    out: list[list[int]] = []
    for step in range(steps):
        parts = [r[step] for r in ranks if step < len(r)]
        out.extend([_chain(parts)] if case.split else parts)
    return out


@pytest.mark.parametrize("chunk", range(7))
def test_each_sample_once_per_epoch_in_the_generators_order(chunk):
    for case in cases()[chunk * 100 : (chunk + 1) * 100]:
        check(case)


def check(case: Case) -> None:
    reference, ranks = run(case)
    got = interleave(case, ranks)
    flat_ref = _chain(reference)
    flat_got = _chain(got)
    world, size = case.world, case.loader_batch
    pads = world > 1 and case.even and not case.drop_last
    if pads:
        lengths = {len(r) for r in ranks}
        assert len(lengths) == 1, f"{case}: uneven batch counts {lengths}"
        rank_size = size // world if case.split else size
        assert all(len(b) == rank_size for r in ranks for b in r), f"{case}: a short batch"
    if case.drop_last and world > 1 and not case.split:  # the incomplete last step goes
        flat_ref = _chain(reference[: len(reference) // world * world])
    real = flat_got[: len(flat_ref)] if pads else flat_got
    if case.sampler == "shuffle_unseeded":  # nbtrain's own generator: some permutation
        assert len(real) == len(flat_ref) and len(set(real)) == len(real), f"{case}: {ranks}"
        return
    assert real == flat_ref, f"{case}: {ranks} vs {reference}"
    if pads:
        padding = flat_got[len(flat_ref) :]
        cycle = (flat_ref * (len(padding) // max(len(flat_ref), 1) + 1))[: len(padding)]
        assert padding == cycle, f"{case}: padding {padding} is not the epoch's start"
