"""FSDP2 vs DDP through nbtrain's Accelerator: memory, loss curve and speed, N=2 CPU ranks (gloo).

The same training three times, each in fresh ranks started by nbtrain.notebook_launcher (fork):

    ddp           Accelerator()                             (DistributedDataParallel)
    ddp+mmap      the same, with the allocator setting FSDP ranks on CPU use (glibc returns freed
                  blocks of 4 MiB or more to the system: accelerator.fsdp.return_large_buffers_...):
                  the fair baseline for memory, as it saves DDP memory too
    fsdp2         Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(
                auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]))

A ~50M-parameter residual MLP (6 blocks of 1024 -> 4096 -> 1024) trained with AdamW for STEPS
steps on the same seed and data. Each rank samples its own private memory (USS, psutil: the
pages only this process holds, so memory shared with the parent by fork is not counted) every
20 ms from before the model is built until the last step; the table shows the larger peak of
the two ranks. Steps/s is measured over the steps after WARMUP. The cases alternate over
``--rounds`` rounds (medians); the loss curves of the first round are compared step by step.
Every rank uses one torch thread (two cores).

    python benchmarks/fsdp.py [--rounds 1] [--steps 50]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import psutil
import torch
import torch._dynamo  # (DDP imports it; loading it before forking keeps setup fast)
from common import rotation
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrain import Accelerator, FullyShardedDataParallelPlugin, notebook_launcher

WIDTH, HIDDEN, BLOCKS, BATCH, WARMUP = 1024, 4096, 6, 8, 5


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(BLOCKS)))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class PeakUss:
    """Samples this process's private memory in a thread; ``peak`` is the largest sample."""

    def __init__(self, interval: float = 0.02) -> None:
        self.process = psutil.Process()
        self.peak = self.process.memory_full_info().uss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.peak = max(self.peak, self.process.memory_full_info().uss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_full_info().uss)
        return self.peak


def train(strategy: str, steps: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    if strategy == "ddp+mmap":
        from nbtrain.accelerator.fsdp.strategy import return_large_buffers_to_the_system

        assert return_large_buffers_to_the_system()
    memory = PeakUss()
    plugin = None
    if strategy == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
        )
    acc = Accelerator(fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = Model()
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randn(steps * BATCH * acc.num_processes, WIDTH, generator=torch.Generator())
    target = data[:, :1].sin()
    loader = DataLoader(TensorDataset(data, target), batch_size=BATCH)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    losses: list[float] = []
    start = 0.0
    for step, (x, y) in enumerate(loader):
        if step == WARMUP:
            start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean")))
    rate = (len(losses) - WARMUP) / (time.perf_counter() - start)
    peak = memory.stop()
    peaks = acc.gather(torch.tensor([peak], dtype=torch.float64))
    return {"losses": losses, "rate": rate, "peak": float(peaks.max()), "params": parameters}


def run(strategy: str, steps: int) -> dict[str, Any]:
    result: dict[str, Any] = notebook_launcher(
        train, (strategy, steps), num_processes=2, start_method="fork", progress="off"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50)
    options = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"ddp": [], "ddp+mmap": [], "fsdp2": []}
    for round_ in range(options.rounds):
        for name in rotation(list(results), round_):
            results[name].append(run(name, options.steps))
    ddp, fsdp = results["ddp+mmap"], results["fsdp2"]
    mib = 2**20
    base_peak = statistics.median(r["peak"] for r in ddp)
    base_rate = statistics.median(r["rate"] for r in ddp)
    print(
        f"model: {ddp[0]['params'] / 1e6:.1f}M parameters, AdamW, {options.steps} steps, "
        f"2 CPU ranks, {options.rounds} round(s)\n"
    )
    print("| strategy | peak private memory per rank (MiB) | vs ddp+mmap | steps/s | vs ddp+mmap |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        peak = statistics.median(r["peak"] for r in runs)
        rate = statistics.median(r["rate"] for r in runs)
        print(
            f"| {name} | {peak / mib:.0f} | {peak / base_peak:.2f}x | {rate:.2f} | "
            f"{rate / base_rate:.2f}x |"
        )
    a, b = torch.tensor(ddp[0]["losses"]), torch.tensor(fsdp[0]["losses"])
    diff = (a - b).abs()
    print(
        f"\nloss curves over {len(a)} steps: first {a[0]:.5f}, last ddp+mmap {a[-1]:.5f} / fsdp2 "
        f"{b[-1]:.5f}; max |ddp - fsdp2| = {diff.max():.2e} "
        f"(max relative {float((diff / a.abs()).max()):.2e})"
    )


if __name__ == "__main__":
    main()
