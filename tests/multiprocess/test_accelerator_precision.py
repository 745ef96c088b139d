"""The launcher's mixed_precision= is every Accelerator's default in the ranks, and autocast
really computes in that dtype. Runs under spawn and forkserver with notebook-style code
(classes and functions defined inside the test, so they travel by value, as from a notebook)."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from nbtrain import Accelerator, notebook_launcher

pytestmark = pytest.mark.timeout(240)

QUIET: dict[str, Any] = {"progress": "off", "output": "none"}


def test_launcher_precision_reaches_the_ranks_under_spawn():
    class TinyNet(torch.nn.Module):  # defined here, like a notebook cell
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(
                torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
            )

        def forward(self, x):
            return self.layers(x)

    class Squares(Dataset):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, index: int):
            return torch.full((4,), float(index)), torch.tensor([float(index) ** 2])

    def run():
        acc = Accelerator()
        inner_dtypes = []
        model = TinyNet()
        model.layers[0].register_forward_hook(lambda m, i, out: inner_dtypes.append(out.dtype))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        loader = DataLoader(Squares(), batch_size=2, num_workers=2)
        model, optimizer, loader = acc.prepare(model, optimizer, loader)
        outputs = []
        for x, y in loader:
            out = model(x)
            outputs.append(out.dtype)
            acc.backward(torch.nn.functional.mse_loss(out, y))
            optimizer.step()
            optimizer.zero_grad()
        with acc.autocast():
            product = torch.ones(2, 2) @ torch.ones(2, 2)
        # A whole prepared module still pickles (torch.save(model)) with its autocast wrapper.
        plain = acc.prepare(torch.nn.Sequential(torch.nn.Linear(4, 1)))
        buffer = io.BytesIO()
        torch.save(acc.unwrap_model(plain), buffer)
        buffer.seek(0)
        reloaded = torch.load(buffer, weights_only=False)
        return {
            "default": acc.mixed_precision,
            "explicit": Accelerator(mixed_precision="no").mixed_precision,
            "autocast": product.dtype,
            "inner": set(inner_dtypes),
            "outputs": set(outputs),
            "reloaded": reloaded(torch.ones(1, 4)).dtype,
            "batches": len(outputs),
        }

    results = notebook_launcher(
        run,
        num_processes=2,
        start_method="spawn",
        mixed_precision="bf16",
        return_all=True,
        **QUIET,
    )
    for result in results:
        assert result["default"] == "bf16"
        assert result["explicit"] == "no"
        assert result["autocast"] == torch.bfloat16
        assert result["inner"] == {torch.bfloat16}, "the model computes in bf16"
        assert result["outputs"] == {torch.float32}, "and returns float32, as in Accelerate"
        assert result["reloaded"] == torch.float32
        assert result["batches"] == 3


def test_fp16_with_grad_scaler_under_forkserver():
    """fp16 with a grad scaler on real ranks: clip_grad_norm_ unscales first, so the norm it
    returns and the weights after each step are those of an fp32-gradient reference (the same
    fp16 forward, no loss scaling) clipped the same way."""

    def run():
        from nbtrain.accelerator.front.handlers import GradScalerKwargs

        # A power-of-two scale small enough not to overflow: scaling is then exact in fp16.
        acc = Accelerator(kwargs_handlers=[GradScalerKwargs(init_scale=256.0)])
        model = torch.nn.Linear(3, 1)
        with torch.no_grad():  # fixed, large enough that every step clips (norm >> 0.5)
            model.weight.fill_(1.0)
            model.bias.fill_(0.5)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = acc.prepare(model, optimizer)
        start = [p.detach().clone() for p in model.parameters()]
        scale = acc.scaler.get_scale()
        x = torch.ones(4, 3) * (acc.process_index + 1)
        norms, skipped = [], []
        for _ in range(3):
            acc.backward(model(x).pow(2).mean())
            norms.append(float(acc.clip_grad_norm_(model.parameters(), 0.5)))
            optimizer.step()
            skipped.append(acc.optimizer_step_was_skipped)
            optimizer.zero_grad()
        params = [p.detach().clone() for p in model.parameters()]
        return acc.mixed_precision, scale, start, norms, skipped, params

    results = notebook_launcher(
        run,
        num_processes=2,
        start_method="forkserver",
        mixed_precision="fp16",
        return_all=True,
        **QUIET,
    )
    (mode, scale, start, norms, skipped, params0), (*_, params1) = results
    assert mode == "fp16" and scale == 256.0 and skipped == [False] * 3
    assert all(torch.equal(a, b) for a, b in zip(params0, params1, strict=True)), "DDP in sync"
    # The reference: fp32 gradients of the same fp16 forward, averaged over the two ranks.
    reference = torch.nn.Linear(3, 1)
    with torch.no_grad():
        for p, value in zip(reference.parameters(), start, strict=True):
            p.copy_(value)
    expected_norms = []
    for _ in range(3):
        for rank in range(2):
            with torch.autocast("cpu", dtype=torch.float16):
                out = reference(torch.ones(4, 3) * (rank + 1))
            (out.float().pow(2).mean() / 2).backward()  # DDP averages over 2 ranks
        expected_norms.append(float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)))
        with torch.no_grad():
            for p in reference.parameters():
                p -= 0.1 * p.grad
                p.grad = None
    assert min(expected_norms) > 0.5, "the reference clips every step"
    assert norms == pytest.approx(expected_norms, rel=1e-5)
    for got, want in zip(params0, reference.parameters(), strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
