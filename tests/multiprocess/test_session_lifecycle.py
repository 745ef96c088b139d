"""Warm ranks: start methods, restarts (stuck or dead ranks), stop and replace; each test owns
its session (test_session.py shares one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

import nbtrain
from nbtrain import WorkerError
from nbtrain.kernel.warm import SessionError

pytestmark = pytest.mark.timeout(240)

QUIET = {"progress": "off", "output": "none"}

INIT = (
    "import torch, torch.distributed as dist\n"
    "if not dist.is_initialized(): dist.init_process_group('gloo')\n"
)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def rank_pids(handle) -> list[int]:
    return handle.pull("__import__('os').getpid()")


def all_reduce_plus(offset):
    import torch.distributed as dist

    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.item() + offset


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_every_start_method_keeps_state_across_commands(method):
    with nbtrain.start_ranks(2, start_method=method, **QUIET) as handle:
        assert handle.config.start.method.value == method
        values = handle.run_cell(INIT + "x = dist.get_rank() * 10\nx + 1")
        assert values == {0: {"text/plain": "1"}, 1: {"text/plain": "11"}}
        assert handle.pull("x") == [0, 10]
        assert handle.run(all_reduce_plus, 0.5) == 3.5  # the process group persists
    assert not handle.running


def test_ranks_stuck_in_a_collective_after_a_failure_are_restarted():
    with nbtrain.start_ranks(2, **QUIET) as handle:
        handle.run_cell(INIT + "state = 1")
        old = rank_pids(handle)
        cell = "if dist.get_rank() == 0:\n    raise RuntimeError('rank 0 broke')\ndist.barrier()"
        with pytest.raises(WorkerError, match="rank 0 failed with RuntimeError") as info:
            handle.run_cell(cell, filename="<stuck>")
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "restarted the 2 ranks" in notes and "state" in notes
        assert "rank 1 was in torch/distributed" in notes and "<stuck>:3 in <module>" in notes
        new = rank_pids(handle)
        assert set(new).isdisjoint(old)
        assert not any(psutil.pid_exists(pid) for pid in old)
        with pytest.raises(WorkerError, match="no name 'state'"):
            handle.pull("state")
        handle.run_cell(INIT)  # a new process group forms
        assert handle.run(all_reduce_plus, 0) == 3.0


def test_a_rank_that_dies_means_a_restart_never_a_missing_rank():
    with nbtrain.start_ranks(2, **QUIET) as handle:
        handle.run_cell(INIT)
        with pytest.raises(WorkerError) as info:
            handle.run_cell("import os\nif dist.get_rank() == 1:\n    os._exit(3)\ndist.barrier()")
        assert info.value.rank == 1 and info.value.exitcode == 3
        assert "restarted" in "\n".join(info.value.__notes__)
        assert len(set(rank_pids(handle))) == 2


def test_a_rank_killed_while_idle_is_noticed_before_the_next_command(capsys):
    with nbtrain.start_ranks(2, **QUIET) as handle:
        pid = rank_pids(handle)[1]
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        assert handle.pull("2 * 2") == [4, 4]
        assert "rank 1 (exit code -9) ended since the last command" in capsys.readouterr().err


def test_a_timeout_with_a_rank_stuck_in_c_restarts():
    with nbtrain.start_ranks(2, **QUIET) as handle:
        handle.run_cell(INIT)
        with pytest.raises(TimeoutError, match="restarted the 2 ranks"):
            handle.run_cell("if dist.get_rank() == 0:\n    dist.barrier()", timeout=1)
        assert handle.pull("1") == [1, 1]


def test_stop_leaves_no_process_and_a_second_start_says_what_to_do():
    before = children()
    handle = nbtrain.start_ranks(2, **QUIET)
    try:
        with pytest.raises(SessionError, match=r"already running.*ranks.stop\(\).*replace=True"):
            nbtrain.start_ranks(2, **QUIET)
        pids = rank_pids(handle)
        replacement = nbtrain.start_ranks(2, replace=True, **QUIET)
        assert not handle.running and not any(psutil.pid_exists(pid) for pid in pids)
        with pytest.raises(SessionError, match="were stopped"):
            handle.pull("1")
    finally:
        handle.stop()
    replacement.stop()
    replacement.stop()  # idempotent
    assert {p for p in children() - before if psutil.Process(p).name() != "python"} == set()


def test_ranks_end_when_the_interpreter_exits_without_stop():
    script = (
        "import nbtrain\n"
        "ranks = nbtrain.start_ranks(2, progress='off', output='none')\n"
        "print(ranks.pull('__import__(\"os\").getpid()'), flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    pids = eval(done.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_an_accelerator_made_in_a_later_cell_works_with_what_an_earlier_one_prepared():
    with nbtrain.start_ranks(2, **QUIET) as handle:
        handle.run_cell(
            "import torch\nfrom nbtrain import Accelerator\nacc = Accelerator()\n"
            "model, opt = acc.prepare(torch.nn.Linear(4, 1), "
            "torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1))"
        )
        handle.run_cell(
            "later = Accelerator()\nmodel.zero_grad()\n"
            "later.backward(model(torch.ones(2, 4) * (later.process_index + 1)).sum())\n"
            "grad = later.unwrap_model(model).weight.grad.clone()"
        )
        grads = handle.pull("grad")
        assert torch.equal(grads[0], grads[1])  # DDP averaged them: one process group
        assert handle.pull("(later.process_index, later.num_processes)") == [(0, 2), (1, 2)]


def test_an_interrupt_that_leaves_a_rank_stuck_in_c_restarts_and_says_where():
    with nbtrain.start_ranks(2, **QUIET) as handle:
        handle.run_cell(INIT)
        old = rank_pids(handle)
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt) as info:
            handle.run_cell("if dist.get_rank() == 0:\n    dist.barrier()", filename="<alone>")
        timer.join()
        text = str(info.value)
        assert "not every rank returned to idle" in text and "restarted the 2 ranks" in text
        assert "rank 0 was in" in text and "<alone>:2 in <module>" in text
        assert set(rank_pids(handle)).isdisjoint(old)
