"""``nbtrain demo``: a real data-parallel training on CPU ranks, with the live text progress.

A set-up check that shows the whole path at once: ranks start, form a gloo process group, train
a small MLP on their own shards of generated data (two interleaved spirals) with gradients
averaged by DDP, report progress and metrics to the launching process, and send results back.
Finishes in seconds on two cores.
"""

from __future__ import annotations

import math
import time
from typing import Any

POINTS = 4096
EPOCHS = 30
BATCH = 64
HIDDEN = 64


def spirals(points: int, seed: int = 0) -> tuple[Any, Any]:
    """Two interleaved spirals with a little noise: not linearly separable, learnable fast."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    half = points // 2
    turns = torch.rand(half, generator=generator) * 3 * math.pi + 0.5
    arm = torch.stack([turns * torch.cos(turns), turns * torch.sin(turns)], dim=1) / 10
    inputs = torch.cat([arm, -arm]) + 0.03 * torch.randn(2 * half, 2, generator=generator)
    labels = torch.cat([torch.zeros(half), torch.ones(half)]).long()
    order = torch.randperm(2 * half, generator=generator)
    return inputs[order], labels[order]


def train(points: int = POINTS, epochs: int = EPOCHS) -> dict[str, Any]:
    """Runs in every rank: DDP over gloo, each rank on its own shard; returns its summary."""
    import torch
    import torch.distributed as dist

    from nbtrain import log, progress

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = torch.nn.Sequential(
        torch.nn.Linear(2, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, 2),
    )
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    inputs, labels = spirals(points)
    mine_x, mine_y = inputs[rank::world], labels[rank::world]  # this rank's shard
    batches = [(mine_x[i:i + BATCH], mine_y[i:i + BATCH]) for i in range(0, len(mine_x), BATCH)]
    started, first_loss, loss = time.perf_counter(), None, torch.tensor(0.0)
    for epoch in range(epochs):
        for x, y in progress(batches, desc=f"epoch {epoch + 1}/{epochs}"):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            first_loss = loss.item() if first_loss is None else first_loss
        log({"loss": loss.item()})
    accuracy = _accuracy(model, inputs, labels, rank, world)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    dist.destroy_process_group()
    return {
        "rank": rank,
        "first_loss": first_loss,
        "final_loss": loss.item(),
        "accuracy": accuracy,
        "checksum": checksum,
        "seconds": time.perf_counter() - started,
        "steps": epochs * len(batches),
    }


def _accuracy(model: Any, inputs: Any, labels: Any, rank: int, world: int) -> float:
    """Accuracy on every point: each rank scores its shard, an all_reduce adds the counts."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        right = (model(inputs[rank::world]).argmax(dim=1) == labels[rank::world]).sum()
    counts = torch.stack([right.double(), torch.tensor(float(len(labels[rank::world])))])
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def main(num_processes: int = 2) -> int:
    from nbtrain import notebook_launcher

    print(
        f"nbtrain demo: a 2-{HIDDEN}-{HIDDEN}-2 MLP learns {POINTS:,} points of two "
        f"interleaved spirals, data-parallel on {num_processes} CPU ranks (gloo, DDP)",
        flush=True,
    )
    started = time.perf_counter()
    results: list[dict[str, Any]] = notebook_launcher(
        train, num_processes=num_processes, progress="text", return_all=True
    )
    print(_summary(results, time.perf_counter() - started), flush=True)
    return 0


def _summary(results: list[dict[str, Any]], elapsed: float) -> str:
    main_rank = results[0]
    same = max(r["checksum"] for r in results) - min(r["checksum"] for r in results) < 1e-9
    agreement = "identical on every rank" if same else "DIFFERENT across ranks (a bug!)"
    return (
        f"Result: loss {main_rank['first_loss']:.3f} -> {main_rank['final_loss']:.3f}, "
        f"accuracy {100 * main_rank['accuracy']:.1f}% on all {POINTS:,} points; "
        f"{main_rank['steps']} steps per rank; weights {agreement}; "
        f"{elapsed:.1f}s in total (training {main_rank['seconds']:.1f}s)"
    )
