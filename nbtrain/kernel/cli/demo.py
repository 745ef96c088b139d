"""``nbtrain demo``: a real data-parallel training on CPU ranks, with the live text progress.

A set-up check that shows the whole path at once: ranks start, form a gloo process group, train
a small MLP on their own shards of generated data (rank/demo_training.py), report progress and
metrics to the launching process, and send results back. Finishes in seconds on two cores.
"""

from __future__ import annotations

import time
from typing import Any


def main(num_processes: int = 2) -> int:
    from nbtrain import notebook_launcher
    from nbtrain.rank.demo_training import HIDDEN, POINTS, train

    print(
        f"nbtrain demo: a 2-{HIDDEN}-{HIDDEN}-2 MLP learns {POINTS:,} points of two "
        f"interleaved spirals, data-parallel on {num_processes} CPU ranks (gloo, DDP)",
        flush=True,
    )
    started = time.perf_counter()
    results: list[dict[str, Any]] = notebook_launcher(
        train, num_processes=num_processes, progress="text", return_all=True
    )
    print(_summary(results, time.perf_counter() - started), flush=True)
    return 0


def _summary(results: list[dict[str, Any]], elapsed: float) -> str:
    from nbtrain.rank.demo_training import POINTS
    main_rank = results[0]
    same = max(r["checksum"] for r in results) - min(r["checksum"] for r in results) < 1e-9
    agreement = "identical on every rank" if same else "DIFFERENT across ranks (a bug!)"
    return (
        f"Result: loss {main_rank['first_loss']:.3f} -> {main_rank['final_loss']:.3f}, "
        f"accuracy {100 * main_rank['accuracy']:.1f}% on all {POINTS:,} points; "
        f"{main_rank['steps']} steps per rank; weights {agreement}; "
        f"{elapsed:.1f}s in total (training {main_rank['seconds']:.1f}s)"
    )
