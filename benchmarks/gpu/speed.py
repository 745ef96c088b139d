"""Speed on the GPU, in the same run: GPT-2 small training steps/s and peak memory of raw torch,
nbtrain's Accelerator and Accelerate's (each case a fresh process, cases alternated), and the
launch round trip of two CUDA ranks, nbtrain against torch.multiprocessing (forkserver both)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch.multiprocessing as torch_mp
from gpu_report import Results
from gpu_workloads import cuda_touch, cuda_touch_raw

from nbtrain import notebook_launcher

HERE = Path(__file__).resolve().parent
CASES = ("raw", "nbtrain", "accelerate")


def check_training_speed(results: Results, rounds: int) -> None:
    samples: dict[str, list[dict]] = {case: [] for case in CASES}
    _case("raw")  # discarded: the first case of a run met an idle card (clocks, cuBLAS set-up)
    for round_ in range(rounds):
        order = CASES[round_ % 3:] + CASES[:round_ % 3]
        for case in order:
            sample, error = _case(case)
            if sample is None:
                results.add(f"6. speed: {case}", False, "the case failed", error)
                return
            samples[case].append(sample)
    rate = {case: statistics.median(s["steps_per_s"] for s in samples[case]) for case in CASES}
    peak = {case: max(s["peak_gib"] for s in samples[case]) for case in CASES}
    each = {case: " / ".join(f"{s['steps_per_s']:.2f}" for s in samples[case]) for case in CASES}
    for case in ("nbtrain", "accelerate"):
        ratio = rate[case] / rate["raw"]
        results.add(f"6. GPT-2 small bf16: {case} / raw torch", ratio >= 0.95,
                    f"{rate[case]:.2f} vs {rate['raw']:.2f} steps/s = {ratio:.3f}x; peak "
                    f"{peak[case]:.2f} vs {peak['raw']:.2f} GiB (median of {rounds} rounds: "
                    f"{each[case]} vs {each['raw']})")


def _case(case: str) -> tuple[dict | None, str]:
    done = subprocess.run([sys.executable, str(HERE / "speed_case.py"), case],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return None, done.stderr[-1500:]
    return json.loads(lines[-1]), ""


def check_launch_round_trip(results: Results, rounds: int) -> None:
    def ours() -> None:
        notebook_launcher(cuda_touch, num_processes=2, start_method="forkserver",
                          progress="off", output="none")

    def raw() -> None:
        torch_mp.start_processes(cuda_touch_raw, nprocs=2, start_method="forkserver")

    times: dict[str, list[float]] = {"nbtrain": [], "raw": []}
    ours()
    raw()  # both warm: the forkserver is started and has imported torch
    for round_ in range(rounds):
        for name, case in ((("nbtrain", ours), ("raw", raw)) if round_ % 2 == 0
                           else (("raw", raw), ("nbtrain", ours))):
            start = time.perf_counter()
            case()
            times[name].append(time.perf_counter() - start)
    mine, theirs = statistics.median(times["nbtrain"]), statistics.median(times["raw"])
    results.add("6. launch round trip, 2 CUDA ranks", mine / theirs <= 1.5,
                f"nbtrain {mine:.2f} s vs torch.multiprocessing {theirs:.2f} s (forkserver, "
                f"median of {rounds}) = {mine / theirs:.2f}x")
