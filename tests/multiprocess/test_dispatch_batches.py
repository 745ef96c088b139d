"""dataloader_config(dispatch_batches=True) on real gloo ranks: the main process loads, every
rank receives exactly the batches it would have loaded itself (issue 18, point 5)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from nbtrain import Accelerator, notebook_launcher
from nbtrain.accelerator.data.loaderconfig import DataLoaderConfiguration

pytestmark = pytest.mark.timeout(180)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}


class RankStream(IterableDataset):
    """A stream only the main process can read correctly: other ranks would see other data."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        import torch.distributed as dist

        offset = 1000 * dist.get_rank()
        return ({"x": torch.tensor([float(i + offset)])} for i in range(self.length))


def map_loader(generator: torch.Generator, length: int, batch: int) -> DataLoader:
    x = torch.arange(length, dtype=torch.float32)[:, None]
    return DataLoader(TensorDataset(x, 2 * x), batch_size=batch, shuffle=True, generator=generator)


def batches(dispatch: bool, split: bool, even: bool, length: int, batch: int) -> list[Any]:
    config = DataLoaderConfiguration(
        dispatch_batches=dispatch, split_batches=split, even_batches=even
    )
    acc = Accelerator(dataloader_config=config)
    generator = torch.Generator()
    loader = acc.prepare(map_loader(generator, length, batch))
    generator.manual_seed(3)
    out = [[x[:, 0].tolist() for x, _ in loader] for _ in range(2)]
    # (gather only when every rank has as many batches: else a rank would wait alone)
    gathered = [acc.gather_for_metrics(x)[:, 0].tolist() for x, _ in loader] if even else []
    return [out, gathered, len(loader)]


def compare() -> dict[str, Any]:
    results = {}
    for split, even, length, batch in [
        (False, True, 22, 4),
        (False, False, 22, 4),
        (True, True, 22, 4),
        (True, False, 21, 4),
        (False, True, 3, 2),
    ]:
        key = f"split={split} even={even} n={length} b={batch}"
        results[key] = (
            batches(True, split, even, length, batch),
            batches(False, split, even, length, batch),
        )
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    stream = acc.prepare(DataLoader(RankStream(11), batch_size=2))
    results["stream"] = [acc.gather_for_metrics(b["x"])[:, 0].tolist() for b in stream]
    # Resuming mid-epoch: the same rows as the uninterrupted pass.
    loader = acc.prepare(map_loader(torch.Generator().manual_seed(5), 20, 2))
    seen, state = [], None
    for step, (x, _) in enumerate(loader):
        if step == 1:
            state = loader.state_dict()
        seen.append(x[:, 0].tolist())
    loader.load_state_dict(state)
    results["resumed"] = ([x[:, 0].tolist() for x, _ in loader], seen[2:])
    return results


def test_dispatched_batches_equal_the_ones_each_rank_would_load():
    results = notebook_launcher(
        compare, num_processes=2, start_method="fork", return_all=True, **QUIET
    )
    for rank, result in enumerate(results):
        for key, value in result.items():
            if key.startswith("split"):
                dispatched, loaded = value
                assert dispatched == loaded, f"rank {rank}, {key}"
        # Only rank 0's stream was read: 11 items, no duplicates (gather_for_metrics).
        assert [x for step in result["stream"] for x in step] == [float(i) for i in range(11)]
        resumed, expected = result["resumed"]
        assert resumed == expected
    first = results[0]["split=False even=True n=22 b=4"][0]
    assert sorted(x for step in first[1] for x in step) == [float(i) for i in range(22)]
