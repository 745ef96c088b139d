"""The Accelerator's collectives, gradient accumulation and checkpoints across 4 XLA:CPU ordinals
(threads of one host process), each checked against what plain torch computes on the CPU.

The ordinals' collectives need the test-only workaround of support.py (torch_xla 2.9.0): its
ENV in the host's environment, models built under its lock (the replicas share torch's CPU RNG),
and no implicit sync of a value that depends on a collective before the step mark. Values are
read (``.cpu()``) only once the step that computed them has been marked.

One launch per test, with every check of that launch's function in the one test, so the file
stays at a few launches.
"""

from __future__ import annotations

import pytest
import support
import torch

from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(180)

ORDINALS, LR = 4, 0.1


@pytest.fixture
def workaround(monkeypatch):
    for name, value in support.ENV.items():
        monkeypatch.setenv(name, value)


def regression_data(count: int = 32) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(count, 3, generator=g)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5]]) + 0.3
    return torch.utils.data.TensorDataset(x, y)


class Indices(torch.utils.data.Dataset):
    """10 samples: with 4 ordinals x 2, the second step wraps around to even the ranks out."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


# ---------------------------------------------------------------------------------------------
# gather / gather_for_metrics / reduce / broadcast / pad / gather of objects; accumulation


def collectives_and_accumulation() -> dict:
    from nbtrain import Accelerator

    lock = support.install()
    accelerator = Accelerator(gradient_accumulation_steps=2)
    rank, device = accelerator.process_index, accelerator.device
    out: dict = {"rank": rank}
    # Computed on the device (pending work that differs per ordinal, which nbtrain runs apart
    # from the collective), with different first dimensions on every ordinal, one of them empty.
    gathered = accelerator.gather(torch.arange(rank, dtype=torch.float32, device=device) + rank)
    summed = accelerator.reduce(torch.tensor([rank + 1.0, 2.0], device=device), "sum")
    mean = accelerator.reduce(torch.tensor([float(rank)], device=device), "mean")
    largest = accelerator.reduce(torch.tensor([float(rank)], device=device), "max")
    shared = accelerator.broadcast(torch.full((2,), float(rank), device=device), from_process=2)
    padded = accelerator.pad_across_processes(torch.ones(rank + 1, device=device), pad_index=-1)
    out["objects"] = accelerator.gather_for_metrics([f"rank{rank}"])
    out["values"] = [t.cpu() for t in (gathered, summed, mean, largest, shared, padded)]

    metrics = []
    loader = accelerator.prepare(torch.utils.data.DataLoader(Indices(), batch_size=2))
    for batch in loader:
        metrics.append(accelerator.gather_for_metrics(batch).cpu())
    out["metrics"] = metrics

    with lock:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
    out["initial"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    train = torch.utils.data.DataLoader(regression_data(), batch_size=2)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    batches, synced = [], []
    for x, y in train:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            synced.append(accelerator.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()
        batches.append((x, y))
    out["synced"] = synced
    out["batches"] = [(x.cpu(), y.cpu()) for x, y in batches]
    out["final"] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return out


def accumulated_reference(initial: dict, per_rank: list[list[tuple]], micro: int) -> dict:
    """Plain torch: each step averages the gradients of every ordinal's ``micro`` batches."""
    model = torch.nn.Linear(3, 1)
    model.load_state_dict(initial)
    for start in range(0, len(per_rank[0]), micro):
        total = [torch.zeros_like(p) for p in model.parameters()]
        for batches in per_rank:
            for x, y in batches[start : start + micro]:
                model.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                for acc, p in zip(total, model.parameters(), strict=True):
                    acc += p.grad
        with torch.no_grad():
            for acc, p in zip(total, model.parameters(), strict=True):
                p -= LR * acc / (len(per_rank) * micro)
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_collectives_and_gradient_accumulation_across_ordinals(workaround):
    results = notebook_launcher(
        collectives_and_accumulation, num_processes=ORDINALS, return_all=True, progress="off"
    )
    assert [r["rank"] for r in results] == list(range(ORDINALS))
    for r in results:
        gathered, summed, mean, largest, shared, padded = r["values"]
        assert gathered.tolist() == [1.0, 2.0, 3.0, 3.0, 4.0, 5.0]  # ranks 1..3; rank 0 had none
        assert summed.tolist() == [10.0, 8.0]
        assert mean.tolist() == [1.5] and largest.tolist() == [3.0]
        assert shared.tolist() == [2.0, 2.0]
        assert padded.tolist() == [1.0] * (r["rank"] + 1) + [-1.0] * (3 - r["rank"])
        assert r["objects"] == ["rank0", "rank1", "rank2", "rank3"]
        # Exactly the 10 samples, the wrapped-around repeats of the last step dropped.
        assert torch.cat(r["metrics"]).tolist() == list(range(10))
        # 4 batches per ordinal, accumulation of 2: gradients sync on every second one.
        assert r["synced"] == [False, True, False, True]

    expected = accumulated_reference(results[0]["initial"], [r["batches"] for r in results], 2)
    for r in results:
        for name, value in expected.items():
            torch.testing.assert_close(r["final"][name], value, rtol=1e-5, atol=1e-6)
    moved = not torch.equal(results[0]["final"]["weight"], results[0]["initial"]["weight"])
    assert moved


# ---------------------------------------------------------------------------------------------
# save_state / load_state: resumed == uninterrupted, with dropout drawing on every device


def train_phase(steps: int, save: str | None = None, load: str | None = None) -> dict:
    from nbtrain import Accelerator, set_seed

    lock = support.install()
    accelerator = Accelerator()
    with lock:  # the CPU RNG is shared by the ordinals' threads
        set_seed(0)  # also this ordinal's XLA generator (dropout below draws from it)
        model = torch.nn.Sequential(
            torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1)
        )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    # Its own generator: the shuffle seed must not depend on how the threads interleave.
    loader = torch.utils.data.DataLoader(
        regression_data(), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(7)
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if load:
        accelerator.load_state(load)
    losses, inputs = [], []
    while len(losses) < steps:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
            inputs.append(x)
            if len(losses) == steps:
                break  # mid-epoch
    if save:
        accelerator.save_state(save)  # ends the pending step: the losses are computed after it
    else:
        accelerator.wait_for_everyone()  # the same: a step mark before reading values
    return {
        "losses": [float(loss.cpu()) for loss in losses],
        "inputs": [x.cpu() for x in inputs],
        "state": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }


def resume_round_trip(directory: str) -> dict:
    straight = train_phase(9)
    first = train_phase(3, save=directory)
    resumed = train_phase(6, load=directory)
    return {"straight": straight, "first": first, "resumed": resumed}


def test_checkpoint_round_trip_across_ordinals_resumes_bitwise(workaround, tmp_path):
    directory = str(tmp_path / "ckpt")
    results = notebook_launcher(
        resume_round_trip, (directory,), num_processes=ORDINALS, return_all=True, progress="off"
    )
    for rank, r in enumerate(results):
        straight, first, resumed = r["straight"], r["first"], r["resumed"]
        assert first["losses"] == straight["losses"][:3]
        # Mid-epoch resume: the same batches (data position), and the same dropout masks (the
        # XLA RNG), Adam moments and weights, so the very same losses and final weights.
        for a, b in zip(resumed["inputs"], straight["inputs"][3:], strict=True):
            assert torch.equal(a, b), f"ordinal {rank}: resumed on other batches"
        assert resumed["losses"] == straight["losses"][3:], f"ordinal {rank}"
        for name, value in straight["state"].items():
            assert torch.equal(resumed["state"][name], value), f"ordinal {rank}: {name}"
    # The replicas agree (gradients averaged), and each ordinal had batches of its own.
    for r in results[1:]:
        for name, value in results[0]["straight"]["state"].items():
            assert torch.equal(r["straight"]["state"][name], value)
    assert not torch.equal(results[0]["straight"]["inputs"][0], results[1]["straight"]["inputs"][0])
    assert (tmp_path / "ckpt" / "nbtrain_checkpoint.json").is_file()
