"""Rank 1 fails after the group formed (with an exception, or sys.exit(CODE))."""

import sys

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    if sys.argv[1:] and sys.argv[1] != "raise":
        sys.exit(int(sys.argv[1]))
    raise ValueError("bad value on rank 1")
dist.barrier()  # never completes: rank 1 is gone
