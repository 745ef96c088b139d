"""Big data between the kernel and real ranks: by reference, not by copy (payload.py).

Memory is measured as each rank's USS (psutil: the pages only that process holds), paired in
one test: the same function on a big and on a small payload. The timing goals live in
benchmarks/payload.py, not here.
"""

from __future__ import annotations

import glob
import os
import signal
import sys
import threading
import time

import cloudpickle
import numpy as np
import psutil
import pytest
import torch
import torch.distributed as dist

from nbtrain import WorkerError, notebook_launcher
from nbtrain.shared import sharedmem

pytestmark = pytest.mark.timeout(300)

QUIET = {"progress": "off", "output": "none"}
MiB = 1 << 20
BOUND = 64 * MiB  # a rank's private memory may grow by this much for the big payload

BIG = torch.empty(0)  # notebook globals the functions read; filled by the tests
SMALL = torch.ones(4 * MiB // 4)


def own_segments() -> list[str]:
    """This kernel's segments (other sessions on the machine have their own pid)."""
    return glob.glob(os.path.join(sharedmem.SHM_DIR, f"nbtrain_{os.getpid()}_*"))


@pytest.fixture
def big_global():
    """BIG as a notebook global: this module's functions travel by value, with the globals
    they read, as cloudpickle sends functions defined in a notebook."""
    global BIG
    BIG = torch.ones(192 * MiB // 4)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield BIG
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    BIG = torch.empty(0)  # free it at once: the machine is shared


def read_everything(tensor: torch.Tensor, array: np.ndarray) -> tuple[int, float]:
    """Every rank reads every byte; USS is taken once both ranks have read all of it."""
    dist.init_process_group("gloo")
    total = float(tensor.sum()) + float(array.sum())
    dist.barrier()
    uss = psutil.Process().memory_full_info().uss
    dist.barrier()
    dist.destroy_process_group()
    return uss, total


def read_big(array):
    return read_everything(BIG, array)


def read_small(array):
    return read_everything(SMALL, array)


def test_ranks_read_a_big_global_and_argument_without_private_copies(method, big_global):
    """192 MiB global + 64 MiB argument: each rank's USS exceeds the small payload's by
    at most 64 MiB under every start method, and nothing is left in /dev/shm."""
    small = np.ones(MiB // 8)
    big = np.ones(64 * MiB // 8)
    run = {"num_processes": 2, "start_method": method, "return_all": True, **QUIET}
    baseline = notebook_launcher(read_small, args=(small,), **run)
    measured = notebook_launcher(read_big, args=(big,), **run)
    assert [total for _, total in measured] == [float(BIG.numel() + big.size)] * 2
    growth = [uss - base for (uss, _), (base, _) in zip(measured, baseline, strict=True)]
    assert max(growth) <= BOUND, f"rank USS grew by {[g // MiB for g in growth]} MiB"
    assert own_segments() == []
    assert sharedmem.FORK_REGISTRY == {}


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_through_the_elastic_agent_too(method, big_global):
    """max_restarts > 0 goes through torch's elastic agent: the same sharing, restarts included."""
    small = np.ones(MiB // 8)
    big = np.ones(64 * MiB // 8)
    run = {"num_processes": 2, "start_method": method, "return_all": True, "max_restarts": 1}
    baseline = notebook_launcher(read_small, args=(small,), **run, **QUIET)
    measured = notebook_launcher(read_big, args=(big,), **run, **QUIET)
    assert [total for _, total in measured] == [float(BIG.numel() + big.size)] * 2
    growth = [uss - base for (uss, _), (base, _) in zip(measured, baseline, strict=True)]
    assert max(growth) <= BOUND, f"rank USS grew by {[g // MiB for g in growth]} MiB"
    assert own_segments() == []
    assert sharedmem.FORK_REGISTRY == {}


def identities(tensor):
    return id(BIG), id(tensor), os.getpid()


def test_fork_ranks_get_the_kernels_own_objects(big_global):
    """Under fork nothing is pickled: the rank sees the kernel's objects at their addresses."""
    arg = torch.zeros(10)
    values = notebook_launcher(identities, args=(arg,), num_processes=2, start_method="fork",
                               return_all=True, **QUIET)
    for global_id, arg_id, pid in values:
        assert (global_id, arg_id) == (id(BIG), id(arg)) and pid != os.getpid()


def write_then_read(tensor):
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        tensor.add_(1)
    dist.barrier()  # rank 1 has written before rank 0 reads
    seen = float(tensor.sum())
    dist.destroy_process_group()
    return seen


def test_a_rank_writing_to_a_payload_changes_only_its_own_copy(method):
    data = torch.zeros(4 * MiB // 4)  # above sharedmem.MIN_SHARED: shared, not pickled
    seen = notebook_launcher(write_then_read, args=(data,), num_processes=2, start_method=method,
                             return_all=True, **QUIET)
    assert seen == [0.0, float(data.numel())]
    assert float(data.sum()) == 0.0
    assert own_segments() == []


def make_results(numel):
    rank = int(os.environ["RANK"])
    return torch.full((numel,), float(rank + 1)), np.full(numel // 2, rank + 1.0)


def _mapped_from_shm(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return len(fields) > 5 and fields[5].startswith(sharedmem.SHM_DIR + "/nbtrain_")
    return False


def test_big_results_arrive_mapped_not_copied(method):
    numel = 48 * MiB // 4
    values = notebook_launcher(make_results, args=(numel,), num_processes=2, start_method=method,
                               return_all=True, **QUIET)
    for rank, (tensor, array) in enumerate(values):
        assert tensor.shape == (numel,) and float(tensor[-1]) == rank + 1
        assert array.shape == (numel // 2,) and float(array[0]) == rank + 1
        # The kernel's result *is* the mapping the rank wrote: no copy was made here.
        assert _mapped_from_shm(tensor.data_ptr()) and _mapped_from_shm(array.ctypes.data)
    assert own_segments() == []  # names gone at once; the memory lives as long as the result
    tensor.add_(1)  # a result is the kernel's own, writable memory
    assert float(tensor[0]) == 3.0


def fail_after_results(data, how):
    dist.init_process_group("gloo")
    if int(os.environ["RANK"]) == 0:
        return data + 1  # a result the kernel will never collect
    time.sleep(0.5)
    if how == "raise":
        raise ValueError("boom")
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)  # "timeout", "interrupt"


OUTCOMES = [
    *((method, how) for method in ("fork", "forkserver", "spawn") for how in ("raise", "sigkill")),
    ("forkserver", "timeout"),
    ("forkserver", "interrupt"),
]


@pytest.mark.parametrize(("method", "how"), OUTCOMES)
def test_every_outcome_leaves_dev_shm_clean(method, how):
    """The argument lives in a segment (forkserver, spawn), rank 0's result in another; a
    failure, a SIGKILLed rank, a timeout or an interrupt must remove both."""
    data = torch.ones(32 * MiB // 4)
    run = {"num_processes": 2, "start_method": method, **QUIET}
    expected = {"raise": WorkerError, "sigkill": WorkerError, "timeout": TimeoutError,
                "interrupt": KeyboardInterrupt}[how]
    timer = threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGINT))
    if how == "interrupt":
        timer.start()
    try:
        with pytest.raises(expected):
            notebook_launcher(fail_after_results, args=(data, how),
                              timeout=4.0 if how == "timeout" else None, **run)
    finally:
        timer.cancel()
        if timer.is_alive():
            timer.join()
    assert own_segments() == []
    assert sharedmem.FORK_REGISTRY == {}


def echo_size(tensor):
    return tensor.numel()


@pytest.mark.slow
def test_fifty_launches_with_big_payloads_leave_nothing_behind():
    data = torch.ones(64 * MiB // 4)
    me = psutil.Process()
    before_shm = sorted(os.listdir(sharedmem.SHM_DIR))
    rss = []
    for _ in range(50):
        result = notebook_launcher(make_results, args=(data.numel(),), num_processes=2,
                                   start_method="forkserver", **QUIET)
        assert notebook_launcher(echo_size, args=(data,), num_processes=2,
                                 start_method="forkserver", **QUIET) == data.numel()
        del result
        rss.append(me.memory_info().rss)
    assert own_segments() == []
    leftover = [name for name in os.listdir(sharedmem.SHM_DIR)
                if name not in before_shm and name.startswith(("nbtrain_", "torch_"))]
    assert leftover == []
    assert rss[-1] - rss[4] < 64 * MiB, f"the kernel grew by {(rss[-1] - rss[4]) // MiB} MiB"


def test_a_large_payload_is_named_in_the_start_up_status(capsys):
    data = torch.ones(64 * MiB // 4)
    notebook_launcher(echo_size, args=(data,), num_processes=2, start_method="forkserver",
                      progress="text", output="none")
    assert "sharing 64 MiB with 2 ranks" in capsys.readouterr().err
