"""Warm ranks (nbtrain.start_ranks): real gloo rank processes that live across commands."""

from __future__ import annotations

import os
import signal
import threading
import threading as _threading
import time

import psutil
import pytest
import torch

import nbtrain
from nbtrain import WorkerError

pytestmark = pytest.mark.timeout(240)

QUIET = {"progress": "off", "output": "none"}

INIT = (
    "import torch, torch.distributed as dist\n"
    "if not dist.is_initialized(): dist.init_process_group('gloo')\n"
)


@pytest.fixture(scope="module")
def ranks():
    """One warm session for the tests that keep its state (no restarts)."""
    handle = nbtrain.start_ranks(2, **QUIET)
    handle.run_cell(INIT)
    yield handle
    handle.stop()


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def rank_pids(handle) -> list[int]:
    return handle.pull("__import__('os').getpid()")


def all_reduce_plus(offset):
    import torch.distributed as dist

    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.item() + offset


def test_state_process_group_and_values_persist(ranks):
    pids = rank_pids(ranks)
    ranks.run_cell(
        "w = torch.nn.Linear(2, 1)\ntorch.nn.init.constant_(w.weight, float(dist.get_rank()))"
    )
    ranks.run_cell("t = w.weight.detach().sum().reshape(1).clone(); dist.all_reduce(t)")
    assert [v.item() for v in ranks.pull("t")] == [2.0, 2.0]
    weights = ranks.pull("w.weight")
    assert [w.tolist() for w in weights] == [[[0.0, 0.0]], [[1.0, 1.0]]]
    # rank 0's value only by default, as notebook_launcher; the ranks did not change
    assert ranks.run(all_reduce_plus, 1) == 4.0
    assert rank_pids(ranks) == pids


def test_functions_and_classes_defined_in_a_cell_come_back(ranks):
    ranks.run_cell(
        "class Point:\n    def __init__(self, x): self.x = x\n"
        "def double(v): return 2 * v\np = Point(dist.get_rank())"
    )
    points = ranks.pull("p")
    assert [type(p).__name__ for p in points] == ["Point", "Point"]
    assert [p.x for p in points] == [0, 1]
    assert ranks.pull("double")[1](21) == 42


def test_run_sees_the_ranks_names_over_the_kernels(ranks):
    ranks.run_cell("scale = 3 + dist.get_rank()")
    notebook = {"__name__": "__main__"}  # what a notebook cell defines
    exec("scale = -1\ndef scaled(v):\n    return v * scale\n", notebook)
    scaled = notebook["scaled"]
    assert scaled(1) == -1  # the kernel's own name loses to the rank's
    assert ranks.run(scaled, 2) == 6


def test_push_sets_names_on_every_rank_through_shared_memory(ranks):
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB: travels through a segment
    ranks.push(big=big, lr=0.5)
    assert ranks.pull("float(big.sum()) * lr") == [float(big.sum()) * 0.5] * 2
    mine = f"nbtrain_{os.getpid()}_"
    leftover = [name for name in os.listdir("/dev/shm") if name.startswith(mine)]
    assert leftover == []


def test_pull_brings_big_tensors_through_shared_memory_and_leaves_none(ranks, monkeypatch):
    from nbtrain.shared import serialization

    received: list[int] = []  # bytes of each value's pickle, as it came through the pipe
    loads = serialization.sharedmem.loads
    monkeypatch.setattr(
        serialization.sharedmem, "loads",
        lambda data, **kw: received.append(len(data)) or loads(data, **kw),
    )
    ranks.run_cell("big_out = torch.full((1 << 21,), float(dist.get_rank()))")  # 8 MiB each
    values = ranks.pull("big_out")
    assert len(received) == 2 and max(received) < 4096  # the 8 MiB went through a segment
    assert [float(v[0]) for v in values] == [0.0, 1.0] and values[1].numel() == 1 << 21
    mine = f"nbtrain_{os.getpid()}_"
    assert [name for name in os.listdir("/dev/shm") if name.startswith(mine)] == []


def test_a_failure_on_one_rank_keeps_every_ranks_state(ranks):
    pids = rank_pids(ranks)
    ranks.run_cell("kept = dist.get_rank() + 100")
    cell = "y = 1\nif dist.get_rank() == 1:\n    raise ValueError('bad batch')\ny = 2"
    with pytest.raises(WorkerError) as info:
        ranks.run_cell(cell, filename="<my cell>")
    assert info.value.rank == 1 and info.value.type_name == "ValueError"
    assert '"<my cell>", line 3' in info.value.remote_traceback
    assert "raise ValueError('bad batch')" in info.value.remote_traceback  # the cell's own line
    assert "nbtrain/rank" not in info.value.remote_traceback
    assert ranks.pull("kept") == [100, 101]
    assert ranks.pull("y") == [2, 1]
    assert rank_pids(ranks) == pids


def test_bad_input_is_refused_and_the_ranks_stay_warm(ranks):
    pids = rank_pids(ranks)
    with pytest.raises(WorkerError, match=r"rank 0 has no name 'nope'.*push\(nope=") as info:
        ranks.pull("nope")
    assert info.value.type_name == "NameError"
    with pytest.raises(SyntaxError, match="not a Python expression"):
        ranks.pull("a = 1")
    with pytest.raises(TypeError, match="as a string"):
        ranks.pull(3)
    with pytest.raises(nbtrain.shared.serialization.PayloadError, match="lock"):
        ranks.push(lock=_threading.Lock())
    with pytest.raises(ValueError, match="not a Python name"):
        ranks.push(**{"not a name": 1})
    with pytest.raises(SyntaxError):
        ranks.run_cell("def broken(:\n")
    assert rank_pids(ranks) == pids


def test_ctrl_c_interrupts_every_rank_and_keeps_state(ranks):
    pids = rank_pids(ranks)
    ranks.run_cell("before = 'kept'")
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="state is kept"):
        ranks.run_cell("import time\nwhile True: time.sleep(0.01)")
    timer.join()
    assert time.monotonic() - started < 20
    assert ranks.pull("before") == ["kept", "kept"]
    assert rank_pids(ranks) == pids


def test_a_timeout_interrupts_the_cell_and_keeps_state(ranks):
    pids = rank_pids(ranks)
    with pytest.raises(TimeoutError, match=r"timeout=1s expired.*state kept"):
        ranks.run_cell("import time\ntime.sleep(60)", timeout=1)
    assert ranks.pull("1 + 1") == [2, 2]
    assert rank_pids(ranks) == pids


def test_where_between_cells_says_every_rank_is_idle_and_leaves_them_warm(ranks):
    pids = rank_pids(ranks)
    where = ranks.where()
    assert sorted(where.ranks) == [0, 1]
    assert str(where).splitlines() == [f"rank {r}: idle (between cells)" for r in (0, 1)]
    assert where.waits_for == []
    assert ranks.run(all_reduce_plus, 0) == 3.0  # the pipes carry on: the dumps went nowhere
    assert rank_pids(ranks) == pids


def test_one_shot_launches_work_alongside_warm_ranks(ranks):
    assert nbtrain.notebook_launcher(all_reduce_sum_fresh, num_processes=2, **QUIET) == 3.0
    assert ranks.run(all_reduce_plus, 0) == 3.0


def all_reduce_sum_fresh():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()
