"""Run All: torch._dynamo in the ranks or in the kernel, end to end (issue 42, point 2).

"Run All" sends every cell at once: the launch cells come right after ``import nbtrain``, before
the warm-up's last step (torch._dynamo, which any optimizer imports). A fork launch then either
leaves torch._dynamo to its ranks (each rank imports it, at the same time, and the next launch's
ranks again while the warm-up still has it to come) or imports it in the kernel first, once (its
ranks, and every later launch's, inherit it). This times both, each round in a fresh kernel, the
cells sent at once as Run All sends them: the import cell, then two launches of a function that
forms a gloo group of 2 and takes one DDP optimizer step. Figures: each launch cell (from the
cell's start to its end, the kernel's clock) and the whole Run All (first execute to last idle,
the client's clock).

    python benchmarks/runall.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernel"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from common import rotation

IMPORT = """
import os, time, torch, torch.distributed as dist
os.environ.pop('NBTRAIN_WARM_UP', None)
import nbtrain
{choice}
def first_step():
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    dist.destroy_process_group()
_cells = []
"""
# (the kernel's clock: a cell's own span, whatever waited before it)
LAUNCH = """_began = time.perf_counter()
nbtrain.notebook_launcher(first_step, num_processes=2, progress="off")
_cells.append(time.perf_counter() - _began)"""
CASES = {
    # today's processes.fork_imports: torch._dynamo left to the ranks while the warm-up has it
    "ranks import torch._dynamo": "",
    "kernel imports torch._dynamo first": (
        "from nbtrain.kernel.procs import processes, forkserver\n"
        "processes.fork_imports = lambda count: list(forkserver.PRELOAD)"
    ),
}


def run_all(choice: str) -> tuple[float, list[float]]:
    """(whole Run All, each launch cell's own seconds), in a fresh kernel."""
    from kernelutil import Kernel

    with tempfile.TemporaryDirectory() as folder:
        kernel = Kernel(Path(folder))
        try:
            began = time.perf_counter()
            ids = [kernel.start(IMPORT.format(choice=choice)), kernel.start(LAUNCH),
                   kernel.start(LAUNCH)]
            for msg_id in ids:
                out = kernel.collect(msg_id, timeout=300)
                assert out.error is None, out.traceback_text
            whole = time.perf_counter() - began
            cells = kernel.value("_cells")
            assert isinstance(cells, list)
            return whole, cells
        finally:
            kernel.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, list[float]]]] = {name: [] for name in CASES}
    print(f"load at start: {os.getloadavg()[0]:.1f}", flush=True)
    for round_ in range(args.rounds):
        for name in rotation(list(CASES), round_):
            whole, cells = run_all(CASES[name])
            results[name].append((whole, cells))
            print(f"round {round_ + 1} {name}: Run All {whole:.2f} s, launches "
                  + ", ".join(f"{c:.2f}" for c in cells) + " s", flush=True)
    print(f"load at end: {os.getloadavg()[0]:.1f}")
    print("| case | Run All (median s) | first launch | second launch |")
    print("|---|---|---|---|")
    for name, rows in results.items():
        whole = statistics.median(r[0] for r in rows)
        first = statistics.median(r[1][0] for r in rows)
        second = statistics.median(r[1][1] for r in rows)
        print(f"| {name} | {whole:.2f} | {first:.2f} | {second:.2f} |")


if __name__ == "__main__":
    main()
