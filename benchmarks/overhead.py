"""Cost of live reporting: steps/s of a DDP training loop with ``progress`` + ``log`` on every
step versus the same loop without, N=2 ranks, alternated inside one launch.

Each rank trains a small MLP (about 5 ms a step on one CPU thread) in short blocks of
``--steps`` steps; blocks with and without reporting alternate (order rotated every round), each
block starting after a barrier, so drift on a shared machine hits all alike. Every variant reads
``loss.item()``, as any loop that reports a loss does; the difference is nbtrain's own cost.
A third variant logs every step with no ``progress()`` around it (raw DDP code), which nbtrain
coalesces the same way.

The kernel side runs the text view a user of ``nbtrain launch`` or ``progress="text"`` gets:
with a live status line when stdout is a terminal, plain periodic lines otherwise (the run says
which), so its work competes for the cores as in real use.

The verdict is the median over rounds of the paired ratio (each round's reported block against
the same round's plain block), compared with the target: at most TARGET_PERCENT slower. Besides
wall-clock steps/s (what the user sees, noisy when other work shares the cores) it reports the
ranks' CPU time per step, which other processes on the machine do not inflate.

    python benchmarks/overhead.py [--rounds 50] [--steps 100] [--width 256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

from nbtrain import log, notebook_launcher, progress

TARGET_PERCENT = 2.0  # progress + log every step may cost at most this much of the step rate
BASELINE, MEASURED = "without reporting", "progress + log"


def train(rounds: int, steps: int, width: int) -> dict[str, dict[str, list[float]]]:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, width),
    ))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch, target = torch.randn(32, width), torch.randn(32, width)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(batch), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    def plain() -> None:
        for _ in range(steps):
            step()

    def reported() -> None:
        for _ in progress(range(steps), desc="train"):
            log({"loss": step()})

    def logged() -> None:
        for _ in range(steps):
            log({"loss": step()})

    variants = {BASELINE: plain, MEASURED: reported, "log only (no progress)": logged}
    plain()  # warm up (allocator, DDP buckets)
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            variants[name]()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    dist.destroy_process_group()
    return {"wall": wall, "cpu": cpu, "call_us": [_call_cost()]}


def _call_cost(count: int = 50_000) -> float:
    """Microseconds that one progress step + one log() call add to a loop (no training)."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(count):
            pass
        empty = time.perf_counter() - start
        start = time.perf_counter()
        for _ in progress(range(count), desc="calls"):
            log({"loss": 0.5})
        best = min(best, (time.perf_counter() - start - empty) / count * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--steps", type=int, default=100, help="steps per block")
    parser.add_argument("--width", type=int, default=256, help="MLP width (sets the step time)")
    options = parser.parse_args()
    view = (
        "text view, live status line (stdout is a terminal)" if sys.stdout.isatty()
        else "text view, plain periodic lines (stdout is not a terminal)"
    )
    per_rank = notebook_launcher(
        train, (options.rounds, options.steps, options.width), num_processes=2,
        start_method="fork", progress="text", return_all=True,
    )
    names = list(per_rank[0]["wall"])
    call_us = max(rank["call_us"][0] for rank in per_rank)
    rounds = range(options.rounds)
    # DDP keeps ranks in step: a block lasts as long as its slowest rank.
    rates = {
        name: [options.steps / max(rank["wall"][name][i] for rank in per_rank) for i in rounds]
        for name in names
    }
    cpu_ms = {  # CPU milliseconds per step, summed over the ranks
        name: [1000 * sum(rank["cpu"][name][i] for rank in per_rank) / options.steps
               for i in rounds]
        for name in names
    }
    base_rate = statistics.median(rates[names[0]])
    base_cpu = statistics.median(cpu_ms[names[0]])
    print(f"\nReporting overhead, N=2 ranks (gloo, CPU), {options.rounds} alternated rounds of "
          f"{options.steps} steps, {1000 / base_rate:.1f} ms per step (wall); kernel: {view}\n")
    print("| variant | median steps/s | vs without | paired per round | "
          "CPU ms/step (2 ranks) | vs without |")
    print("|---|---|---|---|---|---|")
    paired = {name: _paired_median(rates[name], rates[BASELINE]) for name in names}
    for name in names:
        rate, cpu = statistics.median(rates[name]), statistics.median(cpu_ms[name])
        print(f"| {name} | {rate:.1f} | {(rate / base_rate - 1) * 100:+.1f}% | "
              f"{(paired[name] - 1) * 100:+.1f}% | {cpu:.2f} | "
              f"{(cpu / base_cpu - 1) * 100:+.1f}% |")
    print(f"\nOne progress step + one log() call in a rank, no training: {call_us:.2f} us "
          f"({call_us / (10 * base_cpu / 2):.3f}% of a step's CPU time)")
    slower = (1 - paired[MEASURED]) * 100
    verdict = "PASS" if slower <= TARGET_PERCENT else "FAIL"
    print(f"\n{verdict}: {MEASURED} every step is {slower:+.1f}% slower (paired median ratio "
          f"{paired[MEASURED]:.4f}); target <= {TARGET_PERCENT:g}% slower")


def _paired_median(rates: list[float], baseline: list[float]) -> float:
    """Median over rounds of rate / baseline rate in the same round (drift cancels per pair)."""
    return statistics.median(a / b for a, b in zip(rates, baseline, strict=True))


if __name__ == "__main__":
    main()
