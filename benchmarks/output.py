"""The cost of rank output reaching the cell: N=2 ranks train the same small DDP loop for a fixed
number of steps while each prints about 1,000 lines per second (one line per step at ~1 ms
steps) or prints nothing, alternated within one run; the ratio is printed-vs-silent steps/s.

Run it with this tree's nbtrain and with an older one (PYTHONPATH) to compare output paths
(benchmarks/README.md's table: the new path publishes rank lines as the cell's stream output,
coalesced per tick, and writes every line to the launch's log folder).

    python benchmarks/output.py [--rounds 7] [--steps 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from nbtrain import notebook_launcher

QUIET = {"progress": "off"}  # the view is not measured; output lines are (output="all")


def train(steps: int, print_lines: bool) -> float:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(16, 64)
    start = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(batch).square().mean().backward()
        optimizer.step()
        if print_lines:
            print(f"step {step} loss {0.5:.4f} and some more text to make a realistic line")
    elapsed = time.perf_counter() - start
    dist.destroy_process_group()
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2000)
    options = parser.parse_args()
    import io
    import sys

    rates: dict[str, list[float]] = {"silent": [], "1 line per step": []}
    real_stdout = sys.stdout
    for round_ in range(options.rounds):
        order = list(rates) if round_ % 2 == 0 else list(reversed(rates))
        for name in order:
            sys.stdout = io.StringIO()  # the kernel's cell: lines are written, then dropped
            try:
                rate = notebook_launcher(
                    train, (options.steps, name != "silent"), num_processes=2, **QUIET
                )
            finally:
                sys.stdout = real_stdout
            rates[name].append(rate)
    paired = [p / s for p, s in zip(rates["1 line per step"], rates["silent"], strict=True)]
    silent = statistics.median(rates["silent"])
    lines_per_second = silent  # one line per step per rank
    print(f"Rank output cost, N=2, {options.rounds} rounds of {options.steps} steps "
          f"(~{lines_per_second:.0f} lines/s per rank)\n")
    print("| case | median steps/s (rank 0) | paired vs silent |")
    print("|---|---|---|")
    for name, values in rates.items():
        ratio = 1.0 if name == "silent" else statistics.median(paired)
        print(f"| {name} | {statistics.median(values):.0f} | {ratio:.3f}x |")


if __name__ == "__main__":
    main()
