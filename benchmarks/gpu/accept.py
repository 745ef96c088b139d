"""nbtrain's GPU acceptance check: every GPU behaviour nbtrain promises, on this machine.

    bash benchmarks/gpu/run.sh [OUT_DIR]        # installs what is missing, then runs this

Each check prints PASS/FAIL with its figure; the end writes OUT_DIR/gpu-results.json and
gpu-results.md (the README's "Measured on a GPU" table: card, driver, torch, CUDA). Checks:
1 `nbtrain env`; 2 a real kernel that touched CUDA first (fork refused naming the line, auto's
clean start saying why, training on cuda:0, weights back on the CPU); 3 the Accelerator on
CUDA (fp32/bf16/fp16 against a CPU fp32 reference, gradient accumulation, fp16's grad scaler
against torch's, NCCL in a rank, gpu_ids, more ranks than GPUs); 4 warm ranks holding CUDA
state (across cells, pull, interrupt, stop frees the GPU); 5 FSDP2 stop/resume bitwise;
6 speed (GPT-2 small bf16 against raw torch and Accelerate, launch round trip); 7 the live
view's GPU column. About 4 minutes on one H100.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# kernelutil drives real kernels for the test suite; the same driver serves here.
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "kernel")]

import torch  # noqa: E402
from checks_kernel import check_env, check_kernel  # noqa: E402
from checks_training import (  # noqa: E402
    check_accumulation,
    check_fp16,
    check_fp16_scaler,
    check_fsdp_resume,
    check_more_ranks_than_gpus,
    check_precision,
)
from gpu_report import Results, machine, write  # noqa: E402
from speed import check_launch_round_trip, check_training_speed  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-results")
    parser.add_argument("--rounds", type=int, default=3, help="speed rounds (cases alternate)")
    parser.add_argument("--skip", default="", help="comma-separated check numbers to leave out")
    options = parser.parse_args()
    skip = {part.strip() for part in options.skip.split(",") if part.strip()}
    if not torch.cuda.is_available():
        print("No CUDA GPU visible: this check needs one (nbtrain env says what torch sees).")
        return 2
    gpus = torch.cuda.device_count()  # (initialises CUDA here: every launch below must cope)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (check 5)
    results, started = Results(), time.perf_counter()
    facts = machine()
    print(f"GPU acceptance check on {facts['gpus']}, torch {facts['torch']}, CUDA "
          f"{facts['cuda']}\n", flush=True)
    steps = [
        ("1", lambda: check_env(results)),
        ("2", lambda: check_kernel(results, gpus)),  # 2, 4, 7 and NCCL / gpu_ids in ranks
        ("3", lambda: (check_precision(results, gpus), check_fp16(results),
                       check_accumulation(results, gpus),
                       check_fp16_scaler(results), check_more_ranks_than_gpus(results, gpus))),
        ("5", lambda: check_fsdp_resume(results, gpus)),
        ("6", lambda: (check_training_speed(results, options.rounds),
                       check_launch_round_trip(results, 5))),
    ]
    for number, step in steps:
        if number in skip:
            continue
        with results.guard(f"{number}. (the check itself)"):
            step()
    write(results, facts, time.perf_counter() - started, options.out)
    return 0 if all(item.passed for item in results.items) else 1


if __name__ == "__main__":
    sys.exit(main())
