"""Round trip of a trivial launch (gloo init + one all_reduce, N=2), alternated in one run:

    nbtrain fork, nbtrain warm forkserver, raw torch.multiprocessing fork and spawn,
    and Hugging Face Accelerate's notebook_launcher;

plus the time from a rank raising to WorkerError in the launching process.

    python benchmarks/launch.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from common import alternate, free_port, table

from nbtrain import WorkerError, notebook_launcher

QUIET = {"progress": "off", "output": "none"}


def trivial() -> float:
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def raw_rank(rank: int, world: int, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    trivial()


def raw(method: str) -> None:
    torch_mp.start_processes(raw_rank, args=(2, free_port()), nprocs=2, start_method=method)


def accelerate_launch() -> None:
    from accelerate import notebook_launcher as accelerate_notebook_launcher

    # Accelerate's default is the fixed port 29500; a fresh one per launch avoids TIME_WAIT.
    accelerate_notebook_launcher(trivial, num_processes=2, use_port=str(free_port()))


def failing() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError(time.time())
    dist.init_process_group("gloo")
    dist.barrier()


def failure_latency() -> float:
    try:
        notebook_launcher(failing, num_processes=2, **QUIET)
    except WorkerError as err:
        raised_at = float(err.original.args[0])  # type: ignore[union-attr]
        return time.time() - raised_at
    raise AssertionError("the failing launch did not fail")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-accelerate", action="store_true")
    parser.add_argument("--no-spawn", action="store_true",
                        help="leave out raw spawn (seconds a round: for A/B runs of nbtrain)")
    options = parser.parse_args()
    torch.set_num_threads(1)
    notebook_launcher(trivial, num_processes=2, start_method="forkserver", **QUIET)  # warm it
    cases = {
        "raw torch fork": lambda: raw("fork"),
        "nbtrain fork": lambda: notebook_launcher(trivial, num_processes=2,
                                                  start_method="fork", **QUIET),
        "nbtrain forkserver (warm)": lambda: notebook_launcher(
            trivial, num_processes=2, start_method="forkserver", **QUIET
        ),
    }
    if not options.no_spawn:
        cases["raw torch spawn"] = lambda: raw("spawn")
    if not options.no_accelerate:
        cases["accelerate notebook_launcher"] = accelerate_launch
    samples = alternate(cases, options.rounds)
    print(f"Launch round trip, N=2, {options.rounds} alternated rounds\n")
    print(table(samples, baseline="raw torch fork"))
    latencies = [failure_latency() for _ in range(options.rounds)]
    print(
        f"\nFailure to WorkerError: median {statistics.median(latencies):.3f} s, "
        f"max {max(latencies):.3f} s over {len(latencies)} launches"
    )


if __name__ == "__main__":
    main()
