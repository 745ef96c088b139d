"""Soak: 100 launches in one real Jupyter kernel, one cell each, leave the kernel as they found it.

A realistic mix, with the default display (progress="auto": widgets in a kernel): successes
that train with gloo and return tensors, failures, timeouts, ranks with DataLoader workers,
forkserver and spawn launches. Measured in the kernel after a warm-up and again at the end:
live child processes, open file descriptors, threads, /dev/shm entries (no growth allowed), and
the kernel's resident memory (growth within 30 MB).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kernelutil import running_kernel

pytestmark = [pytest.mark.soak, pytest.mark.timeout(900)]

LAUNCHES = 100
WARM_UP = 10
RSS_GROWTH_LIMIT = 30 << 20

TESTS = Path(__file__).resolve().parent.parent

SETUP = """
import gc, os, sys, threading, time, psutil, torch
import torch.distributed as dist
from nbtrain import notebook_launcher, WorkerError
sys.path.insert(0, TESTS_DIR)  # procguard
from procguard import ProcessWatch

me = psutil.Process()
processes = ProcessWatch()  # forkserver ranks and orphans count, the helpers themselves not

def fd_targets():
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return found

def snapshot():
    # Counts at rest: the least seen over a few samples (the kernel's own machinery opens
    # short-lived descriptors now and then; a leak would add one per launch).
    gc.collect()
    samples = []
    for _ in range(5):
        kids = processes.alive()
        samples.append({"children": len(kids), "fds": len(fd_targets()),
                        "threads": threading.active_count(), "os_threads": me.num_threads(),
                        "shm": len(os.listdir("/dev/shm"))})
        time.sleep(0.1)
    least = {key: min(sample[key] for sample in samples) for key in samples[0]}
    return {**least, "fd_targets": fd_targets(), "shm_names": sorted(os.listdir("/dev/shm")),
            "rss": me.memory_info().rss, "comms": len(get_ipython().kernel.comm_manager.comms)}

def train(kind):
    rank = int(os.environ["RANK"])
    if kind == "fail" and rank == 1:
        raise RuntimeError("planned failure")
    if kind == "hang":
        time.sleep(600)
    if kind == "loader":
        from torch.utils.data import DataLoader
        return sum(int(b.sum()) for b in DataLoader(torch.arange(64), batch_size=8,
                                                     num_workers=2))
    dist.init_process_group("gloo")
    model = torch.nn.Linear(16, 4)
    for _ in range(5):
        grad = torch.randn(4, 16)
        dist.all_reduce(grad)
        model.weight.data -= 0.01 * grad
    dist.destroy_process_group()
    return model.weight.detach()

def launch(i):
    kind = ["ok", "ok", "fail", "ok", "loader", "ok", "hang", "ok", "ok", "forkserver"][i % 10]
    if i % 50 == 49:
        kind = "spawn"
    method = kind if kind in ("forkserver", "spawn") else "auto"
    try:
        value = notebook_launcher(train, (kind,), num_processes=2, start_method=method,
                                  timeout=1.0 if kind == "hang" else 120, output="main")
    except WorkerError:
        return "failed" if kind == "fail" else "unexpected failure"
    except TimeoutError:
        return "timed out" if kind == "hang" else "unexpected timeout"
    if kind == "loader":
        return "ok" if value == sum(range(64)) else f"wrong {value}"
    return "ok" if tuple(value.shape) == (4, 16) else f"wrong {value!r}"
""".replace("TESTS_DIR", repr(str(TESTS)))


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        yield k


def test_a_hundred_launches_leave_the_kernel_as_they_found_it(kernel):
    outcomes = []
    for i in range(WARM_UP + LAUNCHES):
        if i == WARM_UP:
            before = kernel.value("snapshot()")
        out = kernel.run(f"outcome = launch({i})", timeout=180)
        assert out.error is None, f"launch {i}: {out.traceback_text}"
        outcomes.append(kernel.value("outcome"))
    after = kernel.value("snapshot()")
    expected = {"ok", "failed", "timed out"}
    assert set(outcomes) <= expected, [o for o in outcomes if o not in expected]
    for key in ("children", "fds", "threads", "os_threads", "shm"):
        new_fds = {
            fd: target for fd, target in after["fd_targets"].items()
            if before["fd_targets"].get(fd) != target
        }
        new_shm = sorted(set(after["shm_names"]) - set(before["shm_names"]))
        assert after[key] <= before[key], (
            f"{key} grew from {before[key]} to {after[key]}; new fds: {new_fds}; "
            f"new in /dev/shm: {new_shm}"
        )
    growth = after["rss"] - before["rss"]
    assert growth < RSS_GROWTH_LIMIT, f"kernel RSS grew by {growth / 2**20:.1f} MB"
    print(f"soak: {LAUNCHES} launches, kernel RSS {before['rss'] / 2**20:.1f} MB -> "
          f"{after['rss'] / 2**20:.1f} MB ({growth / 2**20:+.1f} MB), widget comms "
          f"{before['comms']} -> {after['comms']}")


def test_finished_widget_views_release_their_widgets(kernel):
    """An ended dashboard becomes static HTML and releases its comms, so the number of widget
    comms in the kernel stops growing."""
    for _ in range(2):
        kernel.run("launch(0)", timeout=180)
    plateau = kernel.value("snapshot()")["comms"]
    for _ in range(5):
        out = kernel.run("launch(0)", timeout=180)
        assert out.error is None, out.traceback_text
    after = kernel.value("snapshot()")["comms"]
    assert after <= plateau, f"widget comms grew from {plateau} to {after} over 5 launches"
