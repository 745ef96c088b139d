"""Stop and resume: how long the stop button takes to give control back, with the save.

Two ranks (fork, gloo) train; once they run, this process (the kernel's role) gets SIGINT, and
the time until ``notebook_launcher`` has raised ``KeyboardInterrupt`` in it is measured:

    stop         on_interrupt="stop" (the default): every rank is stopped at once, nothing kept
    checkpoint   on_interrupt="checkpoint": the ranks agree on a step, save a checkpoint, leave

for a small model and for a ~100 MB training state (weights plus Adam's two moments), cases
alternated round by round. The checkpoint case's time includes finishing the current step, the
one-step agreement, writing and fsyncing the checkpoint, and the ranks' exit.

A second table is what the option costs while nobody presses anything: steps/s of the same
small-model loop (no sleep, ~1-2 ms steps) with on_interrupt="stop" and "checkpoint" (the
latter exchanges one flag per step with an asynchronous all-reduce), timed in rank 0,
alternated; the ratio is the median of the per-round ratios.

    python benchmarks/stop.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch._dynamo  # (DDP imports it; loading it before forking keeps setup fast)
from common import rotation

from nbtrain import Accelerator, notebook_launcher

SIZES = {"small": 64, "large": 1450}  # hidden width of a 4-layer MLP
STEP_SECONDS = 0.05  # a step of this length (sleep included) leaves time to press stop


def train(width: int, marker: str) -> None:
    accelerator = Accelerator()
    layers = [torch.nn.Linear(width, width) for _ in range(4)]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(4096, width))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for (x,) in loader:
        started = time.perf_counter()
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if accelerator.is_main_process and not os.path.exists(marker):
            Path(marker).write_text("training")
        time.sleep(max(0.0, STEP_SECONDS - (time.perf_counter() - started)))


def throughput(steps: int) -> float:
    """Steps per second of rank 0 over ``steps`` steps after a warm-up (no sleep)."""
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(64 * (steps + 40), 64))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    started = 0.0
    for index, (x,) in enumerate(loader):
        if index == 20:
            started = time.perf_counter()
        if index == 20 + steps:
            return steps / (time.perf_counter() - started)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    raise RuntimeError("not enough batches")


def step_rates(rounds: int, steps: int, folder: Path) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {"stop": [], "checkpoint": []}
    for round_ in range(rounds):
        for mode in rotation(list(rates), round_):
            project = folder / f"rate-{round_}" if mode == "checkpoint" else None
            rates[mode].append(
                notebook_launcher(
                    throughput, args=(steps,), num_processes=2, start_method="fork",
                    on_interrupt=mode, project_dir=project, progress="off", output="none",
                )
            )
    return rates


def state_megabytes(width: int) -> float:
    parameters = 4 * (width * width + width)
    return parameters * 4 * 3 / 1e6  # float32 weights + Adam's exp_avg and exp_avg_sq


def press_stop(width: int, mode: str, folder: Path) -> float:
    """Seconds from SIGINT to KeyboardInterrupt raised here."""
    marker = folder / f"marker-{time.monotonic_ns()}"
    pressed: list[float] = []

    def press() -> None:
        while not marker.exists():
            time.sleep(0.005)
        time.sleep(0.3)
        pressed.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=press)
    thread.start()
    try:
        notebook_launcher(
            train, args=(width, str(marker)), num_processes=2, start_method="fork",
            on_interrupt=mode, project_dir=folder / "project" if mode == "checkpoint" else None,
            total_limit=1, progress="off", output="none",
        )
        raise RuntimeError("the run ended before the stop was pressed")
    except KeyboardInterrupt:
        back = time.perf_counter()
    finally:
        thread.join()
    return back - pressed[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=500)
    options = parser.parse_args()
    rounds = options.rounds
    cases = [(size, mode) for size in SIZES for mode in ("stop", "checkpoint")]
    samples: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            for size, mode in rotation(cases, round_):  # type: ignore[arg-type]
                samples[(size, mode)].append(press_stop(SIZES[size], mode, Path(tmp)))
    print(f"Stop button to control back in the kernel, N=2, {rounds} rounds, alternated:")
    print("| state | on_interrupt | median (s) | min (s) | max (s) |")
    print("|---|---|---|---|---|")
    for size, mode in cases:
        values = samples[(size, mode)]
        mb = state_megabytes(SIZES[size])
        print(
            f"| {size}, {mb:.1f} MB | {mode} | {statistics.median(values):.2f} | "
            f"{min(values):.2f} | {max(values):.2f} |"
        )
    with tempfile.TemporaryDirectory() as tmp:
        rates = step_rates(rounds, options.steps, Path(tmp))
    ratios = [c / s for c, s in zip(rates["checkpoint"], rates["stop"], strict=True)]
    print(f"\nSteps/s while training, {options.steps} steps x {rounds} rounds, alternated:")
    print("| on_interrupt | median steps/s | min | max |")
    print("|---|---|---|---|")
    for mode, values in rates.items():
        median = statistics.median(values)
        print(f"| {mode} | {median:.1f} | {min(values):.1f} | {max(values):.1f} |")
    print(f"checkpoint / stop (median of per-round ratios): {statistics.median(ratios):.3f}x")


if __name__ == "__main__":
    main()
