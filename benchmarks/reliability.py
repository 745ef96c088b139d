"""Reliability figures: the fault matrix of tests/reliability, run outside pytest.

Every case injects one fault (raise, sys.exit(3), os._exit(3), SIGKILL, SIGSEGV, hang with
timeout=) into rank 0 or the last rank, under fork / forkserver / spawn, in one of four phases
(before the process group exists, inside a collective, while DataLoader workers iterate, during
save_state), then checks the root cause, that every process of the launch (ranks and DataLoader
workers) is gone, and that the next launch works. Prints a markdown table:

    faults injected | root cause exact | rank's traceback shown | surviving processes
    | next launch worked | control back (median, max)

"Control back" is the time from the fault (for a hang: from the timeout's expiry) to the
exception in the launching process.

    python benchmarks/reliability.py [--methods fork,forkserver,spawn] [--phases ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "reliability"))

import faultmatrix as matrix
from rankfaults import FAULTS, PHASES, VICTIMS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--methods", default=",".join(matrix.METHODS))
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--faults", default=",".join(FAULTS))
    options = parser.parse_args()
    methods, phases = options.methods.split(","), options.phases.split(",")
    faults = options.faults.split(",")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as root:
        for index, (method, phase, fault, victim) in enumerate(matrix.all_cases()):
            if method not in methods or phase not in phases or fault not in faults:
                continue
            assert victim in VICTIMS
            result = matrix.run_case(method, phase, fault, victim, Path(root) / str(index))
            problems = result.problems() + result.traceback_problems()
            status = "ok" if not problems else "; ".join(problems)[:160]
            print(f"{method:10} {phase:12} {fault:8} {victim:5} {result.seconds:6.2f}s  {status}",
                  flush=True)
    print(f"\nFault matrix, 2 ranks, {len(matrix.RESULTS)} cases in "
          f"{time.monotonic() - started:.0f} s\n")
    print(matrix.summary(matrix.RESULTS))


if __name__ == "__main__":
    main()
