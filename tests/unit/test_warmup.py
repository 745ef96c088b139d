"""The warm-up (nbtrain/kernel/procs/warmup.py): steps in the kernel's main thread, one per turn of
its event loop, after the cell that started it; it never breaks a launch. (In a real kernel:
tests/kernel/test_warmup_kernel.py.)"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import threading

import pytest

from nbtrain.kernel.procs import forkserver, warmup


@pytest.fixture
def fresh(monkeypatch):
    """The module as no warm-up had started in this process; returns the record of steps."""
    monkeypatch.setattr(warmup, "_started", False)
    monkeypatch.setattr(warmup, "_loop", None)
    monkeypatch.setattr(warmup, "_steps", collections.deque())
    done: list[str] = []
    monkeypatch.setattr(warmup, "steps", lambda: ["a", "b", "c"])
    return done


def test_steps_come_after_the_cell_and_let_a_cell_sent_meanwhile_run_first(fresh, monkeypatch):
    def do(step: str) -> None:
        fresh.append(step)
        if step == "a":  # a cell arrives while step a runs: it must not wait for b and c
            asyncio.get_running_loop().call_soon(fresh.append, "next cell")

    monkeypatch.setattr(warmup, "_do", do)

    async def kernel() -> None:
        assert warmup.start() is True
        assert warmup.start() is True  # once per process
        fresh.append("rest of the cell")
        while warmup.running():
            await asyncio.sleep(0.01)

    asyncio.run(kernel())
    assert fresh == ["rest of the cell", "a", "next cell", "b", "c"]


def test_no_event_loop_or_another_thread_starts_nothing(fresh, monkeypatch):
    monkeypatch.setattr(warmup, "_do", fresh.append)
    assert warmup.start() is False  # a script: no running loop in this thread
    answers: list[bool] = []

    async def in_a_thread() -> None:
        answers.append(warmup.start())

    thread = threading.Thread(target=asyncio.run, args=(in_a_thread(),))
    thread.start()
    thread.join()
    assert answers == [False] and not warmup.running() and fresh == []


def test_ctrl_c_in_a_step_ends_the_warm_up_without_breaking_the_loop(fresh, monkeypatch):
    def do(step: str) -> None:
        fresh.append(step)
        if step == "b":
            raise KeyboardInterrupt

    monkeypatch.setattr(warmup, "_do", do)

    async def kernel() -> str:
        warmup.start()
        while warmup.running():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        return "loop still runs"

    assert asyncio.run(kernel()) == "loop still runs"
    assert fresh == ["a", "b"]


def test_finish_does_the_rest_now(fresh, monkeypatch):
    monkeypatch.setattr(warmup, "_do", fresh.append)
    warmup._steps.extend(["b", "c"])
    warmup.finish()
    assert fresh == ["b", "c"] and not warmup.running()


def test_a_failing_step_is_dropped_and_leaves_the_launch_its_work(monkeypatch):
    def broken(**_: object) -> None:
        raise OSError("no forkserver here")

    monkeypatch.setattr(forkserver, "start", broken)
    for step in ["nbtrain.no_such_module", warmup._FORKSERVER, "json"]:
        warmup._do(step)  # raises nothing: the launch starts the forkserver and imports itself


def test_the_steps_import_torch_first_and_torch_dynamo_last():
    steps = warmup.steps()
    assert steps[0] == "torch" and steps[-1] == "torch._dynamo"
    assert set(forkserver.PRELOAD) <= set(steps) and set(warmup.KERNEL_IMPORTS) <= set(steps)


def test_the_forkservers_preload_is_deaf_to_ctrl_c_and_gives_it_back(tmp_path):
    # A module of the preload that gets Ctrl-C in the middle of its import (as a cold
    # forkserver did from a press in the kernel): the import completes, and the forkserver's
    # handler is back afterwards, for the ranks it makes.
    (tmp_path / "pressed.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.1)\n"
        "COMPLETE = True\n"
    )
    code = (
        f"import sys, signal; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import nbtrain.shared.preload as preload; preload.PRELOAD[:] = ['pressed']\n"
        "import nbtrain.rank.forkserver_preload, pressed\n"
        "print(pressed.COMPLETE, signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_a_fork_launch_leaves_torch_dynamo_to_its_ranks_only_while_the_warm_up_has_it_to_come(
    fresh, monkeypatch
):
    from nbtrain.kernel.host import environment
    from nbtrain.kernel.procs import processes

    monkeypatch.setattr(environment, "cpu_count", lambda: 2)
    assert "torch._dynamo" in processes.fork_imports(2)  # no warm-up: the kernel imports it
    warmup._steps.extend(["nbtrain.kernel.entry", "torch._dynamo"])
    assert "torch._dynamo" not in processes.fork_imports(2)  # "Run All": the ranks may
    assert "torch._dynamo" in processes.fork_imports(3)  # more ranks than cores: once, here
    assert "nbtrain.rank.worker" in processes.fork_imports(2)  # (the fork's target)
