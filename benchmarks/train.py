"""Training throughput (steps/s), N=2 CPU ranks (gloo), the same small model and data:

    nbtrain      nbtrain.Accelerator, ranks started by nbtrain.notebook_launcher (fork)
    ddp          hand-written DistributedDataParallel + DistributedSampler, ranks started by
                 torch.multiprocessing (fork)
    accelerate   Hugging Face Accelerate's Accelerator(cpu=True), in ranks started like the ddp
                 baseline (torch.multiprocessing, fork, RANK/WORLD_SIZE/MASTER_* set). Its own
                 notebook_launcher discards return values and goes through torch elastic; starting
                 its ranks like the baseline measures the Accelerator's training loop itself.

Paired measure, launches taking turns: each round starts one launch of every case, all at once
(three pairs of ranks, each its own launch and process group). After WARMUP steps the launches
train in turns of TURN steps, in a ring (a case's rank 0 waits for its semaphore, runs its turn,
gives the next case's); a waiting launch sleeps. So every case trains in the same seconds of the
shared machine, a few hundred ms apart, instead of in whole launches one after another: on this
2-core VM the speed of one launch drifts by ~6% from second to second, which swamped a 1%
difference when launches ran alone. No launch ends before every launch has run its last turn:
a launch's teardown would load the machine during another's turns. Rank 0 times each turn; a
round's ratio is the baseline's time over the case's over the round's turns; the table gives
the median over rounds, and the median over neighbouring turns. The ring's order rotates every
round. The kernel's own work (nbtrain's launcher loop in this process, which runs through every
turn) is reported apart, as CPU time of this process while the ranks train.

A second table isolates the Accelerator's own cost: in one pair of ranks (an nbtrain launch), an
nbtrain-prepared model and hand-wrapped DDP models train alternately, in blocks of BLOCK steps
whose order rotates every block, so all see the same moments of the shared machine. Each round
is a launch of its own (see launch_per_round). Its ratio is the median, over all
blocks of all rounds, of the DDP block's time over the neighbouring nbtrain block's. A second
hand-wrapped DDP model ("ddp, again") is the noise floor: it differs from "ddp" only by chance.
The table also gives the CPU time of rank 0's stepping thread per step, which waiting for the
peer and preemption leave out.

benchmarks/step_cost.py breaks the difference down per wrapper and shows it at other step sizes.

    python benchmarks/train.py [--rounds 9] [--steps 1200] [--raw every-turn-and-block.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch._dynamo  # (DDP imports it; loading it before forking keeps setup fast)
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from common import free_port, rotation
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from nbtrain import notebook_launcher

T = TypeVar("T")
Step = tuple[Callable[..., None], Any]  # a training step and its endless stream of batches

WARMUP = 30
TURN = 50  # steps per turn in the paired measure
STALL = 300  # seconds a case waits for its turn before it takes the ring for broken
STALLED = "no turn came"
BLOCK = 10  # steps per block in the same-ranks alternation
BATCH = 32  # per rank
FEATURES, HIDDEN, CLASSES, SAMPLES = 64, 256, 10, 8192


def mlp(width: int = HIDDEN) -> torch.nn.Module:
    """The benchmarks' MLP, with the same weights every time (seed 0)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, CLASSES),
    )


def model_and_data() -> tuple[torch.nn.Module, TensorDataset]:
    model = mlp()
    x = torch.randn(SAMPLES, FEATURES)
    return model, TensorDataset(x, torch.randint(0, CLASSES, (SAMPLES,)))


def batches(loader: Any, set_epoch: Any = None) -> Any:
    epoch = 0
    while True:
        if set_epoch is not None:
            set_epoch(epoch)
        yield from loader
        epoch += 1


# -- the paired measure: launches taking turns ---------------------------------------------------

# Made by the benchmark before a round's launches and inherited by their fork ranks: one
# semaphore per case (its turn), and one that each case's rank 0 gives when it has warmed up.
TURNS: list[Any] = []
READY: list[Any] = []


def taking_turns(run: Step, case: int, turns: int) -> list[float]:
    """Rank side: WARMUP steps, then ``turns`` turns of TURN steps, each when this case's
    semaphore is given; rank 0's seconds per turn (the barriers keep its peer in step)."""
    step, stream = warmed(run)
    lead = dist.get_rank() == 0
    mine, following = TURNS[case], TURNS[(case + 1) % len(TURNS)]
    if lead:
        READY[0].release()
    seconds = []
    for _ in range(turns):
        if lead:
            wait_turn(mine)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(TURN):
            step(*next(stream))
        dist.barrier()
        seconds.append(time.perf_counter() - start)
        if lead:
            following.release()
    if lead:  # one more, empty pass of the ring: no launch ends (and loads the machine with
        wait_turn(mine)  # its teardown) while another still has turns to run
        following.release()
    dist.barrier()
    return seconds


def wait_turn(semaphore: Any) -> None:
    if not semaphore.acquire(timeout=STALL):
        raise RuntimeError(
            f"{STALLED} in {STALL} s: another case's launch has stopped (its own error, if "
            "it raised one, is raised from the benchmark's process)"
        )


def warmed(run: Step) -> Step:
    step, stream = run
    for _ in range(WARMUP):
        step(*next(stream))
    return run


def accelerator_step(acc: Any, model: Any, optimizer: Any) -> Any:
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        acc.backward(loss_fn(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    return step


def nbtrain_rank(case: int, turns: int) -> list[float]:
    from nbtrain import Accelerator

    acc = Accelerator()
    data = model_and_data()[1]
    return taking_turns(prepared(acc, data), case, turns)


def ddp_rank(case: int, turns: int) -> list[float]:
    dist.init_process_group("gloo")
    data = model_and_data()[1]
    return taking_turns(ddp_setup(data), case, turns)


def accelerate_rank(case: int, turns: int) -> list[float]:
    from accelerate import Accelerator

    # cpu=True: without it Accelerate treats CPU-only ranks as DistributedType.NO and trains
    # each rank alone, with no gradient all-reduce (prepared checks the model is wrapped).
    acc = Accelerator(cpu=True)
    assert acc.num_processes == 2, "Accelerate must run data parallel for a fair comparison"
    return taking_turns(prepared(acc, model_and_data()[1]), case, turns)


def prepared(acc: Any, data: TensorDataset) -> Step:
    """A fresh model, its optimizer and a loader over ``data``, prepared by ``acc`` (nbtrain's
    or Accelerate's): the step and its endless stream of batches."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel), "not data parallel"
    return accelerator_step(acc, model, optimizer), batches(loader)


RANK_FUNCTIONS = {"ddp": ddp_rank, "accelerate": accelerate_rank}


def mp_rank(rank: int, name: str, case: int, turns: int, port: int, results: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
    )
    torch.set_num_threads(1)  # as nbtrain's launcher does for 2 ranks on 2 cores
    seconds = RANK_FUNCTIONS[name](case, turns)
    if rank == 0:
        results.put((name, seconds))
    dist.destroy_process_group()


def paired_round(order: list[str], turns: int) -> tuple[dict[str, list[float]], float]:
    """One launch of every case, all alive at once, taking turns in ``order``: each case's
    seconds per turn, and this process's CPU seconds per second from the first turn to the end
    of nbtrain's launch (the launcher's loop watching its ranks)."""
    ctx = torch_mp.get_context("fork")
    TURNS[:] = [ctx.Semaphore(0) for _ in order]
    READY[:] = [ctx.Semaphore(0)]
    results = ctx.SimpleQueue()
    others = [
        torch_mp.start_processes(
            mp_rank,
            args=(name, order.index(name), turns, free_port(), results),
            nprocs=2,
            join=False,
            start_method="fork",
        )
        for name in order
        if name != "nbtrain"
    ]
    started: list[tuple[float, float]] = []  # this process's CPU and wall clock at the first turn
    starter = threading.Thread(target=_start_when_ready, args=(len(order), started), daemon=True)
    starter.start()
    try:
        seconds = {
            "nbtrain": notebook_launcher(nbtrain_rank, (order.index("nbtrain"), turns), **LAUNCH)
        }
    except BaseException:
        cause = root_cause(others)
        for context in others:  # they would wait for their turn until STALL
            for process in context.processes:
                process.kill()
        if cause is not None:
            raise cause from None
        raise
    cpu, wall = started[0]
    kernel_share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    for context in others:
        while not context.join():
            pass
    for _ in others:
        name, values = results.get()
        seconds[name] = values
    return seconds, kernel_share


def root_cause(contexts: list[Any]) -> BaseException | None:
    """The error a rank of another case raised of its own (not for want of a turn), if any."""
    errors = []
    for context in contexts:
        try:
            context.join(timeout=0)
        except Exception as error:  # (the rank's own traceback is in its message)
            errors.append(error)
    own = [error for error in errors if STALLED not in str(error)]
    return next(iter(own or errors), None)


def _start_when_ready(cases: int, started: list[tuple[float, float]]) -> None:
    for _ in range(cases):
        READY[0].acquire()  # every launch has warmed up: the first turn starts
    started.append((time.process_time(), time.perf_counter()))
    TURNS[0].release()


Blocks = dict[str, list[float]]  # seconds of each block, per case, in the order they ran


def alternating(
    runs: dict[str, Step], steps: int, rounds: int, block: int = BLOCK
) -> tuple[Blocks, Blocks]:
    """Wall-clock and main-thread CPU seconds of each block of ``block`` steps of each
    (step, stream), the cases alternating block by block (the order rotating every block),
    ``steps // block`` blocks per case and round. No barrier between blocks: DDP's gradient
    all-reduce keeps the ranks in step; rank 0's clocks are the ones reported.

    The CPU time of the thread running the steps leaves out waiting (for the peer, in the
    all-reduce) and time other processes held the core, so the Python a wrapper adds shows in it
    even when the machine is busy."""
    names = list(runs)
    for run in runs.values():
        warmed(run)
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


LAUNCH: dict[str, Any] = {
    "num_processes": 2,
    "start_method": "fork",
    "progress": "off",
    "output": "none",
}


def launch_per_round(function: Callable[..., T], args: tuple[Any, ...], rounds: int) -> list[T]:
    """``function(*args, 1)`` in a launch of its own, once per round, with fresh models.

    Blocks of 10 steps here scatter with a standard deviation of ~33% in wall time (a step
    takes 0.9 ms or, when a thread waits for a core, up to 4-5 ms), so a round of 120 blocks
    carries ~3% of noise. Rounds in launches of their own keep any bias a launch or a model
    might have out of every round but one; over 27 launches (in a version of this benchmark
    that also made 6 fresh model sets per launch) no such bias showed beyond that block
    noise."""
    return [notebook_launcher(function, (*args, 1), **LAUNCH) for _ in range(rounds)]


def merged(rounds: list[tuple[Blocks, Blocks]]) -> tuple[Blocks, Blocks]:
    """The wall-clock and CPU blocks of several rounds, round after round, per case."""
    return tuple(  # type: ignore[return-value]
        {name: [block for part in rounds for block in part[kind][name]] for name in rounds[0][kind]}
        for kind in (0, 1)
    )


def round_rates(seconds: list[float], rounds: int, block: int = BLOCK) -> list[float]:
    """Steps/s of each round, from its blocks' seconds."""
    per_round = len(seconds) // rounds
    return [
        per_round * block / sum(seconds[i * per_round : (i + 1) * per_round]) for i in range(rounds)
    ]


def paired_blocks(seconds: list[float], baseline: list[float]) -> float:
    """Speed vs the baseline: the median over blocks of the baseline block's time over this
    case's block run right next to it. A block another process preempted is one outlier among
    rounds x blocks ratios, not a share of a whole round's sum."""
    return statistics.median(b / s for s, b in zip(seconds, baseline, strict=True))


def ddp_setup(data: TensorDataset, width: int = HIDDEN, batch: int = BATCH) -> Step:
    """A hand-wrapped DDP model's step and its endless stream of batches (DistributedSampler)."""
    model = torch.nn.parallel.DistributedDataParallel(mlp(width))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler: DistributedSampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=batch, sampler=sampler)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return step, batches(loader, sampler.set_epoch)


def same_ranks(steps: int, rounds: int) -> tuple[Blocks, Blocks]:
    """Wall-clock and CPU seconds of every block, per case (see alternating)."""
    from nbtrain import Accelerator

    data = model_and_data()[1]
    runs = {
        "nbtrain": prepared(Accelerator(), data),
        "ddp": ddp_setup(data),
        "ddp, again": ddp_setup(data),
    }
    return alternating(runs, steps, rounds)


def print_paired(seconds: dict[str, list[list[float]]]) -> None:
    """The paired table: per case, steps/s over each round's turns, and its speed against ddp
    and accelerate per round (median) and per neighbouring turn (median)."""
    rates = {
        name: [len(round_) * TURN / sum(round_) for round_ in rounds]
        for name, rounds in seconds.items()
    }
    print(
        "| case | median steps/s | min | max | paired vs ddp, per round | per turn | "
        "paired vs accelerate, per round |"
    )
    print("|---|---|---|---|---|---|---|")
    ddp_turns = [turn for round_ in seconds["ddp"] for turn in round_]
    for name, values in rates.items():
        turns = [turn for round_ in seconds[name] for turn in round_]
        print(
            f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | "
            f"{max(values):.1f} | {per_round(values, rates['ddp']):.3f}x | "
            f"{paired_blocks(turns, ddp_turns):.3f}x | "
            f"{per_round(values, rates['accelerate']):.3f}x |"
        )


def per_round(values: list[float], baseline: list[float]) -> float:
    """The median of the per-round ratios."""
    return statistics.median(v / b for v, b in zip(values, baseline, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=1200, help="timed steps per case and round")
    parser.add_argument("--raw", help="also write every turn's and block's seconds to this file")
    options = parser.parse_args()
    names = ["nbtrain", "ddp", "accelerate"]
    turns = max(options.steps // TURN, 1)
    seconds: dict[str, list[list[float]]] = {name: [] for name in names}
    kernel_shares = []
    for round_ in range(options.rounds):
        by_case, kernel_share = paired_round(rotation(names, round_), turns)
        kernel_shares.append(kernel_share)
        for name in names:
            seconds[name].append(by_case[name])
    print(
        f"N=2 CPU ranks, {turns * TURN} timed steps per case x {options.rounds} rounds, "
        f"batch {BATCH}/rank, MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}"
    )
    print(f"\nLaunches taking turns of {TURN} steps:")
    print_paired(seconds)
    print(
        f"\nThe kernel (this process: nbtrain's launcher loop) used a median "
        f"{100 * statistics.median(kernel_shares):.2f}% of one core while the ranks trained."
    )
    wall, cpu = merged(launch_per_round(same_ranks, (options.steps,), options.rounds))
    print_same_ranks(wall, cpu, options.rounds)
    if options.raw:
        with open(options.raw, "w") as file:
            json.dump({"paired": seconds, "same ranks": {"wall": wall, "cpu": cpu}}, file)


def print_same_ranks(wall: Blocks, cpu: Blocks, rounds: int) -> None:
    print(f"\nSame ranks, alternating in blocks of {BLOCK} steps (Accelerator overhead only):")
    print(
        "| case | median steps/s | min | max | paired vs ddp (per block) | "
        "CPU µs/step (rank 0's stepping thread) | CPU vs ddp |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, seconds in wall.items():
        values = round_rates(seconds, rounds)
        cpu_us = statistics.median(cpu[name]) / BLOCK * 1e6
        print(
            f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | "
            f"{max(values):.1f} | {paired_blocks(seconds, wall['ddp']):.3f}x | "
            f"{cpu_us:.0f} | {paired_blocks(cpu[name], cpu['ddp']):.3f}x |"
        )


if __name__ == "__main__":
    # Run as the module `train`, not as __main__: the ranks' functions are then found by name
    # (a fork rank inherits the turn semaphores; nbtrain would pickle __main__'s by value).
    import train

    train.main()
