"""What nbtrain's Accelerator adds to a training step: per wrapper, at three step sizes, by half.

Part 1, per call (rank 0 of a 2-rank nbtrain launch, gloo, one torch thread): each wrapper the
training loop goes through against what hand-written DDP code does instead, with the work
itself taken out (a no-op optimizer, a loss whose backward does nothing, a dataset whose items
are their indices), so only the wrapper's own Python is left. Best of REPEATS runs of CALLS
calls, ours and theirs interleaved.

Part 2, per step: nbtrain (prepare + accelerator.backward) against hand-written DDP
(DistributedSampler, loss.backward()) trained alternately in the same two ranks, in blocks whose
order rotates, at three model sizes: ~1 ms of compute per step, train.py's MLP, ~20 ms. "compute"
is forward + backward + SGD step of an unwrapped copy in one rank (no all-reduce). The
difference of the step times (median over blocks, each against the DDP block beside it) is the
fixed per-step cost; "ddp, again" (a second hand-wrapped model) shows the noise floor. The same
is given in CPU time of rank 0's stepping thread, which waiting and other processes do not
inflate.

Part 3, which half of the step the difference is in: train.py's step, same two ranks,
alternating four ways: all nbtrain, all hand-written, the prepared loader feeding a hand-wrapped
DDP model, and a prepared model and optimizer fed by DistributedSampler.

In parts 2 and 3 each round is a launch of its own, with fresh models (train.launch_per_round).

    python benchmarks/step_cost.py [--rounds 7] [--part 1|2|3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo  # (DDP imports it; loading it before forking keeps setup fast)
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset
from train import (
    BATCH,
    FEATURES,
    HIDDEN,
    LAUNCH,
    Blocks,
    accelerator_step,
    alternating,
    batches,
    ddp_setup,
    launch_per_round,
    merged,
    mlp,
    model_and_data,
    paired_blocks,
)

from nbtrain import notebook_launcher

CALLS, REPEATS = 20_000, 7
CLASSES, SAMPLES = 10, 8192


# -- Part 1: per call ---------------------------------------------------------------------------


class Indices(Dataset):
    """Items are their indices: fetching costs nothing, sampling and sharding remain."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> int:
        return index


def as_list(items: list[int]) -> list[int]:
    return items


class NoOpSGD(torch.optim.SGD):
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None


class NoOpLoss:
    def backward(self, **kwargs: Any) -> None:
        return None


def best_per_call(ours: Callable[[], Any], theirs: Callable[[], Any]) -> tuple[float, float]:
    """µs per call of each, best of REPEATS (interleaved so both see the same moments)."""
    times: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(REPEATS):
        for index, call in enumerate((ours, theirs)):
            start = time.perf_counter_ns()
            for _ in range(CALLS):
                call()
            times[index].append((time.perf_counter_ns() - start) / CALLS / 1000)
    return min(times[0]), min(times[1])


def endless(loader: Any, set_epoch: Any = None) -> Callable[[], Any]:
    stream = batches(loader, set_epoch)
    return lambda: next(stream)


def nothing() -> None:
    return None


def wrappers() -> list[tuple[str, float, float]] | None:
    from contextlib import nullcontext

    from nbtrain import Accelerator, log, progress

    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(4, 4))
    optimizer = NoOpSGD(model.parameters(), lr=0.1)
    prepared_optimizer = acc.prepare(NoOpSGD(model.parameters(), lr=0.1))
    loader = acc.prepare(DataLoader(Indices(), batch_size=BATCH, shuffle=True, collate_fn=as_list))
    sampler: DistributedSampler = DistributedSampler(Indices(), shuffle=True)
    raw_loader = DataLoader(Indices(), batch_size=BATCH, sampler=sampler, collate_fn=as_list)
    params = list(model.parameters())
    for param in params:
        param.grad = torch.zeros_like(param)
    loss: Any = NoOpLoss()  # stands in for a tensor: its backward does nothing
    forward_only = torch.nn.Linear(4, 4)
    bf16 = Accelerator(mixed_precision="bf16")
    autocast_model = bf16.prepare_model(torch.nn.Linear(4, 4), evaluation_mode=True)
    x = torch.randn(2, 4)
    dist.barrier()
    if acc.process_index != 0:
        dist.barrier()
        return None

    def accumulate() -> None:
        with acc.accumulate(model):
            pass

    def autocast() -> None:
        with acc.autocast():
            pass

    def plain_with() -> None:
        with nullcontext():
            pass

    def hand_autocast() -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward_only(x).float()

    rows = [
        ("prepared loader: next batch", endless(loader), endless(raw_loader, sampler.set_epoch)),
        ("accelerator.backward", lambda: acc.backward(loss), loss.backward),
        ("optimizer.step", prepared_optimizer.step, optimizer.step),
        ("optimizer.zero_grad", prepared_optimizer.zero_grad, optimizer.zero_grad),
        ("accumulate(model) block", accumulate, nothing),
        ("autocast() block (no mixed precision)", autocast, plain_with),
        (
            "bf16 forward (prepared vs torch.autocast by hand)",
            lambda: autocast_model(x),
            hand_autocast,
        ),
        (
            "clip_grad_norm_",
            lambda: acc.clip_grad_norm_(params, 1.0),
            lambda: torch.nn.utils.clip_grad_norm_(params, 1.0),
        ),
        ("log({'loss': x})", lambda: log({"loss": 0.5}), nothing),
    ]
    results = [(name, *best_per_call(ours, theirs)) for name, ours, theirs in rows]
    items: Any = progress(range(10**9), desc="steps")
    plain = iter(range(10**9))
    results.append(
        ("progress(): one item", *best_per_call(lambda: next(items), lambda: next(plain)))
    )
    items.close()  # (the loop ends here: its bar closes)
    dist.barrier()
    return results


# -- Part 2: per step, three sizes -------------------------------------------------------------

Size = tuple[str, float, int, Blocks, Blocks]  # label, compute ms, block, wall and CPU blocks


# (label, hidden width, batch per rank, timed steps per round, steps per block)
SIZES = (
    ("~1 ms compute", 384, 64, 300, 25),
    ("train.py's MLP", HIDDEN, BATCH, 300, 25),
    ("~20 ms compute", 1408, 128, 40, 4),
)


def compute_ms(width: int, batch: int, data: TensorDataset) -> float:
    """One rank's forward + backward + step of an unwrapped copy (no all-reduce)."""
    model = mlp(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = data[:batch]
    timings = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(5):
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        timings.append((time.perf_counter() - start) / 5 * 1000)
    return min(timings)


def step_sizes(rounds: int) -> list[Size]:
    from nbtrain import Accelerator

    acc = Accelerator()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(SAMPLES, FEATURES), torch.randint(0, CLASSES, (SAMPLES,)))
    results = []
    for label, width, batch, steps, block in SIZES:
        model = mlp(width)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(data, batch_size=batch, shuffle=True)
        model, optimizer, loader = acc.prepare(model, optimizer, loader)
        runs = {
            "nbtrain": (accelerator_step(acc, model, optimizer), batches(loader)),
            "ddp": ddp_setup(data, width, batch),
            "ddp, again": ddp_setup(data, width, batch),
        }
        seconds, cpu = alternating(runs, steps, rounds, block)
        results.append((label, compute_ms(width, batch, data), block, seconds, cpu))
    return results


def merged_sizes(rounds: list[list[Size]]) -> list[Size]:
    """Per size, the blocks of every round (each a launch of its own), and the best compute."""
    sizes = []
    for index, (label, _, block, _, _) in enumerate(rounds[0]):
        wall, cpu = merged([(part[index][3], part[index][4]) for part in rounds])
        compute = min(part[index][1] for part in rounds)
        sizes.append((label, compute, block, wall, cpu))
    return sizes


# -- Part 3: which half of the step ----------------------------------------------------------


def halves(steps: int, rounds: int) -> tuple[Blocks, Blocks]:
    """train.py's step in the same two ranks, four ways, alternating in blocks: all nbtrain,
    all hand-written, and each half of nbtrain's step with the other half hand-written (the
    prepared loader feeding a hand-wrapped DDP model; a prepared model and optimizer fed by
    DistributedSampler)."""
    from nbtrain import Accelerator

    acc = Accelerator()
    model, data = model_and_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    hand_step, _ = ddp_setup(data)
    other_loader = acc.prepare(DataLoader(data, batch_size=BATCH, shuffle=True))
    other_model = model_and_data()[0]
    other_model, other_optimizer = acc.prepare(
        other_model, torch.optim.SGD(other_model.parameters(), lr=0.01)
    )
    _, hand_stream = ddp_setup(data)
    runs = {
        "nbtrain": (accelerator_step(acc, model, optimizer), batches(loader)),
        "ddp": ddp_setup(data),
        "prepared loader only": (hand_step, batches(other_loader)),
        "prepared model + optimizer only": (
            accelerator_step(acc, other_model, other_optimizer),
            hand_stream,
        ),
    }
    return alternating(runs, steps, rounds, HALVES_BLOCK)


HALVES_BLOCK, HALVES_STEPS = 10, 600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--part", type=int, choices=(1, 2, 3), default=None)
    options = parser.parse_args()
    if options.part in (None, 1):
        rows = notebook_launcher(wrappers, **LAUNCH)
        print(f"Per call, µs (rank 0 of 2, best of {REPEATS} x {CALLS:,} calls):")
        print("| wrapper | nbtrain | hand-written | added |")
        print("|---|---|---|---|")
        for name, ours, theirs in rows:
            print(f"| {name} | {ours:.2f} | {theirs:.2f} | {ours - theirs:+.2f} |")
    if options.part in (None, 2):
        sizes = merged_sizes(launch_per_round(step_sizes, (), options.rounds))
        print(f"\nPer step, same 2 ranks, alternating, {options.rounds} rounds (medians):")
        print(
            "| model | compute ms | case | ms/step | ddp ms/step | added µs/step | vs ddp | "
            "added CPU µs/step | CPU vs ddp |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for label, compute, block, wall, cpu in sizes:
            theirs = statistics.median(wall["ddp"]) * 1e3 / block
            for case in ("nbtrain", "ddp, again"):  # the second: the noise floor
                ours = statistics.median(wall[case]) * 1e3 / block
                print(
                    f"| {label} | {compute:.2f} | {case} | {ours:.3f} | {theirs:.3f} | "
                    f"{added(wall, case, block):+.0f} | "
                    f"{paired_blocks(wall[case], wall['ddp']):.3f}x | "
                    f"{added(cpu, case, block):+.1f} | "
                    f"{paired_blocks(cpu[case], cpu['ddp']):.3f}x |"
                )
    if options.part in (None, 3):
        wall, cpu = merged(launch_per_round(halves, (HALVES_STEPS,), options.rounds))
        print(
            f"\nWhich half, train.py's MLP, same 2 ranks, blocks of {HALVES_BLOCK}, "
            f"{options.rounds} rounds (medians):"
        )
        print("| case | vs ddp | added CPU µs/step | CPU vs ddp |")
        print("|---|---|---|---|")
        for case in wall:
            print(
                f"| {case} | {paired_blocks(wall[case], wall['ddp']):.3f}x | "
                f"{added(cpu, case, HALVES_BLOCK):+.1f} | "
                f"{paired_blocks(cpu[case], cpu['ddp']):.3f}x |"
            )


def added(seconds: Blocks, case: str, block: int) -> float:
    """µs per step ``case`` adds: the median over blocks of the difference to the DDP block
    beside it."""
    return statistics.median(
        (ours - theirs) / block * 1e6
        for ours, theirs in zip(seconds[case], seconds["ddp"], strict=True)
    )


if __name__ == "__main__":
    main()
