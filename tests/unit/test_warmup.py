"""The warm-up (nbtrain/kernel/procs/warmup.py): steps in a thread of its own, only between cells,
after the cell that started it; a cell waits for one step at most; it never breaks a launch.
(In a real kernel: tests/kernel/test_warmup_kernel.py.)"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import threading
import time

import pytest

from nbtrain.kernel.procs import forkserver, warmup


class Shell:
    """IPython's events, as the warm-up registers on them; ``cell()`` runs one cell."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list] = {}
        self.events = self

    def register(self, name: str, callback) -> None:
        self.callbacks.setdefault(name, []).append(callback)

    def trigger(self, name: str) -> None:
        for callback in self.callbacks.get(name, []):
            callback()

    def cell(self, body) -> None:
        self.trigger("pre_execute")
        self.trigger("pre_run_cell")
        body()
        self.trigger("post_execute")


@pytest.fixture
def fresh(monkeypatch):
    """The module as no warm-up had started in this process; returns the record of steps."""
    monkeypatch.setattr(warmup, "_started", False)
    monkeypatch.setattr(warmup, "_cell_runs", False)
    monkeypatch.setattr(warmup, "_current", None)
    monkeypatch.setattr(warmup, "_steps", collections.deque())
    done: list[str] = []
    monkeypatch.setattr(warmup, "steps", lambda: ["a", "b", "c"])
    return done


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_steps_run_between_cells_and_a_cell_waits_for_one_step_at_most(fresh, monkeypatch):
    shell = Shell()
    monkeypatch.setattr(warmup, "_shell", lambda: shell)
    in_a = threading.Event()
    release_a = threading.Event()

    def do(step: str) -> None:
        fresh.append(step)
        if step == "a":  # a long step: a cell arrives meanwhile
            in_a.set()
            release_a.wait(10)

    monkeypatch.setattr(warmup, "_do", do)
    shown: list[str] = []
    monkeypatch.setattr(warmup, "_show", lambda handle, began: shown.append("line") or "h")
    monkeypatch.setattr(warmup, "_hide", lambda handle: shown.append("gone"))

    async def import_cell() -> None:
        assert warmup.start() is True
        assert warmup.start() is True  # once per process
        time.sleep(0.2)
        fresh.append("rest of the cell")  # no step inside the cell that started it

    shell.trigger("pre_execute")
    asyncio.run(import_cell())
    shell.trigger("post_execute")
    in_a.wait(10)
    threading.Timer(0.8, release_a.set).start()  # the cell below waits for it, and says so
    shell.cell(lambda: fresh.append("next cell"))
    assert fresh == ["rest of the cell", "a", "next cell"]
    assert shown[0] == "line" and shown[-1] == "gone"
    wait_until(lambda: not warmup.running())
    assert fresh == ["rest of the cell", "a", "next cell", "b", "c"]


def test_a_quick_step_is_awaited_without_a_word(fresh, monkeypatch):
    shell = Shell()
    monkeypatch.setattr(warmup, "_shell", lambda: shell)
    monkeypatch.setattr(warmup, "_do", lambda step: time.sleep(0.05))
    monkeypatch.setattr(warmup, "_show", lambda handle, began: pytest.fail("said"))

    async def import_cell() -> None:
        warmup.start()

    shell.trigger("pre_execute")
    asyncio.run(import_cell())
    shell.trigger("post_execute")
    while warmup.running():
        shell.cell(lambda: None)


def test_no_event_loop_no_shell_or_another_thread_starts_nothing(fresh, monkeypatch):
    monkeypatch.setattr(warmup, "_do", fresh.append)
    assert warmup.start() is False  # a script: no running loop in this thread
    answers: list[bool] = []

    async def in_a_thread() -> None:
        answers.append(warmup.start())

    async def without_ipython() -> None:
        answers.append(warmup.start())

    thread = threading.Thread(target=asyncio.run, args=(in_a_thread(),))
    thread.start()
    thread.join()
    asyncio.run(without_ipython())  # (this test process has no IPython shell)
    assert answers == [False, False] and not warmup.running() and fresh == []


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


def test_a_fork_launch_imports_torch_dynamo_in_the_kernel_even_before_the_warm_up(
    fresh, monkeypatch
):
    # "Run All": leaving it to the ranks made every launch's ranks import it again
    # (benchmarks/runall.py: 18.2 s against 11.1 s for two launches); the row says so.
    from nbtrain.kernel.procs import processes
    from nbtrain.shared.frontend import Frontend
    from nbtrain.shared.options import StartMethod

    warmup._steps.extend(["nbtrain.kernel.entry", "torch._dynamo"])
    assert "torch._dynamo" in processes.fork_imports(2)
    assert "nbtrain.rank.worker" in processes.fork_imports(2)  # (the fork's target)
    # in a Jupyter kernel (a script's words are tests/cli/test_cli_words.py's)
    monkeypatch.setattr(processes, "frontend", lambda: Frontend.JUPYTER)
    monkeypatch.setattr(processes, "fork_imports", lambda count: ["torch", "nbtrain_no_such"])
    assert processes.starting_phase(StartMethod.FORK, 2) == (
        "importing torch in the kernel (first launch only)"
    )
    monkeypatch.setattr(processes, "fork_imports", lambda count: ["torch", "torch._dynamo"])
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    assert processes.starting_phase(StartMethod.FORK, 2) == (
        "importing torch._dynamo in the kernel (first launch only)"
    )
