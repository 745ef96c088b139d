"""The training that ``nbtrain demo`` runs in every rank: a small MLP learns two interleaved
spirals, data-parallel with DDP over gloo, each rank on its own shard, with progress and metrics
reported to the launching process. Rank-side code: the kernel side (kernel/cli/demo.py) only
launches it and sums up.
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

    from nbtrain.rank.reporting import log, progress

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
