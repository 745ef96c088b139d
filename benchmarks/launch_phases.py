"""Where a trivial fork launch's round trip goes (N=2, gloo init + one all_reduce), nbtrain
against raw ``torch.multiprocessing`` fork, alternated in one run. Rank 0 stamps the wall
clock as its function begins and returns; the launching process stamps the call and the
return, so each launch splits into:

- **to the function**: the launch call to the function's first line in rank 0 (the kernel's
  work before the first fork, the forks, the rank's set-up);
- **the function**: gloo init + one all_reduce (it waits for rank 1 to start as well);
- **after the return**: the function's return in rank 0 to the launch's return (sending the
  result, the ranks' exit, noticing and reaping it, the launch's ending).

    python benchmarks/launch_phases.py [--rounds 15]

To compare two versions of nbtrain, run it alternately with each on PYTHONPATH (the raw fork
rows are the same code in both runs: the load's share).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from common import free_port, rotation

from nbtrain import notebook_launcher

PHASES = ("to the function", "the function", "after the return", "round trip")


def stamped() -> tuple[float, float]:
    """What both launches run; rank 0's (begin, return) wall-clock times."""
    began = time.time()
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return began, time.time()


STAMPS = multiprocessing.Array("d", 2, lock=False)  # raw fork: rank 0 writes its stamps here


def raw_rank(rank: int, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    began, returned = stamped()
    if rank == 0:
        STAMPS[0], STAMPS[1] = began, returned


def raw_fork() -> tuple[float, float]:
    torch_mp.start_processes(raw_rank, args=(free_port(),), nprocs=2, start_method="fork")
    return STAMPS[0], STAMPS[1]


def nbtrain_fork() -> tuple[float, float]:
    return notebook_launcher(
        stamped, num_processes=2, start_method="fork", progress="off", output="none"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    torch.set_num_threads(1)
    cases = {"raw torch fork": raw_fork, "nbtrain fork": nbtrain_fork}
    for case in cases.values():
        case()  # untimed: the first launch imports what later ones find imported
    samples: dict[str, dict[str, list[float]]] = {
        name: {phase: [] for phase in PHASES} for name in cases
    }
    for round_ in range(options.rounds):
        for name in rotation(list(cases), round_):
            called = time.time()
            began, returned = cases[name]()
            ended = time.time()
            for phase, seconds in zip(
                PHASES,
                (began - called, returned - began, ended - returned, ended - called),
                strict=True,
            ):
                samples[name][phase].append(seconds * 1000)
    load = os.getloadavg()
    print(f"Fork launch phases, N=2, {options.rounds} alternated rounds, "
          f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; median (min) in ms\n")
    print("| phase | " + " | ".join(cases) + " |")
    print("|---|" + "---|" * len(cases))
    for phase in PHASES:
        cells = [
            f"{statistics.median(samples[name][phase]):.1f} ({min(samples[name][phase]):.1f})"
            for name in cases
        ]
        print(f"| {phase} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
