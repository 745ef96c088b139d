"""Big data between the kernel and the ranks (N=2, a 512 MiB float32 tensor), paired with raw
torch in one run, the cases alternating round by round:

1. the function reads a notebook global: nbtrain fork vs raw ``torch.multiprocessing`` fork;
2. the tensor passed in ``args``: nbtrain forkserver (warm) vs raw ``torch.multiprocessing``
   spawn (a fresh, unshared tensor each round: torch moves a tensor it sends into shared memory);
3. rank 0 returns the tensor: nbtrain fork vs raw fork where rank 0 ``torch.save``s it to a file
   the kernel ``torch.load``s.

Every rank reports its USS (psutil: memory only it holds) after reading the whole tensor.

    python benchmarks/payload.py [--rounds 5] [--mib 512] [--only global|argument|result]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from common import free_port, rotation

from nbtrain import notebook_launcher

QUIET = {"progress": "off", "output": "none"}
MiB = 1 << 20
DATA = torch.empty(0)  # the notebook global, filled in main()


def uss_mib() -> float:
    return psutil.Process().memory_full_info().uss / MiB


def read_all(data: torch.Tensor) -> float:
    """Read every byte of ``data`` in every rank, then report this rank's private memory."""
    dist.init_process_group("gloo")
    total = float(data.sum())
    dist.barrier()  # both ranks have read everything before either measures
    uss = uss_mib()
    dist.barrier()
    dist.destroy_process_group()
    assert total == data.numel()
    return uss


def read_global() -> float:
    return read_all(DATA)


def make_result(numel: int) -> torch.Tensor | None:
    return torch.ones(numel) if os.environ["RANK"] == "0" else None


# -- raw torch.multiprocessing ----------------------------------------------------------------


def _raw_env(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2")


def raw_global_rank(rank: int, port: int, out: str) -> None:
    _raw_env(rank, port)
    with open(os.path.join(out, f"uss{rank}"), "w") as handle:
        handle.write(str(read_global()))


def raw_arg_rank(rank: int, port: int, out: str, data: torch.Tensor) -> None:
    _raw_env(rank, port)
    with open(os.path.join(out, f"uss{rank}"), "w") as handle:
        handle.write(str(read_all(data)))


def raw_result_rank(rank: int, port: int, path: str, numel: int) -> None:
    _raw_env(rank, port)
    value = make_result(numel)
    if value is not None:
        torch.save(value, path)


def _raw_uss(out: str) -> list[float]:
    values = []
    for rank in range(2):
        with open(os.path.join(out, f"uss{rank}")) as handle:
            values.append(float(handle.read()))
    return values


# -- the cases ----------------------------------------------------------------------------------

Case = Callable[[], list[float]]  # runs one launch; returns the ranks' USS (MiB), if measured


def cases(numel: int) -> dict[str, tuple[Callable[[], Case], str]]:
    """name -> (setup returning the timed call, the group it is paired within)."""

    def raw_fork_global() -> Case:
        out = tempfile.mkdtemp()

        def run() -> list[float]:
            torch_mp.start_processes(raw_global_rank, args=(free_port(), out), nprocs=2,
                                     start_method="fork")
            return _raw_uss(out)

        return run

    def nbtrain_fork_global() -> Case:
        return lambda: notebook_launcher(read_global, num_processes=2, start_method="fork",
                                         return_all=True, **QUIET)

    def raw_spawn_arg() -> Case:
        out = tempfile.mkdtemp()
        fresh = DATA.clone()  # not yet in shared memory, as a user's tensor would be

        def run() -> list[float]:
            torch_mp.start_processes(raw_arg_rank, args=(free_port(), out, fresh), nprocs=2,
                                     start_method="spawn")
            return _raw_uss(out)

        return run

    def nbtrain_forkserver_arg() -> Case:
        return lambda: notebook_launcher(read_all, args=(DATA,), num_processes=2,
                                         start_method="forkserver", return_all=True, **QUIET)

    def raw_fork_file() -> Case:
        path = os.path.join(tempfile.mkdtemp(), "result.pt")

        def run() -> list[float]:
            torch_mp.start_processes(raw_result_rank, args=(free_port(), path, numel), nprocs=2,
                                     start_method="fork")
            value = torch.load(path)
            os.unlink(path)
            assert value.numel() == numel
            return []

        return run

    def nbtrain_fork_result() -> Case:
        def run() -> list[float]:
            value = notebook_launcher(make_result, args=(numel,), num_processes=2,
                                      start_method="fork", **QUIET)
            assert value.numel() == numel
            return []

        return run

    return {
        "raw fork, global": (raw_fork_global, "global"),
        "nbtrain fork, global": (nbtrain_fork_global, "global"),
        "raw spawn, argument": (raw_spawn_arg, "argument"),
        "nbtrain forkserver, argument": (nbtrain_forkserver_arg, "argument"),
        "raw fork + torch.save/load": (raw_fork_file, "result"),
        "nbtrain fork, result": (nbtrain_fork_result, "result"),
    }


def main() -> None:
    global DATA
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--only", choices=["global", "argument", "result"],
                        help="run one pair of cases")
    options = parser.parse_args()
    torch.set_num_threads(1)
    numel = options.mib * MiB // 4
    DATA = torch.ones(numel)
    table = {name: case for name, case in cases(numel).items()
             if options.only in (None, case[1])}
    notebook_launcher(make_result, args=(1,), num_processes=2, start_method="forkserver", **QUIET)
    times: dict[str, list[float]] = {name: [] for name in table}
    uss: dict[str, list[float]] = {name: [] for name in table}
    for round_ in range(options.rounds):
        for name in rotation(list(table), round_):
            run = table[name][0]()
            start = time.perf_counter()
            measured = run()
            times[name].append(time.perf_counter() - start)
            uss[name].extend(measured)
            del run
    report(table, times, uss, options.mib)


def report(table: dict, times: dict[str, list[float]], uss: dict[str, list[float]],
           mib: int) -> None:
    print(f"{mib} MiB, 2 ranks, {len(next(iter(times.values())))} rounds")
    print("| case | median (s) | min (s) | vs raw (paired per round) | rank USS, max (MiB) |")
    print("|---|---|---|---|---|")
    names = list(table)
    for raw, ours in zip(names[::2], names[1::2], strict=True):
        ratios = [o / r for o, r in zip(times[ours], times[raw], strict=True)]
        for name, ratio in ((raw, "1.00x"), (ours, f"{statistics.median(ratios):.2f}x")):
            peak = f"{max(uss[name]):.0f}" if uss[name] else "-"
            print(f"| {name} | {statistics.median(times[name]):.3f} | {min(times[name]):.3f} "
                  f"| {ratio} | {peak} |")


if __name__ == "__main__":
    main()
