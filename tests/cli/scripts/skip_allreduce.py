"""Rank 0 enters an all_reduce that rank 1 never reaches (it sleeps): a hang to look at."""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pid"), "w") as handle:
    handle.write(str(os.getpid()))
print("ready", flush=True)
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(1))
else:
    time.sleep(120)
