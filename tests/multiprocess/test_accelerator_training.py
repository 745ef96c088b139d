"""Training with the Accelerator on real ranks equals single-process training on the big batch.

Each launch returns what the ranks computed; the single-process references run here, in the
test process, with plain torch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo  # (DDP imports it; loading it once here keeps forked ranks fast)
import torch.distributed as dist
from torch.nn.functional import mse_loss
from torch.utils.data import DataLoader, TensorDataset

from nbtrain import Accelerator, notebook_launcher, progress
from nbtrain.display.runstate import RunState
from nbtrain.shared.events import Event, Progress

pytestmark = pytest.mark.timeout(180)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}
LR = 0.05


def dataset(samples: int) -> TensorDataset:
    x = torch.linspace(-1, 1, samples * 3).reshape(samples, 3)
    y = (x @ torch.tensor([[0.5], [-1.0], [2.0]])) + 0.1 * torch.cos(torch.arange(samples))[:, None]
    return TensorDataset(x, y)


def fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().cpu().clone() for p in model.parameters()]


def ddp_run(world: int) -> dict:
    """Plain data parallel: 2 samples per rank per step, an LR schedule."""
    acc = Accelerator()
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    loader = DataLoader(dataset(6 * world), batch_size=2)
    schedule, loader, model, optimizer = acc.prepare(schedule, loader, model, optimizer)
    lrs = []
    for x, y in loader:
        acc.backward(mse_loss(model(x), y))
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        lrs.append(schedule.get_last_lr()[0])
    return {
        "params": parameters(acc.unwrap_model(model)),
        "lrs": lrs,
        "unwrapped": acc.unwrap_model(model) is not model or world == 1,
        "type": acc.distributed_type.value,
        "initialized": dist.is_initialized(),
    }


def accumulation_run(world: int) -> dict:
    """1 sample per rank per micro-step, 2 micro-steps per step, clipping every micro-step,
    5 micro-steps per epoch: the last step of each epoch has a single micro-step."""
    acc = Accelerator(gradient_accumulation_steps=2)
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model, optimizer, loader = acc.prepare(model, optimizer, DataLoader(dataset(5 * world), 1))
    synced, grads_agree = [], []
    for _epoch in range(2):
        for x, y in progress(loader, desc="train"):
            with acc.accumulate(model):
                acc.backward(mse_loss(model(x), y))
                acc.clip_grad_norm_(model.parameters(), 0.5)
                grad = acc.unwrap_model(model).weight.grad.detach().clone()
                everyone = acc.gather(grad)
                grads_agree.append(bool((everyone == everyone[:1]).all()))
                synced.append(acc.sync_gradients)
                optimizer.step()
                optimizer.zero_grad()
    return {"params": parameters(acc.unwrap_model(model)), "synced": synced, "agree": grads_agree}


def both(world: int) -> tuple[dict, dict]:
    return ddp_run(world), accumulation_run(world)


def reference_ddp(world: int) -> tuple[list[torch.Tensor], list[float]]:
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    # Accelerate's rule without split_batches: the scheduler advances once per rank and step.
    lrs = [LR / (1 + world * step) for step in range(4)]
    for step, (x, y) in enumerate(DataLoader(dataset(6 * world), batch_size=2 * world)):
        optimizer.param_groups[0]["lr"] = lrs[step]
        mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return parameters(model), lrs[1:]


def reference_accumulation(world: int) -> list[torch.Tensor]:
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    data = dataset(5 * world)
    for _epoch in range(2):
        # Steps of 2 micro-steps: samples [0, 2w), [2w, 4w); then the dataloader's end forces a
        # step over [4w, 5w) whose loss is still divided by gradient_accumulation_steps (2).
        for start, stop, scale in ((0, 2, 1.0), (2, 4, 1.0), (4, 5, 0.5)):
            x, y = data[start * world : stop * world]
            (mse_loss(model(x), y) * scale).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            optimizer.zero_grad()
    return parameters(model)


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_and_accumulation_equal_the_big_batch(world, received):
    results = notebook_launcher(
        both, (world,), num_processes=world, start_method="fork", return_all=True, **QUIET
    )
    expected_params, expected_lrs = reference_ddp(world)
    expected_accumulated = reference_accumulation(world)
    for ddp, accumulated in results:
        assert ddp["type"] == "MULTI_CPU" and ddp["unwrapped"]
        for got, want in zip(ddp["params"], expected_params, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert ddp["lrs"] == pytest.approx(expected_lrs)
        for got, want in zip(accumulated["params"], expected_accumulated, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        # Per epoch: micro-steps 1..5 sync at 2, 4 and at the dataloader's last batch.
        assert accumulated["synced"] == [False, True, False, True, True] * 2
        # Without sync the ranks' gradients differ (no all-reduce ran); after it they agree.
        assert accumulated["agree"] == accumulated["synced"]
    first = [p for p in results[0][0]["params"]]
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(first, other[0]["params"], strict=True))
    check_optimizer_steps_reported(received, world)


def check_optimizer_steps_reported(received: list[Event], world: int) -> None:
    """The ranks report optimizer steps, not micro-steps: 3 an epoch of the 5 accumulation
    micro-steps. As checkpoints and trackers count, it is the most steps any one optimizer took
    (ddp_run's took 3 before); the view's rate and summary count them."""
    state = RunState(list(range(world)))
    for event in list(received):  # (applying appends to received: the fixture records it)
        state.apply(event)
    for rank in range(world):
        last = [e for e in received if isinstance(e, Progress) and e.rank == rank][-1]
        assert (last.step, last.optimizer_steps) == (5, 3 * 2)
        assert state.ranks[rank].optimizer_steps == 6
    assert ", 6 optimizer steps, " in state.done_summary()


def test_one_process_in_the_kernel_needs_no_process_group():
    ddp, accumulated = notebook_launcher(both, (1,), num_processes=1, **QUIET)
    assert ddp["type"] == "NO" and not ddp["initialized"]
    expected_params, expected_lrs = reference_ddp(1)
    for got, want in zip(ddp["params"], expected_params, strict=True):
        torch.testing.assert_close(got, want)
    assert ddp["lrs"] == pytest.approx(expected_lrs)
    for got, want in zip(accumulated["params"], reference_accumulation(1), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
