"""Soak for warm ranks: 200 %%ranks cells in one real Jupyter kernel mixing successes,
exceptions, interrupts (the kernel's interrupt, as the stop button sends it), timeouts and a
killed rank, with pull/push between them.

State is asserted wherever the contract keeps it: a counter every successful cell increments
on every rank survives exceptions, interrupts and timeouts, and is gone (with a note saying so)
after a rank was killed. Measured in the kernel after a warm-up and at the end: live child
processes, open file descriptors, threads, /dev/shm entries (no growth allowed), the kernel's
resident memory (growth within 30 MB).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kernelutil import Kernel, running_kernel

pytestmark = [pytest.mark.soak, pytest.mark.timeout(900)]

CELLS = 200
WARM_UP = 20
CYCLE = 20
KILL_AT = (97, 177)  # cells where rank 1 kills itself: the ranks restart
RSS_GROWTH_LIMIT = 30 << 20

TESTS = Path(__file__).resolve().parent.parent

SETUP = """
import gc, os, sys, threading, time, psutil
import nbtrain
sys.path.insert(0, TESTS_DIR)  # procguard
from procguard import ProcessWatch

me = psutil.Process()
processes = ProcessWatch()
ranks = nbtrain.start_ranks(2)

def snapshot():
    gc.collect()
    samples = []
    for _ in range(5):
        samples.append({"children": len(processes.alive()),
                        "fds": len(os.listdir("/proc/self/fd")),
                        "threads": threading.active_count(), "os_threads": me.num_threads(),
                        "shm": len(os.listdir("/dev/shm"))})
        time.sleep(0.1)
    least = {key: min(sample[key] for sample in samples) for key in samples[0]}
    return {**least, "rss": me.memory_info().rss}
""".replace("TESTS_DIR", repr(str(TESTS)))

RANK_SETUP = """%%ranks
import os, time, torch, torch.distributed as dist
if not dist.is_initialized():
    dist.init_process_group("gloo")
n = 0
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with running_kernel(tmp_path_factory.mktemp("kernelspec"), SETUP) as k:
        out = k.run(RANK_SETUP)
        assert out.error is None, out.traceback_text
        yield k


def interrupt(kernel: Kernel) -> dict | None:
    msg_id = kernel.start("%%ranks\nprint('looping', flush=True)\nwhile True: time.sleep(0.01)")
    kernel.collect(msg_id, timeout=60, until="looping")
    time.sleep(0.2)
    kernel.manager.interrupt_kernel()
    return kernel.collect(msg_id, timeout=60).error


def one_cell(kernel: Kernel, i: int) -> str:
    """Run cell ``i`` of the mix; returns whether the ranks' state must be kept or was reset."""
    if i in KILL_AT:
        out = kernel.run("%%ranks 1\nos.kill(os.getpid(), 9)")
        assert out.error is not None and out.error["ename"] == "WorkerError", i
        assert "SIGKILL" in out.error["evalue"]
        assert "state" in "\n".join(out.error.get("traceback", []))  # the restart note
        setup = kernel.run(RANK_SETUP)
        assert setup.error is None, setup.traceback_text
        return "reset"
    kind = i % CYCLE
    if kind in (3, 13):
        out = kernel.run("%%ranks\nif dist.get_rank() == 1:\n    raise ValueError('planned')")
        assert out.error is not None and out.error["ename"] == "WorkerError", i
    elif kind == 7:
        error = interrupt(kernel)
        assert error is not None and error["ename"] == "KeyboardInterrupt", (i, error)
        assert "state is kept" in error["evalue"]
    elif kind == 11:
        out = kernel.run("%%ranks --timeout 0.5\ntime.sleep(30)")
        assert out.error is not None and out.error["ename"] == "TimeoutError", i
        assert "state kept" in out.error["evalue"]
    elif kind == 17:
        out = kernel.run("ranks.push(extra=torch.zeros(1 << 19))")  # 2 MiB: a shm segment
        assert out.error is None, out.traceback_text
    else:
        out = kernel.run("%%ranks\nt = torch.ones(1); dist.all_reduce(t); n += 1\nn")
        assert out.error is None, f"cell {i}: {out.traceback_text}"
        return "counted"
    return "kept"


def test_two_hundred_cells_keep_state_and_leave_nothing_behind(kernel):
    kernel.run("import torch")
    expected = 0
    before = None
    for i in range(WARM_UP + CELLS):
        if i == WARM_UP:
            before = kernel.value("snapshot()")
        verdict = one_cell(kernel, i)
        if verdict == "counted":
            expected += 1
        elif verdict == "reset":
            expected = 0
        if i % CYCLE == CYCLE - 1 or verdict == "reset":
            assert kernel.value("ranks.pull('n')") == [expected, expected], f"after cell {i}"
    after = kernel.value("snapshot()")
    assert before is not None
    for key in ("children", "fds", "threads", "os_threads", "shm"):
        assert after[key] <= before[key], f"{key} grew from {before[key]} to {after[key]}"
    growth = after["rss"] - before["rss"]
    assert growth < RSS_GROWTH_LIMIT, f"kernel RSS grew by {growth / 2**20:.1f} MB"
    # stop() ends the ranks for good (the ranks a restart made are new to the leak guards).
    stopped = kernel.run("ranks.stop(); print(len(processes.alive()))")
    assert stopped.error is None and stopped.stdout.strip() == "0", stopped.stdout
    print(f"warm soak: {CELLS} cells, kernel RSS {before['rss'] / 2**20:.1f} MB -> "
          f"{after['rss'] / 2**20:.1f} MB ({growth / 2**20:+.1f} MB)")
