"""A script whose rank 1 stops at breakpoint() (tests/cli/test_cli_debugger.py)."""

import os

rank = int(os.environ["RANK"])
secret = f"secret of rank {rank}"
if rank == 1:
    breakpoint()
print(f"rank {rank} went on")
