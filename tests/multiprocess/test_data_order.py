"""On real gloo ranks whose global RNGs differ, every prepared loader hands out each sample once
per epoch, in the order of the loader's own generator (issue 18, points 1 and 2)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, default_collate

from nbtrain import Accelerator, notebook_launcher

pytestmark = pytest.mark.timeout(180)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}
SAMPLES, BATCH = 22, 4


class Indexed(Dataset):
    """Items know their index; a list index (sampler=BatchSampler) gives a list of items."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index):
        if isinstance(index, list):
            return [{"index": i} for i in index]
        return {"index": index}


def loaders(generator: torch.Generator) -> dict[str, DataLoader]:
    ds = Indexed()
    return {
        "shuffle": DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2),
        "batch_sampler": DataLoader(
            ds, batch_sampler=BatchSampler(RandomSampler(ds), BATCH, drop_last=False)
        ),
        "sampler_is_batch_sampler": DataLoader(
            ds,
            sampler=BatchSampler(RandomSampler(ds), BATCH, drop_last=False),
            batch_size=None,
            collate_fn=default_collate,
        ),
        "generator": DataLoader(ds, batch_size=BATCH, shuffle=True, generator=generator),
    }


def seen_per_epoch() -> dict[str, Any]:
    acc = Accelerator()
    torch.manual_seed(acc.process_index)  # each rank's global RNG differs, as in Accelerate's test
    generator = torch.Generator()
    prepared = {name: acc.prepare(dl) for name, dl in loaders(generator).items()}
    generator.manual_seed(42)  # after prepare: must take effect
    out: dict[str, Any] = {}
    for name, loader in prepared.items():
        epochs = []
        for _ in range(2):
            indices = [acc.gather_for_metrics(batch["index"]).tolist() for batch in loader]
            epochs.append(indices)
        out[name] = epochs
    return out


def test_each_sample_once_and_the_generators_order_on_two_ranks():
    results = notebook_launcher(
        seen_per_epoch, num_processes=2, start_method="fork", return_all=True, **QUIET
    )
    assert results[0] == results[1], "gathered results differ between the ranks"
    for name, epochs in results[0].items():
        for epoch in epochs:
            flat = [i for step in epoch for i in step]
            assert sorted(flat) == list(range(SAMPLES)), f"{name}: {flat}"
        assert epochs[0] != epochs[1], f"{name}: the same order in two epochs"
    # The seeded loader's order is one process's: steps of 2 batches are its batches of 8.
    generator = torch.Generator().manual_seed(42)
    single = DataLoader(Indexed(), batch_size=2 * BATCH, shuffle=True, generator=generator)
    expected = [[batch["index"].tolist() for batch in single] for _ in range(2)]
    assert results[0]["generator"] == expected
