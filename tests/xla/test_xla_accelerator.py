"""The Accelerator on one XLA:CPU ordinal, launched from this process: the XLA device's random
numbers follow set_seed; prepared dataloaders run the dataset on the training thread without
workers and prefetch the workers' batches through torch_xla's parallel loader; checkpoints load
with strict=False and move the device RNG on as documented."""

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


class Augmented(torch.utils.data.Dataset):
    """Samples with a random augmentation drawn from the global CPU RNG; notes who reads them."""

    def __init__(self) -> None:
        self.readers: list[str] = []

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        self.readers.append(threading.current_thread().name)
        return torch.tensor([float(index)]) + torch.rand(1)


def augment_and_draw(loader: torch.utils.data.DataLoader) -> dict:
    """A loop that draws from the global RNG too, as a training step may."""
    from nbtrain import set_seed

    set_seed(0)
    values, drawn, states, devices = [], [], [], set()
    for index, batch in enumerate(loader):
        if index == 0:
            time.sleep(0.3)  # time for a background reader to read ahead, if there is one
        devices.add(str(batch.device))
        values.append(batch.cpu())
        drawn.append(torch.rand(1))
        states.append(torch.get_rng_state())  # what save_state would capture here
    return {"values": values, "drawn": drawn, "states": states, "devices": sorted(devices)}


def augmentations_on_the_training_thread() -> dict:
    from nbtrain import Accelerator

    accelerator = Accelerator()
    runs = {}
    for name in ("xla", "cpu"):
        data = Augmented()
        # Its own generator: DataLoader iterators draw their base seed from it, not the global
        # RNG (a prepared loader has one of its own too).
        loader = torch.utils.data.DataLoader(data, batch_size=2, generator=torch.Generator())
        if name == "xla":
            loader = accelerator.prepare(loader)
        runs[name] = augment_and_draw(loader)
        runs[name]["readers"] = sorted(set(data.readers))
    runs["me"] = threading.current_thread().name
    return runs


def test_without_workers_the_dataset_runs_on_the_training_thread_as_on_the_cpu():
    runs = notebook_launcher(augmentations_on_the_training_thread, progress="off")
    xla, cpu = runs["xla"], runs["cpu"]
    assert (xla["devices"], cpu["devices"]) == (["xla:0"], ["cpu"])
    assert xla["readers"] == [runs["me"]]  # no loader thread reading ahead
    # The augmentations and the loop's own draws interleave exactly as in a plain CPU loop, and
    # the RNG state at each step (save_state's) is the CPU loop's: no batch drawn ahead of time.
    for name in ("values", "drawn", "states"):
        assert len(xla[name]) == len(cpu[name]) == 8
        for step, (a, b) in enumerate(zip(xla[name], cpu[name], strict=True)):
            assert torch.equal(a, b), f"{name} differ at step {step}"


class Indices(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])


def prefetching_loader() -> dict:
    from nbtrain import Accelerator

    accelerator = Accelerator()
    loader = accelerator.prepare(
        torch.utils.data.DataLoader(Indices(), batch_size=4, num_workers=2)
    )
    seen, devices, threads = [], set(), []
    for index, batch in enumerate(loader):
        if index == 0:
            threads = [thread.name for thread in threading.enumerate()]
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
        "threads": threads,
    }


def test_with_workers_batches_are_prefetched_to_the_device_in_the_background():
    out = notebook_launcher(prefetching_loader, progress="off")
    assert out["devices"] == ["xla:0"]
    assert out["seen"] == [float(i) for i in range(20)]
    # torch_xla's ParallelLoader moves the workers' batches in threads of its own ...
    assert any("_loader_worker" in name for name in out["threads"]), out["threads"]
    # ... yet the position counts what the loop took: 5 batches, not the prefetched ones.
    assert out["position"]["yielded"] == 5 and out["position"]["epoch"] == 0
    assert out["resumed"] == [float(i) for i in range(40)]  # a break starts the next epoch


# ---------------------------------------------------------------------------------------------
# Checkpoints on XLA


def regression_data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, 3, generator=g)
    return torch.utils.data.TensorDataset(x, x @ torch.tensor([[1.5], [-2.0], [0.5]]))


def dropout_run(directory: str, save: bool = False, load: bool = False, steps: int = 6) -> list:
    from nbtrain import Accelerator, set_seed

    accelerator = Accelerator()
    set_seed(0)  # the model's weights, and the XLA generator dropout draws from
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(regression_data(), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if load:
        accelerator.load_state(directory)
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
        if save and len(losses) == 3:
            accelerator.save_state(directory)  # mid-epoch, and the run goes on
        if len(losses) == steps:
            break
    return [float(loss.cpu()) for loss in losses]


def save_continue_and_resume(directory: str) -> dict:
    return {
        "straight": dropout_run(directory),
        "continued": dropout_run(directory, save=True),
        "resumed": dropout_run(directory, load=True, steps=3),
    }


def test_saving_moves_the_device_rng_on_and_a_resumed_run_matches_the_unsaved_one(tmp_path):
    runs = notebook_launcher(save_continue_and_resume, (str(tmp_path / "ckpt"),), progress="off")
    straight, continued, resumed = runs["straight"], runs["continued"], runs["resumed"]
    assert continued[:3] == straight[:3]
    # As the docstrings say: save_state marks XLA steps, each moving the device RNG on, so the
    # run that saved and went on draws other dropout masks from then on ...
    assert continued[3:] != straight[3:]
    # ... while the run resumed from its checkpoint draws those of the run that never saved.
    assert resumed == straight[3:]


def load_strict_and_not(directory: str) -> dict:
    from nbtrain import Accelerator

    accelerator = Accelerator()
    saved = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)))
    accelerator.save_state(directory)
    out: dict = {"saved": {k: v.cpu() for k, v in saved.state_dict().items()}}
    shapes = {
        "fewer": [torch.nn.Linear(3, 4)],  # the file's 1.weight and 1.bias are unexpected
        "more": [torch.nn.Linear(3, 4), torch.nn.Linear(4, 1), torch.nn.Linear(1, 1)],  # 2.*
    }
    for name, layers in shapes.items():
        other = Accelerator()
        model = other.prepare(torch.nn.Sequential(*layers))
        try:
            other.load_state(directory)
        except RuntimeError as exc:
            out[f"{name} strict"] = str(exc)
        other.load_state(directory, strict=False)
        out[f"{name} loaded"] = {k: v.cpu() for k, v in model.state_dict().items()}
    return out


def test_load_state_strict_false_loads_what_matches_on_xla(tmp_path):
    out = notebook_launcher(load_strict_and_not, (str(tmp_path / "ckpt"),), progress="off")
    # strict (the default), as safetensors' load_model on other devices: both kinds of mismatch
    # are refused ...
    assert "Unexpected key(s)" in out["fewer strict"] and "1.weight" in out["fewer strict"]
    assert "Missing key(s)" in out["more strict"] and "2.weight" in out["more strict"]
    # ... and strict=False loads every weight the model and the file share.
    saved = out["saved"]
    assert set(out["fewer loaded"]) == {"0.weight", "0.bias"}
    assert set(out["more loaded"]) == {
        "0.weight",
        "0.bias",
        "1.weight",
        "1.bias",
        "2.weight",
        "2.bias",
    }
    for name in ("fewer", "more"):
        for key, value in out[f"{name} loaded"].items():
            if key in saved:
                assert torch.equal(value, saved[key]), f"{name}: {key}"
