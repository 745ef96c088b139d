"""Warm ranks: what a cell costs, and whether training in a cell is as fast as in a launch.

1. **Empty-cell round trip** in a real Jupyter kernel (jupyter_client), 2 ranks each: a
   ``%%ranks`` cell (nbtrain warm ranks, the default forkserver start) against a ``%%px`` cell
   (ipyparallel, 2 engines of a local cluster started in the same kernel). Both cells hold
   ``pass`` and run in the same kernel, alternated (order rotated every round); the time is the
   client's, from ``execute`` to the kernel's idle: what a user waits. Target: median <= 5 ms
   and <= 0.5x ``%%px``.
2. **Training steps/s**: the same DDP loop (small MLP, gloo, N=2) in a ``%%ranks`` cell and in
   ``notebook_launcher``, alternated; the rate is measured inside rank 0 around the loop (the
   launch's start-up is the one-shot path's own cost, reported separately by launch.py).
   Target: warm >= 0.98x the launch's rate (median of the paired per-round ratios).

    python benchmarks/warm.py [--rounds 200] [--train-rounds 9] [--steps 300]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernel"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from common import rotation

ROUND_TRIP_TARGET = 0.005  # seconds, median
VS_PX_TARGET = 0.5
STEPS_TARGET = 0.98

KERNEL_SETUP = """
import nbtrain, ipyparallel as ipp
ranks = nbtrain.start_ranks(2)
cluster = ipp.Cluster(n=2, log_level=40)
rc = cluster.start_and_connect_sync()
rc.wait_for_engines(2, timeout=120)
view = rc[:]
view.block = True
view.activate()  # registers %px / %%px for these engines
"""

LOOP = """
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
def loop(steps, width=256):
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                    torch.nn.Linear(width, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, width), torch.randn(64, 1)
    for _ in range(10):  # warm-up
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
    dist.barrier()
    return steps / (time.perf_counter() - start)
"""


def cell_round_trip(client, code: str, timeout: float = 60) -> float:
    start = time.perf_counter()
    msg_id = client.execute(code, store_history=False)
    deadline = time.monotonic() + timeout
    error = None
    while True:
        try:
            msg = client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"{code!r} did not finish") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            error = msg["content"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            elapsed = time.perf_counter() - start
            if error:
                raise RuntimeError(f"{code!r} failed: {error['ename']}: {error['evalue']}")
            return elapsed


def round_trips(rounds: int) -> dict[str, list[float]]:
    from kernelutil import Kernel

    with tempfile.TemporaryDirectory() as spec_dir:
        kernel = Kernel(Path(spec_dir))
        try:
            out = kernel.run(KERNEL_SETUP, timeout=300)
            assert out.error is None, out.traceback_text
            cases = {
                "%%ranks (nbtrain, 2 warm ranks)": "%%ranks\npass",
                "%%px (ipyparallel, 2 engines)": "%%px\npass",
            }
            for code in cases.values():  # warm both paths
                for _ in range(5):
                    cell_round_trip(kernel.client, code)
            samples: dict[str, list[float]] = {name: [] for name in cases}
            for round_ in range(rounds):
                for name in rotation(list(cases), round_):
                    samples[name].append(cell_round_trip(kernel.client, cases[name]))
            kernel.run("cluster.stop_cluster_sync(); ranks.stop()", timeout=120)
        finally:
            kernel.shutdown()
    return samples


def training(rounds: int, steps: int) -> dict[str, list[float]]:
    import nbtrain

    namespace = {"__name__": "__main__"}
    exec(LOOP, namespace)
    loop = namespace["loop"]
    samples: dict[str, list[float]] = {"%%ranks cell": [], "notebook_launcher": []}
    with nbtrain.start_ranks(2, progress="off", output="none") as ranks:
        ranks.run_cell(LOOP)
        for round_ in range(rounds):
            for name in rotation(list(samples), round_):
                if name == "notebook_launcher":
                    rate = nbtrain.notebook_launcher(
                        loop, (steps,), num_processes=2, progress="off", output="none"
                    )
                else:
                    ranks.run_cell(f"rate = loop({steps})")
                    rate = ranks.pull("rate")[0]
                samples[name].append(rate)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--train-rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()

    trips = round_trips(args.rounds)
    ours, theirs = (statistics.median(v) for v in trips.values())
    print(f"Empty cell round trip, {args.rounds} rounds each, alternated, client-side:")
    print("| case | median (ms) | p90 (ms) | min (ms) |\n|---|---|---|---|")
    for name, values in trips.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"| {name} | {statistics.median(values) * 1e3:.2f} | {p90 * 1e3:.2f} | "
              f"{min(values) * 1e3:.2f} |")
    ratio = ours / theirs
    print(f"%%ranks / %%px: {ratio:.2f}x (target <= {VS_PX_TARGET}x); median "
          f"{ours * 1e3:.2f} ms (target <= {ROUND_TRIP_TARGET * 1e3:.0f} ms)")

    rates = training(args.train_rounds, args.steps)
    paired = [w / o for w, o in zip(rates["%%ranks cell"], rates["notebook_launcher"],
                                    strict=True)]
    print(f"\nTraining steps/s, {args.steps} steps x {args.train_rounds} rounds, N=2:")
    print("| case | median steps/s | min | max |\n|---|---|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | "
              f"{max(values):.1f} |")
    steps_ratio = statistics.median(paired)
    print(f"warm / launch (median of paired ratios): {steps_ratio:.3f}x "
          f"(target >= {STEPS_TARGET}x)")
    ok = ours <= ROUND_TRIP_TARGET and ratio <= VS_PX_TARGET and steps_ratio >= STEPS_TARGET
    print("verdict:", "PASS" if ok else "MISS")


if __name__ == "__main__":
    main()
