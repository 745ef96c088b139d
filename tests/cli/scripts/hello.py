"""Prints who it is on every rank, with an all_reduce across ranks."""

import os
import sys

import torch
import torch.distributed as dist
from helper import GREETING  # a sibling module: the script's directory is on sys.path

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(
    f"{GREETING} from rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} "
    f"argv={sys.argv[1:]} main={__name__ == '__main__'} sum={total.item():g}"
)
dist.destroy_process_group()
