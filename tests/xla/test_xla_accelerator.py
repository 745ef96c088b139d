"""The Accelerator on one XLA:CPU ordinal, launched from this process: the XLA device's random
numbers follow set_seed, and prepared dataloaders go through torch_xla's parallel loader."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(120)


def dropout_masks() -> dict:
    import torch_xla

    from nbtrain import Accelerator, set_seed

    device = Accelerator().device

    def mask() -> torch.Tensor:
        drawn = torch.nn.functional.dropout(torch.ones(256, device=device), 0.5)
        torch_xla.sync()
        return drawn.cpu()

    set_seed(3)
    first, second = mask(), mask()
    set_seed(3)
    again = mask()
    set_seed(4)
    other = mask()
    return {"first": first, "second": second, "again": again, "other": other}


def test_set_seed_seeds_the_xla_device():
    masks = notebook_launcher(dropout_masks, progress="off")
    assert torch.equal(masks["first"], masks["again"])  # reseeded: the same draws
    assert not torch.equal(masks["first"], masks["second"])  # the generator moves on
    assert not torch.equal(masks["first"], masks["other"])  # another seed, other draws
    assert 0 < int((masks["first"] == 0).sum()) < 256


class Recorded(torch.utils.data.Dataset):
    """Notes which thread reads each sample."""

    def __init__(self) -> None:
        self.readers: list[str] = []

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> torch.Tensor:
        self.readers.append(threading.current_thread().name)
        return torch.tensor([float(index)])


def prefetching_loader() -> dict:
    from nbtrain import Accelerator

    accelerator = Accelerator()
    data = Recorded()
    loader = accelerator.prepare(torch.utils.data.DataLoader(data, batch_size=4))
    seen, devices, read_ahead = [], set(), 0
    for index, batch in enumerate(loader):
        if index == 0:  # the loader thread reads ahead of the training loop (bounded wait)
            deadline = time.monotonic() + 30
            while len(data.readers) <= 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            read_ahead = len(data.readers)
        devices.add(str(batch.device))
        seen += batch.flatten().cpu().tolist()
        if index == 4:
            break  # the parallel loader's threads end with the pass
    position = loader.state_dict()
    resumed = [v for batch in loader for v in batch.flatten().cpu().tolist()]
    return {
        "seen": seen,
        "resumed": resumed,
        "position": position,
        "devices": sorted(devices),
        "read_ahead": read_ahead,
        "readers": sorted(set(data.readers)),
        "me": threading.current_thread().name,
    }


def test_prepared_loaders_prefetch_to_the_device_in_the_background():
    out = notebook_launcher(prefetching_loader, progress="off")
    assert out["devices"] == ["xla:0"]
    assert out["seen"] == [float(i) for i in range(20)]
    # torch_xla's loader thread read the samples, and read ahead of the training loop ...
    assert out["me"] not in out["readers"]
    assert out["read_ahead"] > 4
    # ... yet the position counts what the loop took: 5 batches, not the prefetched ones.
    assert out["position"]["yielded"] == 5 and out["position"]["epoch"] == 0
    assert out["resumed"] == [float(i) for i in range(40)]  # a break starts the next epoch
