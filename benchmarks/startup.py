"""Time to first step: how long ranks take to start, each case in a fresh Jupyter kernel.

Every case starts a kernel of its own (jupyter_client), runs an untimed set-up cell (torch
imported, the 2-rank function defined, the library imported), waits ``--pause`` seconds (a
person writing the next cell; the same for every case), then times the cells a person waits
for, from ``execute`` to the kernel's idle (the client's clock):

- nbtrain ``notebook_launcher`` (auto start: fork on CPU) as a person gets it: ``import nbtrain``
  (which, in a kernel, warms up while the kernel is idle: kernel/procs/warmup.py), the pause, the
  first launch, then a relaunch;
- the same first launch in the cell right after the import (no pause: the worst case);
- the first launch and a relaunch with ``NBTRAIN_WARM_UP=0`` (no warm-up: what a launch costs
  when nothing was prepared);
- how long the warm-up takes after the import cell (``warm-up``);
- Accelerate's ``notebook_launcher``: first launch, relaunch;
- raw ``torch.multiprocessing.start_processes`` with fork, then with spawn;
- ``nbtrain.start_ranks(2)`` plus a first ``%%ranks`` cell (after the pause, at once, and with
  no warm-up);
- ipyparallel's ``Cluster(n=2).start_and_connect_sync()`` plus a first ``execute``.

The function forms a gloo group of 2 and does one all_reduce (``--step``: then one DDP optimizer
step, nbtrain's and Accelerate's launches only: the first step of a training function). Cases
rotate per round (drift on a shared machine hits all alike). Then where nbtrain's seconds go,
from fresh processes: starting Python, importing torch (and torch._dynamo, which any optimizer
imports), forming the process group inside the ranks, and the rest of a launch (the channel,
the view, the kernel's side).

    python benchmarks/startup.py [--rounds 3] [--pause 5] [--before DIR]

``--before DIR``: nbtrain's cases also run from an older nbtrain in DIR (e.g.
``git archive <commit> nbtrain | tar -x -C DIR``), in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernel"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from common import rotation
from warm import cell_round_trip

FIRST_VS_ACCELERATE = 1.0  # goals (issue 34): nbtrain's first launch / Accelerate's
RANKS_VS_IPYPARALLEL = 0.5  # start_ranks(2) + a first cell / ipyparallel's start + execute

SETUP = """
import time, json, torch, torch.distributed as dist
def trivial():
    began = time.perf_counter()
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    formed = time.perf_counter() - began
    dist.destroy_process_group()
    return formed
def first_step():  # --step: the group, then a first DDP optimizer step (imports torch._dynamo)
    began = time.perf_counter()
    dist.init_process_group("gloo")
    formed = time.perf_counter() - began
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    dist.destroy_process_group()
    return formed
"""

# The default: in a kernel, it warms up while idle (whatever this shell's NBTRAIN_WARM_UP says)
NBTRAIN_IMPORT = "import os\nos.environ.pop('NBTRAIN_WARM_UP', None)\nimport nbtrain"
NBTRAIN_NO_WARM_UP = "import os\nos.environ['NBTRAIN_WARM_UP'] = '0'\nimport nbtrain"
WARMING = "from nbtrain.kernel.procs import warmup\nprint(warmup.running())"
# (--step: first_step instead of trivial, here and in Accelerate's)
NBTRAIN_LAUNCH = "_formed = nbtrain.notebook_launcher(trivial, num_processes=2)"
ACCELERATE_IMPORT = "from accelerate import notebook_launcher"
ACCELERATE_LAUNCH = "notebook_launcher(trivial, num_processes=2)"
RAW_MODULE = """
import os, socket, torch, torch.distributed as dist
def raw_rank(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2")
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
"""
# (in a module of its own: spawn children import the function by name)
RAW_IMPORT = f"""
import sys, tempfile, pathlib, torch.multiprocessing as torch_mp
_where = tempfile.mkdtemp()
pathlib.Path(_where, "startup_raw.py").write_text({RAW_MODULE!r})
sys.path.insert(0, _where)
from startup_raw import raw_rank, free_port
"""
RAW = "torch_mp.start_processes(raw_rank, args=(free_port(),), nprocs=2, start_method={!r})"
RANKS_START = "ranks = nbtrain.start_ranks(2)"
RANKS_CELL = "%%ranks\npass"
RANKS_STOP = "ranks.stop()"
IPP_IMPORT = "import ipyparallel as ipp"
IPP_START = (
    "cluster = ipp.Cluster(n=2, log_level=40)\n"
    "rc = cluster.start_and_connect_sync()\n"
    "rc.wait_for_engines(2, timeout=120)"
)
IPP_CELL = "rc[:].execute('pass', block=True)"
IPP_STOP = "cluster.stop_cluster_sync()"


class Fresh:
    """A fresh kernel that ran SETUP and ``imports``, then waited ``pause`` seconds."""

    def __init__(self, imports: str, pause: float, nbtrain_from: str | None = None) -> None:
        """``nbtrain_from``: the kernel imports nbtrain from that folder (an older checkout)."""
        from kernelutil import Kernel

        self._dir = tempfile.TemporaryDirectory()
        saved = os.environ.get("PYTHONPATH")
        if nbtrain_from is not None:
            os.environ["PYTHONPATH"] = nbtrain_from  # the kernel's own; ours is restored below
        try:
            self.kernel = Kernel(Path(self._dir.name))
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        self.run(SETUP + "\n" + imports)
        time.sleep(pause)

    def run(self, code: str) -> None:
        out = self.kernel.run(code, timeout=300)
        if out.error is not None:
            raise RuntimeError(f"{code!r} failed:\n{out.traceback_text}")

    def warm_up_seconds(self) -> float:
        """Seconds until nbtrain's warm-up (steps run while the kernel is idle) is over, from
        the end of the import cell: asked every 50 ms (each question runs between two steps)."""
        began = time.perf_counter()
        while self.kernel.run(WARMING).stdout.split()[-1] == "True":
            time.sleep(0.05)
        return time.perf_counter() - began

    def time(self, code: str) -> float:
        return cell_round_trip(self.kernel.client, code, timeout=300)

    def close(self) -> None:
        self.kernel.shutdown()
        self._dir.cleanup()


Samples = dict[str, list[float]]


BEFORE: str | None = None  # --before: an older checkout's folder, measured beside this one


def launches(samples: Samples, pause: float, which: str) -> None:
    """A fresh kernel's first launch and a relaunch (nbtrain's or Accelerate's)."""
    imports, launch = (
        (NBTRAIN_NO_WARM_UP, NBTRAIN_LAUNCH) if which == "nbtrain (no warm-up)" else
        (NBTRAIN_IMPORT, NBTRAIN_LAUNCH) if which.startswith("nbtrain") else
        (ACCELERATE_IMPORT, ACCELERATE_LAUNCH)
    )
    fresh = Fresh(imports, pause, BEFORE if which.endswith("(before)") else None)
    try:
        samples[f"{which} first launch"].append(fresh.time(launch))
        if which == "nbtrain":  # the part of it spent in rank 0 forming the group
            formed = fresh.kernel.value("_formed")
            samples["nbtrain first launch: forming the group (in rank 0)"].append(formed)
        samples[f"{which} relaunch"].append(fresh.time(launch))
    finally:
        fresh.close()


def nbtrain_at_once(samples: Samples, pause: float) -> None:
    """The first launch in the very next cell after ``import nbtrain`` (no pause)."""
    fresh = Fresh(NBTRAIN_IMPORT, 0.0)
    try:
        samples["nbtrain first launch, next cell at once"].append(fresh.time(NBTRAIN_LAUNCH))
    finally:
        fresh.close()


def warm_up(samples: Samples, pause: float) -> None:
    """How long nbtrain's warm-up takes after the import cell (no pause)."""
    fresh = Fresh(NBTRAIN_IMPORT, 0.0)
    try:
        samples["nbtrain warm-up, while the kernel is idle after import"].append(
            fresh.warm_up_seconds())
    finally:
        fresh.close()


def raw(samples: Samples, pause: float) -> None:
    fresh = Fresh(RAW_IMPORT, pause)
    try:
        samples["raw torch fork, first"].append(fresh.time(RAW.format("fork")))
        samples["raw torch spawn, first"].append(fresh.time(RAW.format("spawn")))
    finally:
        fresh.close()


def warm_ranks(
    samples: Samples, pause: float, before: bool = False, at_once: bool = False,
    warm_up: bool = True,
) -> None:
    imports = NBTRAIN_IMPORT if warm_up else NBTRAIN_NO_WARM_UP
    fresh = Fresh(imports, 0.0 if at_once else pause, BEFORE if before else None)
    try:
        started = fresh.time(RANKS_START)
        name = "nbtrain (before) start_ranks(2) + first cell" if before else (
            "nbtrain start_ranks(2) + first cell, next cell at once" if at_once else
            "nbtrain (no warm-up) start_ranks(2) + first cell" if not warm_up else
            "nbtrain start_ranks(2) + first cell")
        samples[name].append(started + fresh.time(RANKS_CELL))
        fresh.run(RANKS_STOP)
    finally:
        fresh.close()


def ipyparallel(samples: Samples, pause: float) -> None:
    fresh = Fresh(IPP_IMPORT, pause)
    try:
        started = fresh.time(IPP_START)
        samples["ipyparallel Cluster(n=2) + first execute"].append(started + fresh.time(IPP_CELL))
        fresh.run(IPP_STOP)
    finally:
        fresh.close()


CASES: dict[str, Callable[[Samples, float], None]] = {
    "nbtrain": lambda s, p: launches(s, p, "nbtrain"),
    "nbtrain at once": nbtrain_at_once,
    "warm-up": warm_up,
    "nbtrain no warm-up": lambda s, p: launches(s, p, "nbtrain (no warm-up)"),
    "nbtrain before": lambda s, p: launches(s, p, "nbtrain (before)"),
    "start_ranks before": lambda s, p: warm_ranks(s, p, before=True),
    "start_ranks at once": lambda s, p: warm_ranks(s, p, at_once=True),
    "accelerate": lambda s, p: launches(s, p, "accelerate"),
    "raw": raw,
    "start_ranks": warm_ranks,
    "start_ranks no warm-up": lambda s, p: warm_ranks(s, p, warm_up=False),
    "ipyparallel": ipyparallel,
}


def process_seconds(code: str, repeats: int) -> float:
    """Median wall time of a fresh ``python -c code`` (this venv's interpreter)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def split(repeats: int) -> list[tuple[str, float]]:
    """Where a rank's start-up seconds go, measured apart (each a median of fresh processes)."""
    python = process_seconds("pass", repeats)
    torch = process_seconds("import torch, torch.distributed", repeats)
    dynamo = process_seconds("import torch, torch.distributed, torch._dynamo", repeats)
    rank_side = process_seconds(
        "import torch, torch.distributed, torch._dynamo, nbtrain.rank.worker", repeats
    )
    # Cumulative (each a fresh process doing all of the above): differences of medians taken
    # on a loaded machine can come out negative.
    return [
        ("a fresh Python (this venv) that does nothing", python),
        ("... that imports torch + torch.distributed", torch),
        ("... and torch._dynamo (any optimizer imports it)", dynamo),
        ("... and nbtrain's rank side (what a forkserver preloads)", rank_side),
    ]


def ratio_line(samples: Samples, ours: str, theirs: str, goal: float) -> str:
    mine, other = statistics.median(samples[ours]), statistics.median(samples[theirs])
    verdict = "met" if mine <= goal * other else "MISSED"
    return f"{ours} / {theirs}: {mine / other:.2f}x (goal <= {goal}x: {verdict})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause", type=float, default=5.0,
                        help="seconds between the set-up cell and the timed ones")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    parser.add_argument("--split-repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the samples here")
    parser.add_argument("--step", action="store_true",
                        help="nbtrain's and Accelerate's launches also take a first DDP optimizer "
                        "step (which imports torch._dynamo), as a training function's first step")
    parser.add_argument("--before", help="a folder holding an older nbtrain/ (e.g. from git "
                        "archive): its first launch and start_ranks are measured too")
    args = parser.parse_args()
    global BEFORE, NBTRAIN_LAUNCH, ACCELERATE_LAUNCH
    if args.step:  # the time to a first optimizer step, not only to a formed group
        NBTRAIN_LAUNCH = NBTRAIN_LAUNCH.replace("(trivial,", "(first_step,")
        ACCELERATE_LAUNCH = ACCELERATE_LAUNCH.replace("(trivial,", "(first_step,")
    BEFORE = args.before
    chosen = [name for name in args.cases.split(",") if name]
    if not BEFORE:
        chosen = [name for name in chosen if not name.endswith(" before")]
    samples: Samples = {}
    for name in chosen:
        if name not in CASES:
            parser.error(f"--cases: unknown case {name!r}; choose from {', '.join(CASES)}")
    for key in (
        "nbtrain warm-up, while the kernel is idle after import",
        "nbtrain first launch",
        "nbtrain first launch: forming the group (in rank 0)",
        "nbtrain relaunch",
        "nbtrain first launch, next cell at once",
        "nbtrain (no warm-up) first launch",
        "nbtrain (no warm-up) relaunch",
        "nbtrain (before) first launch",
        "nbtrain (before) relaunch",
        "accelerate first launch",
        "accelerate relaunch",
        "raw torch fork, first",
        "raw torch spawn, first",
        "nbtrain start_ranks(2) + first cell",
        "nbtrain start_ranks(2) + first cell, next cell at once",
        "nbtrain (no warm-up) start_ranks(2) + first cell",
        "nbtrain (before) start_ranks(2) + first cell",
        "ipyparallel Cluster(n=2) + first execute",
    ):
        samples[key] = []
    began = time.monotonic()
    for round_ in range(args.rounds):
        for name in rotation(chosen, round_):
            CASES[name](samples, args.pause)
    samples = {name: values for name, values in samples.items() if values}
    load = os.getloadavg()[0]
    print(f"Time to first step, N=2, {args.rounds} rounds, fresh kernel per case, "
          f"{args.pause:g} s pause after the set-up cell; {platform.processor() or 'cpu'}, "
          f"{os.cpu_count()} cores, load {load:.2f}, {time.monotonic() - began:.0f} s\n")
    base = "accelerate first launch" if "accelerate first launch" in samples else None
    versus = " vs Accelerate's first |" if base else ""
    print("| case | median (s) | min (s) | max (s) |" + versus)
    print("|---|---|---|---|" + ("---|" if base else ""))
    for name, values in samples.items():
        median = statistics.median(values)
        row = f"| {name} | {median:.3f} | {min(values):.3f} | {max(values):.3f} |"
        if base:
            row += f" {median / statistics.median(samples[base]):.2f}x |"
        print(row)
    print()
    if base and "nbtrain first launch" in samples:
        print(ratio_line(samples, "nbtrain first launch", base, FIRST_VS_ACCELERATE))
    ranks, ipp = "nbtrain start_ranks(2) + first cell", "ipyparallel Cluster(n=2) + first execute"
    if ranks in samples and ipp in samples:
        print(ratio_line(samples, ranks, ipp, RANKS_VS_IPYPARALLEL))
    if args.split_repeats:
        print("\nWhere a fresh rank's seconds go (fresh processes, median of "
              f"{args.split_repeats}):\n\n| process | s |\n|---|---|")
        for part, seconds in split(args.split_repeats):
            print(f"| {part} | {seconds:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1))


if __name__ == "__main__":
    main()
