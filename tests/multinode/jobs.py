"""Training functions the test nodes launch (importable by the ranks: this directory is on
sys.path of every node process, and ranks are forked from it)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def identity() -> dict:
    """Each rank's view of the world, and an all_reduce across every node."""
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    keys = [
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "TORCHELASTIC_RESTART_COUNT",
    ]
    env = {key: os.environ[key] for key in keys}
    dist.destroy_process_group()
    return {"env": env, "sum": total.item()}


def train(steps: int = 30) -> list[float]:
    """Data-parallel regression: each rank trains on its own shard; gradients are averaged."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(64 * world, 8, generator=generator)
    targets = inputs @ torch.arange(8.0).unsqueeze(1) + 0.5
    mine = slice(rank * 64, (rank + 1) * 64)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(inputs[mine]), targets[mine])
        loss.backward()
        optimizer.step()
    params = [p.detach().clone() for p in model.parameters()]
    dist.destroy_process_group()
    return torch.cat([p.flatten() for p in params]).tolist()


def crash_on(rank_to_fail: int) -> None:
    """One rank raises after the group formed; the others block in a collective."""
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == rank_to_fail:
        raise ValueError(f"boom on rank {rank_to_fail}")
    dist.barrier()  # never completes: the failing rank is gone
    time.sleep(60)


def fail_once(marker: str, rank_to_fail: int) -> dict:
    """The first attempt fails on one rank (the marker file records it); the retry succeeds."""
    result = identity()
    if int(os.environ["RANK"]) == rank_to_fail and not os.path.exists(marker):
        with open(marker, "w") as handle:
            handle.write("failed once")
        raise RuntimeError("transient failure on the first attempt")
    time.sleep(0.5)  # the failing rank's news must reach every node before anyone finishes
    return result


def lost_peer_everywhere() -> None:
    """Every rank fails with what looks like a lost connection (no rank to blame but these)."""
    time.sleep(0.1 * int(os.environ["RANK"]))
    raise RuntimeError("Connection closed by peer [10.0.0.9]:4242")


def only_node_zero_finishes() -> int:
    """Node 0's ranks return at once; the other nodes' ranks keep working."""
    if os.environ["GROUP_RANK"] != "0":
        time.sleep(120)
    return int(os.environ["RANK"])
