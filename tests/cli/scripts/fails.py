"""Rank 1 fails while rank 0 waits at a barrier (tests/cli/test_cli_postmortem.py)."""

import os

import torch.distributed as dist

dist.init_process_group("gloo")
rank = int(os.environ["RANK"])
secret = f"secret of rank {rank}"


def step(batch):
    scale = 3
    if rank == 1:
        raise ValueError(f"bad batch {batch * scale}")
    return batch


step(7)
dist.barrier()
