"""What a newcomer meets first, measured: the README's "Why nbtrain" and the cluster guide's
fail-fast claim.

1. ``launchers``: Accelerate's ``notebook_launcher(train, num_processes=2)`` and nbtrain's, on
   this (CPU) machine: what the launch returns, and what the ``Accelerator`` in each process
   reports (``num_processes``, ``process_index``, ``distributed_type``, torch's world size).
2. ``ray``: ``cluster="ray"`` without ``ray.init``: the milliseconds to the error in a fresh
   interpreter (after one launch call has imported the launcher, as in a notebook), and whether
   Ray got imported to find out.

    python benchmarks/first_contact.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LAUNCH = """
import os, sys, tempfile
out = sys.argv[2]
def train():
    import torch.distributed as dist
    from accelerate import Accelerator
    acc = Accelerator()
    world = dist.get_world_size() if dist.is_initialized() else None
    with open(os.path.join(out, str(os.getpid())), "w") as f:
        f.write(f"num_processes={acc.num_processes} process_index={acc.process_index} "
                f"distributed_type={acc.distributed_type.value} torch_world_size={world}")
    return "the function's value"
if sys.argv[1] == "accelerate":
    from accelerate import notebook_launcher
    value = notebook_launcher(train, num_processes=2)
else:
    from nbtrain import notebook_launcher
    value = notebook_launcher(train, num_processes=2, progress="off")
print("RETURNED", repr(value))
"""

RAY = """
import sys, time, nbtrain
def f(): return 1
try:
    nbtrain.notebook_launcher(f, num_processes=2, cluster="slurm")  # imports the launcher
except ValueError:
    pass
began = time.perf_counter()
try:
    nbtrain.notebook_launcher(f, num_processes=2, cluster="ray")
except Exception as exc:
    print("ERROR", type(exc).__name__, (time.perf_counter() - began) * 1000, "ray" in sys.modules)
"""


def launchers() -> None:
    for which in ("accelerate", "nbtrain"):
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run([sys.executable, "-c", LAUNCH, which, out], text=True,
                                  capture_output=True, timeout=300)  # fmt: skip
            returned = [line for line in done.stdout.splitlines() if line.startswith("RETURNED")]
            print(f"{which}: {returned[0] if returned else done.stderr[-500:]}")
            for name in sorted(os.listdir(out)):
                print(f"  a process: {Path(out, name).read_text()}")


def ray(rounds: int) -> None:
    times, imported = [], set()
    for _ in range(rounds):
        done = subprocess.run([sys.executable, "-c", RAY], text=True, capture_output=True,
                              timeout=300)  # fmt: skip
        words = done.stdout.split()
        times.append(float(words[2]))
        imported.add(words[3])
    print(
        f"cluster='ray' without ray.init: median {statistics.median(times):.1f} ms, "
        f"min {min(times):.1f} ms over {rounds} fresh interpreters; Ray imported: {imported}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    launchers()
    ray(options.rounds)
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
