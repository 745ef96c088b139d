"""A background run against the same run blocking, in a real Jupyter kernel (jupyter_client).

N=2 ranks train a small DDP loop for a fixed number of steps, logging a metric every step
(``nbtrain.log``) and printing a line every 10 steps, with the live view on (widgets: the kernel
is an ipykernel, so the dashboard's comm messages are sent as in a notebook). Each round runs
it once blocking and once with ``block=False``, alternated (each round starting with the other
case). While the background run trains, the client sends empty cells one after another and
times each round trip (execute_request to the kernel's idle status); the same is timed on the
idle kernel for reference. A rank measures its own steps/s (from its first step to its last),
so start-up is not counted; the figure is rank 0's.

Goals (issue 41): an empty cell answers in <= 50 ms at p95 while the run trains; the run keeps
>= 0.98x the blocking run's steps/s.

    python benchmarks/background_run.py [--rounds 5] [--steps 3000]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

SETUP = """
import time, torch, torch.distributed as dist
import nbtrain
from nbtrain import notebook_launcher

def train(steps):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(16, 64)
    start = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        nbtrain.log({"loss": loss.item()}, step=step)
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    rate = steps / (time.perf_counter() - start)
    dist.destroy_process_group()
    return rate
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Client:
    def __init__(self, directory: Path) -> None:
        spec = directory / "bench"
        spec.mkdir()
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "bench", "language": "python",
        }))
        self.manager = KernelManager(
            kernel_name="bench", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(directory)])
        )
        self.manager.start_kernel()
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 600) -> tuple[float, str]:
        """Execute ``code``: (seconds to the kernel's idle, its stdout)."""
        started = time.perf_counter()
        msg_id = self.client.execute(code)
        out = ""
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(code) from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out += msg["content"]["text"]
            elif msg["msg_type"] == "error":
                raise RuntimeError("\n".join(msg["content"]["traceback"]))
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return time.perf_counter() - started, out

    def value(self, expression: str) -> float:
        return float(self.run(f"print({expression})")[1].strip().splitlines()[-1])

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)


def empty_cells(client: Client, seconds: float) -> list[float]:
    end = time.monotonic() + seconds
    times = []
    while time.monotonic() < end:
        times.append(client.run("")[0])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        client = Client(Path(directory))
        try:
            client.run(SETUP)
            client.run(f"notebook_launcher(train, ({options.steps // 10},), num_processes=2)")
            rates: dict[str, list[float]] = {"blocking": [], "background": []}
            busy: list[float] = []
            for round_ in range(options.rounds):
                order = ["blocking", "background"][:: 1 if round_ % 2 == 0 else -1]
                for case in order:
                    if case == "blocking":
                        client.run(f"rate = notebook_launcher(train, ({options.steps},), "
                                   "num_processes=2)")
                    else:
                        client.run(f"run = notebook_launcher(train, ({options.steps},), "
                                   "num_processes=2, block=False)")
                        time.sleep(2.0)  # the ranks are training (start-up not measured)
                        while client.value("int(run.done())") == 0:
                            busy.extend(empty_cells(client, 1.0))
                        client.run("rate = run.wait()")
                    rates[case].append(client.value("rate"))
                print(f"round {round_}: " + ", ".join(
                    f"{case} {values[-1]:.0f} steps/s" for case, values in rates.items()
                ), flush=True)
            empty_cells(client, 1.0)  # (the kernel settles)
            idle = empty_cells(client, 5.0)
        finally:
            client.close()
    blocking, background = (statistics.median(rates[c]) for c in ("blocking", "background"))
    print()
    print("| case | empty cell p50 (ms) | p95 (ms) | cells timed |")
    print("|---|---|---|---|")
    for name, times in (("idle kernel", idle), ("while a background run trains", busy)):
        print(f"| {name} | {1000 * percentile(times, 50):.1f} | "
              f"{1000 * percentile(times, 95):.1f} | {len(times)} |")
    print()
    print("| run | steps/s (median of rank 0's) | vs blocking |")
    print("|---|---|---|")
    print(f"| blocking | {blocking:.0f} | 1.00x |")
    print(f"| background (block=False) | {background:.0f} | {background / blocking:.3f}x |")
    print(f"\nper round: blocking {[round(r) for r in rates['blocking']]}, "
          f"background {[round(r) for r in rates['background']]}")


if __name__ == "__main__":
    main()
