"""Training throughput (steps/s), N=2 CPU ranks (gloo), the same small model and data:

    nbtrain      nbtrain.Accelerator, ranks started by nbtrain.notebook_launcher (fork)
    ddp          hand-written DistributedDataParallel + DistributedSampler, ranks started by
                 torch.multiprocessing (fork)
    accelerate   Hugging Face Accelerate's Accelerator(cpu=True), in ranks started like the ddp
                 baseline (torch.multiprocessing, fork, RANK/WORLD_SIZE/MASTER_* set). Its own
                 notebook_launcher discards return values and goes through torch elastic; starting
                 its ranks like the baseline measures the Accelerator's training loop itself.

Each case runs WARMUP steps, then times STEPS steps inside the ranks (launch and setup are not
timed; rank 0 reports). The cases alternate within each round (each round starting one case
later), so drift on a shared machine hits all alike; the table shows medians and ratios.
Every rank uses one torch thread (two cores).

A second table isolates the Accelerator's own cost from launch-to-launch noise: in ONE pair of
ranks (nbtrain launch), an nbtrain-prepared model and hand-wrapped DDP models train alternately,
in blocks of BLOCK steps whose order rotates every block, so all see the same moments of the
shared machine. Its ratio is the median, over all blocks, of the DDP block's time over the
neighbouring nbtrain block's: a block that another process on the machine preempted is one
outlier among rounds x blocks ratios. A second hand-wrapped DDP model ("ddp, again") is the
noise floor: it differs from "ddp" only by chance. The table also gives the CPU time of rank 0's
stepping thread per step, which waiting for the peer and preemption leave out.

benchmarks/step_cost.py breaks the difference down per wrapper and shows it at other step sizes.

    python benchmarks/train.py [--rounds 9] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch._dynamo  # (DDP imports it; loading it before forking keeps setup fast)
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from common import free_port, rotation
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from nbtrain import notebook_launcher

WARMUP = 30
BLOCK = 25  # steps per block in the same-ranks alternation
BATCH = 32  # per rank
FEATURES, HIDDEN, CLASSES, SAMPLES = 64, 256, 10, 8192


def model_and_data() -> tuple[torch.nn.Module, TensorDataset]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )
    x = torch.randn(SAMPLES, FEATURES)
    return model, TensorDataset(x, torch.randint(0, CLASSES, (SAMPLES,)))


def batches(loader: Any, set_epoch: Any = None) -> Any:
    epoch = 0
    while True:
        if set_epoch is not None:
            set_epoch(epoch)
        yield from loader
        epoch += 1


def timed(step: Any, stream: Any, steps: int) -> float:
    for _ in range(WARMUP):
        step(*next(stream))
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step(*next(stream))
    dist.barrier()
    return steps / (time.perf_counter() - start)


# -- nbtrain ----------------------------------------------------------------------------------


def nbtrain_rank(steps: int) -> float:
    from nbtrain import Accelerator

    acc = Accelerator()
    model, data = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        acc.backward(loss_fn(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    return timed(step, batches(loader), steps)


def run_nbtrain(steps: int) -> float:
    return notebook_launcher(
        nbtrain_rank,
        (steps,),
        num_processes=2,
        start_method="fork",
        progress="off",
        output="none",
    )


# -- hand-written DDP and Accelerate, ranks started by torch.multiprocessing ---------------------


def ddp_rank(steps: int) -> float:
    dist.init_process_group("gloo")
    step, stream = ddp_setup(model_and_data()[1])
    return timed(step, stream, steps)


def accelerate_rank(steps: int) -> float:
    from accelerate import Accelerator

    # cpu=True: without it Accelerate treats CPU-only ranks as DistributedType.NO and trains
    # each rank alone, with no gradient all-reduce (checked below).
    acc = Accelerator(cpu=True)
    assert acc.num_processes == 2, "Accelerate must run data parallel for a fair comparison"
    model, data = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        acc.backward(loss_fn(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    return timed(step, batches(loader), steps)


RANK_FUNCTIONS = {"ddp": ddp_rank, "accelerate": accelerate_rank}


def mp_rank(rank: int, name: str, steps: int, port: int, results: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
    )
    torch.set_num_threads(1)  # as nbtrain's launcher does for 2 ranks on 2 cores
    rate = RANK_FUNCTIONS[name](steps)
    if rank == 0:
        results.put(rate)
    dist.destroy_process_group()


def run_mp(name: str, steps: int) -> float:
    ctx = torch_mp.get_context("fork")
    results = ctx.SimpleQueue()
    torch_mp.start_processes(
        mp_rank, args=(name, steps, free_port(), results), nprocs=2, start_method="fork"
    )
    return results.get()


Blocks = dict[str, list[float]]  # seconds of each block, per case, in the order they ran


def alternating(
    runs: dict[str, tuple[Any, Any]], steps: int, rounds: int, block: int = BLOCK
) -> tuple[Blocks, Blocks]:
    """Wall-clock and main-thread CPU seconds of each block of ``block`` steps of each
    (step, stream), the cases alternating block by block (the order rotating every block),
    ``steps // block`` blocks per case and round. No barrier between blocks: DDP's gradient
    all-reduce keeps the ranks in step; rank 0's clocks are the ones reported.

    The CPU time of the thread running the steps leaves out waiting (for the peer, in the
    all-reduce) and time other processes held the core, so the Python a wrapper adds shows in it
    even when the machine is busy."""
    names = list(runs)
    for step, stream in runs.values():
        for _ in range(WARMUP):
            step(*next(stream))
    wall: Blocks = {name: [] for name in names}
    cpu: Blocks = {name: [] for name in names}
    clock, thread_clock = time.perf_counter, time.thread_time
    for _ in range(rounds):
        dist.barrier()
        for index in range(max(steps // block, 1)):
            for name in rotation(names, index):
                step, stream = runs[name]
                start, start_cpu = clock(), thread_clock()
                for _ in range(block):
                    step(*next(stream))
                cpu[name].append(thread_clock() - start_cpu)
                wall[name].append(clock() - start)
    return wall, cpu


def round_rates(seconds: list[float], rounds: int, block: int = BLOCK) -> list[float]:
    """Steps/s of each round, from its blocks' seconds."""
    per_round = len(seconds) // rounds
    return [
        per_round * block / sum(seconds[i * per_round : (i + 1) * per_round])
        for i in range(rounds)
    ]


def paired_blocks(seconds: list[float], baseline: list[float]) -> float:
    """Speed vs the baseline: the median over blocks of the baseline block's time over this
    case's block run right next to it. A block another process preempted is one outlier among
    rounds x blocks ratios, not a share of a whole round's sum."""
    return statistics.median(b / s for s, b in zip(seconds, baseline, strict=True))


def ddp_setup(data: TensorDataset) -> tuple[Any, Any]:
    """A hand-wrapped DDP model's step and its endless stream of batches (DistributedSampler)."""
    model = torch.nn.parallel.DistributedDataParallel(model_and_data()[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler: DistributedSampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return step, batches(loader, sampler.set_epoch)


def same_ranks(steps: int, rounds: int) -> tuple[Blocks, Blocks]:
    """Wall-clock and CPU seconds of every block, per case (see alternating)."""
    from nbtrain import Accelerator

    acc = Accelerator()
    model, data = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    loss_fn = torch.nn.CrossEntropyLoss()

    def nbtrain_step(x: torch.Tensor, y: torch.Tensor) -> None:
        acc.backward(loss_fn(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    runs = {
        "nbtrain": (nbtrain_step, batches(loader)),
        "ddp": ddp_setup(data),
        "ddp, again": ddp_setup(data),
    }
    return alternating(runs, steps, rounds)


def paired(values: list[float], baseline: list[float]) -> float:
    """The median of the per-round ratios (each round's own conditions cancel out)."""
    return statistics.median(v / b for v, b in zip(values, baseline, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=300)
    options = parser.parse_args()
    cases = {
        "nbtrain": lambda: run_nbtrain(options.steps),
        "ddp": lambda: run_mp("ddp", options.steps),
        "accelerate": lambda: run_mp("accelerate", options.steps),
    }
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(options.rounds):
        for name in rotation(list(cases), round_):  # no case always first
            rates[name].append(cases[name]())
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"N=2 CPU ranks, {options.steps} timed steps x {options.rounds} rounds, "
        f"batch {BATCH}/rank, MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}"
    )
    print("| case | median steps/s | min | max | vs ddp | vs accelerate | paired vs ddp |")
    print("|---|---|---|---|---|---|---|")
    for name, values in rates.items():
        print(
            f"| {name} | {medians[name]:.1f} | {min(values):.1f} | {max(values):.1f} | "
            f"{medians[name] / medians['ddp']:.3f}x | "
            f"{medians[name] / medians['accelerate']:.3f}x | {paired(values, rates['ddp']):.3f}x |"
        )
    same = notebook_launcher(
        same_ranks,
        (options.steps, options.rounds),
        num_processes=2,
        start_method="fork",
        progress="off",
        output="none",
    )
    wall, cpu = same
    print(f"\nSame ranks, alternating in blocks of {BLOCK} steps (Accelerator overhead only):")
    print(
        "| case | median steps/s | min | max | paired vs ddp (per block) | "
        "CPU µs/step (rank 0's stepping thread) | CPU vs ddp |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, seconds in wall.items():
        values = round_rates(seconds, options.rounds)
        cpu_us = statistics.median(cpu[name]) / BLOCK * 1e6
        print(
            f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | "
            f"{max(values):.1f} | {paired_blocks(seconds, wall['ddp']):.3f}x | "
            f"{cpu_us:.0f} | {paired_blocks(cpu[name], cpu['ddp']):.3f}x |"
        )


if __name__ == "__main__":
    main()
